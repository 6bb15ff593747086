"""The per-warp verify kernel (Gluon): one program per (row, head), each of its 4 warps owning 16 head-dim rows.

The TMA kernel's products are warpgroup products (``tl.dot`` with 4 warps on Hopper): their operands pass through
shared memory in the product's layout and a flush row's fold re-reads its checkpoint from L2 chunk by chunk, since
Triton exposes no column slice of the copied tile. Here the layouts are explicit: the checkpoint tile arrives by
TMA as ``P x 32`` column chunks (:data:`CHUNK_N`) in shared memory, and every product is an ``mma.sync`` of one
warp's own 16 rows (:func:`triton.experimental.gluon.language.nvidia.ampere.mma_v2`), so

* the readout ``S0 Cᵀ`` reads each warp's rows straight from the copied chunks;
* a flush row's fold ``e^{AΛ_h} S0 + (X_h w)ᵀ B_h`` takes each chunk of ``S0`` from shared memory as its
  accumulator and stores the new checkpoint from the product's registers: no L2 re-read, no layout change
  across warps;
* the only exchange between warps is the small ``(BLOCK_K, BLOCK_S)`` factor matrix and the sequence's B, C and x
  rows;
* each route is its own build: a non-flush row's sequence is at most W rows (``FOLD_K`` = pow2(W)), a flush row's
  ``BLOCK_K`` = 32, of which its fold takes the first ``FOLD_K``.

``KW`` > 0 builds the fused layer (:mod:`~ssmstate.ops.triton.conv_verify`): the program computes the conv outputs
it reads (its head's x channels, its group's B and C) on a compact ``(BLOCK_S, channels)`` tile of the row's
tokens, and its sequence tile holds the history in rows ``0 .. FOLD_K - 1`` and the window's rows from the fixed
row ``FOLD_K`` (zero rows between carry dt = 0, so the scan is unchanged), ``2 FOLD_K`` rows for both routes. It
stores its head's x channels' new conv window; the last of a row's group to arrive at the page's counter stores
the group's B and C window (the fused layer's protocol, :mod:`~ssmstate.ops.triton.conv_verify_kernel`).

Same math and rounding as the TMA kernel (:mod:`~ssmstate.ops.triton.verify_tma`): tf32 readout and sequence
products, an exact 16-bit Gram, a 2 x tf32 fold (the x side split, B exact in tf32). GPU only (Gluon kernels do
not run in the interpreter), for fp32 checkpoints with P = 64, 16-bit x, B and C and a ring of at most 32 rows
(:func:`warp_supported`; the fused layer's conv window and inputs: :func:`warp_conv_supported`). The launch choice
takes it on a card under ``lean_gbps_per_sm`` (the H100) for every such verify but a programmatic dependent's
(``launch_table.json``, shape ``warp``); ``override(shape="warp")`` anywhere, and for the fused layer (which the
table keeps on the TMA kernel: measured slower, ``fused.tma_why``).
"""

from __future__ import annotations

import torch
import triton

try:  # Gluon (Triton >= 3.6 for the API used here); without it the TMA kernel serves every launch
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # the TMA copy into shared memory: Triton 3.6's name, renamed since
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    # a barrier of the program's threads: Triton 3.6's name, renamed since
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAVE_GLUON = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 6)
except ImportError:  # pragma: no cover - depends on the Triton build
    HAVE_GLUON = False

#: head-dim rows per warp (the m16n8 products' rows) and warps per program
WARP_ROWS = 16
NUM_WARPS = 4
#: checkpoint columns per TMA chunk: 128 bytes of fp32, the widest row a 128-byte-swizzled copy takes
CHUNK_N = 32
#: the window's tile (tokens per row, T <= 8); the fused layer's sequence tile holds the history in its first
#: FOLD_K = pow2(W) >= 16 rows and the window's conv outputs in the BLOCK_S rows after them (2 FOLD_K rows in all)
BLOCK_S = 8


def warp_supported(checkpoint: torch.Tensor, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, R: int,
                   T: int) -> bool:
    """The per-warp kernel takes this call's tensors: a contiguous fp32 checkpoint (pages, H, 64, N) with N a
    multiple of 32 up to 256, 16-bit x, B and C with B and C of one dtype, a ring of at most 32 rows, windows of at
    most 8 tokens. The launch also checks the GPU (compute capability 9.0+: TMA copies and mbarriers,
    ``DeviceClass.hopper``) and the rows' 16-byte alignment (:func:`~ssmstate.ops.triton.common.rows_aligned`),
    once per call."""
    _, _, P, N = checkpoint.shape
    return (HAVE_GLUON and checkpoint.dtype == torch.float32 and P == WARP_ROWS * NUM_WARPS
            and N % CHUNK_N == 0 and N <= 256 and checkpoint.is_contiguous() and checkpoint.data_ptr() % 16 == 0
            and x.dtype in (torch.bfloat16, torch.float16) and B.dtype == C.dtype
            and B.dtype in (torch.bfloat16, torch.float16) and R <= 32 and T <= 8)


def warp_conv_supported(conv_window: torch.Tensor, xBC: torch.Tensor) -> bool:
    """The per-warp kernel computes the fused layer's conv from this window and these inputs: both channels-
    contiguous (a column or a token is one run of channels), one dtype (a sequence column is read from either)."""
    return conv_window.stride(1) == 1 and xBC.stride(1) == 1 and conv_window.dtype == xBC.dtype


def warp_descriptor(checkpoint: torch.Tensor) -> "TensorDescriptor":
    """The checkpoint as (pages * H * P, N) for the kernel's ``P x CHUNK_N`` TMA copies."""
    pages, H, P, N = checkpoint.shape
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    return TensorDescriptor.from_tensor(checkpoint.view(pages * H * P, N), [P, CHUNK_N], layout)


if HAVE_GLUON:

    @gluon.jit
    def _add(a, b):
        return a + b

    @gluon.jit
    def _decay(A, lam):
        """``e^{A lam}``, clamped at 1, as the TMA kernel's."""
        return gl.exp(gl.minimum(A * lam, 0.0))

    @gluon.jit
    def _softplus(v):
        return gl.where(v > 20.0, v, gl.where(v < -15.0, gl.exp(v), gl.log(1.0 + gl.exp(v))))

    @gluon.jit
    def _pdl_wait():
        """As :func:`ssmstate.ops.triton.common.pdl_wait`: wait for the kernel before, then let the next launch."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _wrap(i, R):
        """``i % R`` for ``0 <= i < 3R`` (ring rows), as :func:`ssmstate.ops.triton.common.wrap`."""
        i = gl.where(i >= R, i - R, i)
        return gl.where(i >= R, i - R, i)

    @gluon.jit
    def _seq(kk, c, q, rs, lo, R):
        """Sequence position ``kk``'s masks, ring row and token (history rows, then the window)."""
        is_hist = kk < c
        is_new = (kk >= c) & (kk < c + q)
        tok = lo + gl.maximum(kk - c, 0)
        return is_hist, is_new, kk < c + q, _wrap(rs + kk, R), tok

    @gluon.jit
    def _seq_slot(kk, c, q, rs, lo, R, NEW0: gl.constexpr):
        """As :func:`_seq` for the fused layer's sequence tile: the history's ``c`` rows from row 0, the window's
        ``q`` rows from the fixed row ``NEW0``, zero rows between and after."""
        is_hist = kk < c
        s = gl.maximum(kk - NEW0, 0)
        is_new = (kk >= NEW0) & (s < q)
        return is_hist, is_new, is_hist | is_new, _wrap(rs + gl.where(is_hist, kk, c + s), R), lo + s

    @gluon.jit
    def _column(m, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, KW: gl.constexpr):
        """Conv sequence column ``m``'s pointer (channel 0): the page's window column ``end - KW + m`` for
        ``m < KW``, else the row's token ``m - KW`` of ``xBC`` (the window and the tokens share a dtype)."""
        # 16-byte aligned columns (the launch checks Step.aligned): stated, as the pick hides it
        return gl.multiple_of(gl.where(m < KW, win_pg + (end - KW + m) * s_win_c, xbc_ptr + (lo + m - KW) * s_xbc_t),
                              16)

    @gluon.jit
    def _conv(t, q, ch, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, w_ptr, s_w_d, s_w_k, b_ptr, silu,
              KW: gl.constexpr):
        """The conv outputs of channels ``ch`` for the row's tokens ``t`` (0 past ``q``): ``act(bias + Σ_j w_j
        col(t + j))`` in fp32, summed in the conv update's order, rounded to ``xBC``'s dtype as the unfused pair
        stores them. Every tap's tile, weight row and the bias are loaded before the math."""
        live = (t < q)[:, None]
        taps = ()
        wts = ()
        for j in gl.static_range(KW + 1):
            col = _column(t + j, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, KW)
            taps = taps + (gl.load(col[:, None] + ch[None, :], mask=live, other=0.0),)
            wts = wts + (gl.load(w_ptr + ch * s_w_d + j * s_w_k),)
        y = gl.zeros_like(taps[0]).to(gl.float32)
        if b_ptr is not None:
            y += gl.load(b_ptr + ch).to(gl.float32)[None, :]
        for j in gl.static_range(KW + 1):
            y += wts[j].to(gl.float32)[None, :] * taps[j].to(gl.float32)
        if silu:
            y = y / (1.0 + gl.exp(-y))
        return gl.where(live, y, 0.0).to(xbc_ptr.dtype.element_ty)

    @gluon.jit
    def _window_update(lL, ch, q, win_pg, end, width, s_win_c, xbc_ptr, lo, s_xbc_t, KW: gl.constexpr):
        """Channels ``ch``'s new conv window: the last ``KW + q`` sequence columns (``lL``: their indices), right-
        aligned, as the conv update stores it. All are loaded, then a barrier (other threads of the program read
        these channels' old columns, and the window is updated in place), then stored."""
        keep = lL < KW + q
        seq = gl.load(_column(lL, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, KW)[:, None] + ch[None, :],
                      mask=keep[:, None], other=0.0)
        _cta_barrier()
        dst = width - (KW + q) + lL
        gl.store(win_pg + dst[:, None] * s_win_c + ch[None, :], seq, mask=(keep & (dst >= 0))[:, None])

    @gluon.jit
    def _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr,
             out_ptr, page, h, q, lo, c, rs, R,
             s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg, s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
             s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t, s_z_h, s_o_t, s_o_h,
             ck_row0, cv, FLUSH: gl.constexpr, P: gl.constexpr, N: gl.constexpr, HPG: gl.constexpr,
             BLOCK_K: gl.constexpr, FOLD_K: gl.constexpr, BLOCK_S: gl.constexpr, NC: gl.constexpr,
             DT_SOFTPLUS: gl.constexpr, GDC: gl.constexpr, KW: gl.constexpr, BLOCK_L: gl.constexpr):
        """One (row, head) once its cursors are known; ``FLUSH``: the row's route (each route its own build).
        ``KW`` > 0: the fused layer (``cv``: the row's conv operands, :func:`verify_warp_kernel`)."""
        NCH: gl.constexpr = N // NC
        # the sequence tile: a non-flush row's is at most W rows (c + q <= W), so its build takes FOLD_K = pow2(W)
        # of them; the fused layer's holds the history in rows 0 .. FOLD_K - 1 and the window's conv outputs from
        # row FOLD_K (a fixed slot: the conv computes them on a compact tile of the row's tokens), 2 * FOLD_K rows
        if KW > 0:
            BK: gl.constexpr = 2 * FOLD_K
        elif FLUSH:
            BK: gl.constexpr = BLOCK_K
        else:
            BK: gl.constexpr = FOLD_K
        HAS_D: gl.constexpr = D_ptr is not None
        HAS_DTB: gl.constexpr = dtb_ptr is not None
        HAS_Z: gl.constexpr = z_ptr is not None
        # the products: every warp its own 16 rows of the head dim (warps [4, 1]); the Gram (sequence x window)
        # over a 2 x 2 warp grid
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
        DA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
        DB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=1)
        MMG: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 2], instr_shape=[16, 8])
        GA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMG, k_width=2)
        GB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMG, k_width=2)
        # Λ: scans in a plain 1-D layout (a slice of the product's layout takes none)
        SCAN: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        # the checkpoint tile: NCH column chunks, one TMA copy each, one barrier for all
        tile = gl.allocate_shared_memory(gl.float32, [NCH, P, NC], desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, NCH * P * NC * 4)
        for j in gl.static_range(NCH):
            _tma_load(desc, [ck_row0, j * NC], bar, tile.index(j))
        if GDC:  # a programmatic dependent: the step's inputs only once the kernel before has ended
            _pdl_wait()
        g = h // HPG
        Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
        xr_h = xr_ptr + page * s_xr_pg + h * s_xr_h
        dtr_h = dtr_ptr + page * s_dtr_pg + h * s_dtr_h
        if KW > 0:
            NEW0: gl.constexpr = FOLD_K
            (xbc_ptr, s_xbc_t, win_pg, s_win_c, end, width, cw_ptr, s_cw_d, s_cw_k, cb_ptr, silu, cnt_pg, XB,
             GN) = cv
        else:
            NEW0 = c
        # --- the gathers, all issued while the tile is in flight ---
        # B over the sequence (BK, N) and C over the window (BLOCK_S, N), 16-bit, in 16-byte vectors; both go
        # to shared memory, where the Gram, the readout and the fold take them in their products' layouts
        ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        if KW > 0:
            # the history's rows from the rings; the window's rows and C are the conv's outputs of xBC's channels
            # (x: the head's, B and C: the group's), computed on a (BLOCK_S, channels) tile of the row's tokens
            kR = gl.arange(0, FOLD_K, gl.SliceLayout(1, ROWS))
            hR = kR < c
            rR = _wrap(rs + kR, R)
            nN = gl.arange(0, N, gl.SliceLayout(0, ROWS))
            pN = gl.arange(0, P, gl.SliceLayout(0, ROWS))
            Bs = gl.load(Br_base + rR[:, None] * s_Br_r + nN[None, :], mask=hR[:, None], other=0.0)
            Xs = gl.load(xr_h + rR[:, None] * s_xr_r + pN[None, :], mask=hR[:, None], other=0.0)
            CV: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [1, 4], [1, 0])
            tC = gl.arange(0, BLOCK_S, gl.SliceLayout(1, CV))
            nC = gl.arange(0, N, gl.SliceLayout(0, CV))
            pC = gl.arange(0, P, gl.SliceLayout(0, CV))
            chB = XB + g * N + nC
            chX = h * P + pC
            Bn = _conv(tC, q, chB, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                       silu, KW)
            Cs = _conv(tC, q, chB + GN, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                       silu, KW)
            Xn = _conv(tC, q, chX, win_pg, end, s_win_c, xbc_ptr, lo, s_xbc_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                       silu, KW)
        else:
            kR = gl.arange(0, BK, gl.SliceLayout(1, ROWS))
            hR, nR, sqR, rR, tR = _seq(kR, c, q, rs, lo, R)
            nN = gl.arange(0, N, gl.SliceLayout(0, ROWS))
            # 16-byte aligned rows (the launch checks Step.aligned): stated, as the pick hides it
            b_rows = gl.multiple_of(gl.where(hR, Br_base + rR * s_Br_r, B_ptr + g * s_B_g + tR * s_B_t), 16)
            Bs = gl.load(b_rows[:, None] + nN[None, :], mask=sqR[:, None], other=0.0)
            sR = gl.arange(0, BLOCK_S, gl.SliceLayout(1, ROWS))
            Cs = gl.load(C_ptr + (lo + sR)[:, None] * s_C_t + g * s_C_g + nN[None, :], mask=(sR < q)[:, None],
                         other=0.0)
            # x over the sequence (BK, P), rows as 16-byte vectors too (its transpose is the products' A operand)
            pN = gl.arange(0, P, gl.SliceLayout(0, ROWS))
            x_rows = gl.multiple_of(gl.where(hR, xr_h + rR * s_xr_r, x_ptr + h * s_x_h + tR * s_x_t), 16)
            Xs = gl.load(x_rows[:, None] + pN[None, :], mask=sqR[:, None], other=0.0)
        if FLUSH:  # the history's dt (at most W <= FOLD_K rows): the fold's weights
            kS = gl.arange(0, FOLD_K, SCAN)
            dtH = gl.load(dtr_h + _wrap(rs + kS, R) * s_dtr_r, mask=kS < c, other=0.0)
        # the sequence's dt, A, D
        kk = gl.arange(0, BK, gl.SliceLayout(1, MMG))
        if KW > 0:
            is_hist, is_new, is_seq, ring, tok = _seq_slot(kk, c, q, rs, lo, R, NEW0)
        else:
            is_hist, is_new, is_seq, ring, tok = _seq(kk, c, q, rs, lo, R)
        dth = gl.load(dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
        dtn = gl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=is_new, other=0.0).to(gl.float32)
        A = gl.load(A_ptr + h).to(gl.float32)
        if HAS_DTB:
            dtn += gl.load(dtb_ptr + h).to(gl.float32)
        if HAS_D:
            Dh = gl.load(D_ptr + h).to(gl.float32)
        pM = gl.arange(0, P, gl.SliceLayout(1, MMA))
        sM = gl.arange(0, BLOCK_S, gl.SliceLayout(0, MMA))
        msM = sM < q
        if HAS_Z:
            zz = gl.load(z_ptr + (lo + sM)[None, :] * s_z_t + h * s_z_h + pM[:, None], mask=msM[None, :], other=0.0)
        # --- the factors F[k, s] = (B_k·C_s) dt_k e^{A (Λ_{c+s} - Λ_k)} (+ D on the diagonal) ---
        SHL: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        if KW > 0:  # the sequence tiles: the history, the window's conv outputs, zero rows past them
            bh = gl.allocate_shared_memory(Bs.dtype, [BK, N], SHL)
            xs = gl.allocate_shared_memory(Xs.dtype, [BK, P], SHL)
            bh.slice(0, FOLD_K, dim=0).store(Bs)
            xs.slice(0, FOLD_K, dim=0).store(Xs)
            bh.slice(FOLD_K, BLOCK_S, dim=0).store(Bn)
            xs.slice(FOLD_K, BLOCK_S, dim=0).store(Xn)
            if FOLD_K > BLOCK_S:  # FOLD_K - BLOCK_S zero rows: 8 or 24 (16 <= FOLD_K <= 32, BLOCK_S = 8)
                bh.slice(FOLD_K + BLOCK_S, BLOCK_S, dim=0).store(gl.zeros([BLOCK_S, N], Bs.dtype, CV))
                xs.slice(FOLD_K + BLOCK_S, BLOCK_S, dim=0).store(gl.zeros([BLOCK_S, P], Xs.dtype, CV))
                if FOLD_K > 2 * BLOCK_S:
                    bh.slice(FOLD_K + 2 * BLOCK_S, 2 * BLOCK_S, dim=0).store(
                        gl.zeros([2 * BLOCK_S, N], Bs.dtype, CV))
                    xs.slice(FOLD_K + 2 * BLOCK_S, 2 * BLOCK_S, dim=0).store(
                        gl.zeros([2 * BLOCK_S, P], Xs.dtype, CV))
        else:
            bh = gl.allocate_shared_memory(Bs.dtype, [BK, N], SHL, Bs)
        cs = gl.allocate_shared_memory(Cs.dtype, [BLOCK_S, N], SHL, Cs)
        if KW == 0:
            xs = gl.allocate_shared_memory(Xs.dtype, [BK, P], SHL, Xs)
        Gm = mma_v2(bh.load(GA), cs.permute([1, 0]).load(GB), gl.zeros([BK, BLOCK_S], gl.float32, MMG))
        if DT_SOFTPLUS:
            dtn = _softplus(dtn)
        dtn = gl.where(is_new, dtn, 0.0)
        dtp = gl.where(is_hist, dth, dtn)
        lam = gl.convert_layout(gl.associative_scan(gl.convert_layout(dtp, SCAN), 0, _add), dtp.type.layout)
        ss = gl.arange(0, BLOCK_S, gl.SliceLayout(0, MMG))
        pos = NEW0 + ss
        ms = ss < q
        causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
        diag = (kk[:, None] == pos[None, :]) & ms[None, :]
        lam_w = gl.sum(gl.where(diag, lam[:, None], 0.0), axis=0)
        F = gl.where(causal, Gm * dtp[:, None] * _decay(A, lam_w[None, :] - lam[:, None]), 0.0)
        if HAS_D:
            F += gl.where(diag, Dh, 0.0)
        Fb = gl.convert_layout(F, DB)
        dec_w = gl.convert_layout(_decay(A, lam_w), gl.SliceLayout(0, MMA))
        XT = xs.permute([1, 0]).load(DA).to(gl.float32)
        # --- the appends (disjoint from the history: c + q <= R) ---
        if KW > 0:
            rN = _wrap(rs + c + tC, R)
            mN = (tC < q)[:, None]
            gl.store(xr_h + rN[:, None] * s_xr_r + pC[None, :], Xn, mask=mN)
            gl.store(dtr_h + ring * s_dtr_r, dtn, mask=is_new)
            if h % HPG == 0:  # the group's first head appends the window's B rows
                gl.store(Br_base + rN[:, None] * s_Br_r + nC[None, :], Bn, mask=mN)
            # the new conv windows: the head's x channels (this program is their only reader and writer), then
            # the group's B and C channels, by the last of the group's programs to have read their old columns
            lL = gl.arange(0, BLOCK_L, gl.SliceLayout(1, CV))
            _window_update(lL, chX, q, win_pg, end, width, s_win_c, xbc_ptr, lo, s_xbc_t, KW)
            _cta_barrier()
            before = gl.atomic_add(cnt_pg + g, 1, sem="acq_rel", scope="gpu")
            if before == HPG - 1:
                gl.atomic_xchg(cnt_pg + g, 0, sem="relaxed", scope="gpu")
                _window_update(lL, chB, q, win_pg, end, width, s_win_c, xbc_ptr, lo, s_xbc_t, KW)
                _window_update(lL, chB + GN, q, win_pg, end, width, s_win_c, xbc_ptr, lo, s_xbc_t, KW)
        else:
            gl.store(xr_h + rR[:, None] * s_xr_r + pN[None, :], Xs, mask=nR[:, None])
            gl.store(dtr_h + ring * s_dtr_r, dtn, mask=is_new)
            if h % HPG == 0:  # the group's first head appends the window's B rows
                gl.store(Br_base + rR[:, None] * s_Br_r + nN[None, :], Bs, mask=nR[:, None])
        # --- the readout from the copied chunks, then the sequence ---
        mbarrier.wait(bar, 0)
        Y = gl.zeros([P, BLOCK_S], gl.float32, MMA)
        for j in gl.static_range(NCH):
            Cj = cs.slice(j * NC, NC, dim=1).permute([1, 0]).load(DB).to(gl.float32)
            Y = mma_v2(tile.index(j).load(DA), Cj, Y, input_precision="tf32")
        Y = Y * dec_w[None, :]
        Y = mma_v2(XT, Fb, Y, input_precision="tf32")
        if HAS_Z:
            zf = zz.to(gl.float32)
            Y = Y * (zf / (1.0 + gl.exp(-zf)))
        gl.store(out_ptr + (lo + sM)[None, :] * s_o_t + h * s_o_h + pM[:, None], Y.to(out_ptr.dtype.element_ty),
                 mask=msM[None, :])
        if FLUSH:
            # S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h, w_k = dt_k e^{A (Λ_h - Λ_k)}, chunk by chunk from shared memory
            tot = gl.sum(dtH, axis=0)
            w = gl.convert_layout(dtH * _decay(A, tot - gl.associative_scan(dtH, 0, _add)), gl.SliceLayout(0, DA))
            XTw = xs.slice(0, FOLD_K, dim=0).permute([1, 0]).load(DA).to(gl.float32) * w[None, :]
            hi = (XTw.to(gl.int32, bitcast=True) & -8192).to(gl.float32, bitcast=True)
            lo_ = XTw - hi
            carry = _decay(A, tot)
            # B's history rows from shared memory (rows past the history meet zero weights)
            ck_h = ck_ptr + page * s_ck_pg + h * s_ck_h
            nM = gl.arange(0, NC, gl.SliceLayout(0, MMA))
            for j in gl.static_range(NCH):
                Bj = bh.slice(0, FOLD_K, dim=0).slice(j * NC, NC, dim=1).load(DB).to(gl.float32)
                S = tile.index(j).load(MMA) * carry
                S = mma_v2(hi, Bj, S, input_precision="tf32")
                S = mma_v2(lo_, Bj, S, input_precision="tf32")
                gl.store(ck_h + pM[:, None] * N + (j * NC + nM)[None, :], S)
        mbarrier.invalidate(bar)

    @gluon.jit
    def verify_warp_kernel(
        desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr,
        x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr,
        window, R, H,
        s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg, s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
        s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r,
        xbc_ptr, win_ptr, shift_ptr, rsh_ptr, cw_ptr, cb_ptr, cnt_ptr, silu, width, XB, GN,
        s_xbc_t, s_win_pg, s_win_c, s_rsh, s_cw_d, s_cw_k, s_cnt_pg,
        P: gl.constexpr, N: gl.constexpr, HPG: gl.constexpr, BLOCK_K: gl.constexpr, FOLD_K: gl.constexpr,
        BLOCK_S: gl.constexpr, NC: gl.constexpr, DT_SOFTPLUS: gl.constexpr, GDC: gl.constexpr, KW: gl.constexpr,
        BLOCK_L: gl.constexpr,
    ):
        """The per-warp verify kernel: program (head, row). Arguments as the TMA kernel's
        (:func:`ssmstate.ops.triton.verify.replay_verify` documents the tensors); ``desc``: :func:`warp_descriptor`
        of the checkpoint, copied as ``NC``-column chunks (:data:`CHUNK_N`). ``rc_ptr``: the step's row cursors,
        or None (then each page's). ``GDC`` (``pdl=True``): each program issues its tile's copy, then waits for the
        kernel before and lets the next one launch.

        ``KW`` > 0: the fused layer (:func:`ssmstate.ops.triton.conv_verify.replay_conv_verify` documents the
        tensors; the conv arguments in :class:`ssmstate.ops.triton.verify.ConvIn`'s order): x, B and C are the
        conv outputs of ``xbc_ptr``'s channels (x from channel 0, B from ``XB``, C from ``XB + GN``), computed in
        the program from the page's window ``win_ptr`` (``width`` columns, its history ``KW`` columns ending
        ``shift`` columns before the right end; ``rsh_ptr``: the step's gathered shifts, or None) with the
        weights ``cw_ptr`` and bias ``cb_ptr``; the program stores its head's x channels' new window, and the last
        of a row's group to arrive at ``cnt_ptr[page, g]`` (zero between launches) the group's B and C window
        (the fused layer's counter protocol, :mod:`ssmstate.ops.triton.conv_verify_kernel`)."""
        h = gl.program_id(0)
        row = gl.program_id(1)
        page32 = gl.load(page_ptr + row)
        lo = gl.load(cu_ptr + row)
        q = gl.load(cu_ptr + row + 1) - lo
        if rc_ptr is not None:
            c = gl.load(rc_ptr + s_rc_k + row * s_rc_r)
            rs = gl.load(rc_ptr + row * s_rc_r)
        if KW > 0:  # the row's conv shift: gathered with the step (beside the page id), else its page's
            if rsh_ptr is not None:
                shift = gl.load(rsh_ptr + row * s_rsh)
            else:
                shift = gl.load(shift_ptr + page32)
        if (page32 != 0) & (q > 0):
            page = page32.to(gl.int64)
            if rc_ptr is None:
                c = gl.load(nc_ptr + page)
                rs = gl.load(rs_ptr + page)
            c = gl.minimum(gl.maximum(c, 0), window)
            rs = gl.minimum(gl.maximum(rs, 0), R - 1)
            ck_row0 = (page32 * H + h) * P
            if KW > 0:  # the conv update's clamp: a corrupted shift stays in the window
                end = width - gl.minimum(gl.maximum(shift, 0), width - KW)
                cv = (xbc_ptr, s_xbc_t, win_ptr + page * s_win_pg, s_win_c, end, width, cw_ptr, s_cw_d, s_cw_k,
                      cb_ptr, silu, cnt_ptr + page * s_cnt_pg, XB, GN)
            else:
                cv = page  # unused
            if c + q > window:
                _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr,
                     z_ptr, out_ptr, page, h, q, lo, c, rs, R, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
                     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
                     s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, ck_row0, cv, True, P, N, HPG, BLOCK_K, FOLD_K, BLOCK_S, NC,
                     DT_SOFTPLUS, GDC, KW, BLOCK_L)
            else:
                _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr,
                     z_ptr, out_ptr, page, h, q, lo, c, rs, R, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
                     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
                     s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, ck_row0, cv, False, P, N, HPG, BLOCK_K, FOLD_K, BLOCK_S,
                     NC, DT_SOFTPLUS, GDC, KW, BLOCK_L)
        if GDC:  # programs that met no row of theirs end after the kernel before too (at once for the others)
            _pdl_wait()
