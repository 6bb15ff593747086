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

Same math and rounding as the TMA kernel (:mod:`~ssmstate.ops.triton.verify_tma`): tf32 readout and sequence
products, an exact 16-bit Gram, a 2 x tf32 fold (the x side split, B exact in tf32). GPU only (Gluon kernels do
not run in the interpreter), for fp32 checkpoints with P = 64, 16-bit x, B and C, a ring of at most 32 rows and no
fused conv (:func:`warp_supported`). The launch choice takes it on a card under ``lean_gbps_per_sm`` (the H100) for
every such call but a programmatic dependent's (``launch_table.json``, shape ``warp``); ``override(shape="warp")``
anywhere.
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
    HAVE_GLUON = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 6)
except ImportError:  # pragma: no cover - depends on the Triton build
    HAVE_GLUON = False

#: head-dim rows per warp (the m16n8 products' rows) and warps per program
WARP_ROWS = 16
NUM_WARPS = 4
#: checkpoint columns per TMA chunk: 128 bytes of fp32, the widest row a 128-byte-swizzled copy takes
CHUNK_N = 32


def warp_supported(checkpoint: torch.Tensor, x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, R: int,
                   T: int) -> bool:
    """The per-warp kernel takes this call: a Hopper or later GPU (CPU tensors: an offline build's capture), a
    contiguous fp32 checkpoint (pages, H, 64, N) with N a multiple of 32 up to 256, 16-bit x, B and C with B and C
    of one dtype, a ring of at most 32 rows, windows of at most 8 tokens."""
    _, _, P, N = checkpoint.shape
    if checkpoint.is_cuda and torch.cuda.get_device_capability(checkpoint.device)[0] < 9:
        return False  # TMA copies and mbarriers: Hopper and later
    return (HAVE_GLUON and checkpoint.dtype == torch.float32 and P == WARP_ROWS * NUM_WARPS
            and N % CHUNK_N == 0 and N <= 256 and checkpoint.is_contiguous() and checkpoint.data_ptr() % 16 == 0
            and x.dtype in (torch.bfloat16, torch.float16) and B.dtype == C.dtype
            and B.dtype in (torch.bfloat16, torch.float16) and R <= 32 and T <= 8)


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
    def _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr,
             out_ptr, page, h, q, lo, c, rs, R,
             s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg, s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
             s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t, s_z_h, s_o_t, s_o_h,
             ck_row0, FLUSH: gl.constexpr, P: gl.constexpr, N: gl.constexpr, HPG: gl.constexpr,
             BLOCK_K: gl.constexpr, FOLD_K: gl.constexpr, BLOCK_S: gl.constexpr, NC: gl.constexpr,
             DT_SOFTPLUS: gl.constexpr, GDC: gl.constexpr):
        """One (row, head) once its cursors are known; ``FLUSH``: the row's route (each route its own build)."""
        NCH: gl.constexpr = N // NC
        # a non-flush row's sequence is at most W rows (c + q <= W): its build takes FOLD_K = pow2(W) of them
        BK: gl.constexpr = BLOCK_K if FLUSH else FOLD_K
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
        # --- the gathers, all issued while the tile is in flight ---
        # B over the sequence (BK, N) and C over the window (BLOCK_S, N), 16-bit, in 16-byte vectors; both go
        # to shared memory, where the Gram, the readout and the fold take them in their products' layouts
        ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        kR = gl.arange(0, BK, gl.SliceLayout(1, ROWS))
        hR, nR, sqR, rR, tR = _seq(kR, c, q, rs, lo, R)
        nN = gl.arange(0, N, gl.SliceLayout(0, ROWS))
        b_rows = gl.where(hR, Br_base + rR * s_Br_r, B_ptr + g * s_B_g + tR * s_B_t)
        Bs = gl.load(b_rows[:, None] + nN[None, :], mask=sqR[:, None], other=0.0)
        sR = gl.arange(0, BLOCK_S, gl.SliceLayout(1, ROWS))
        Cs = gl.load(C_ptr + (lo + sR)[:, None] * s_C_t + g * s_C_g + nN[None, :], mask=(sR < q)[:, None],
                     other=0.0)
        # x over the sequence (BK, P), rows as 16-byte vectors too (its transpose is the products' A operand)
        pN = gl.arange(0, P, gl.SliceLayout(0, ROWS))
        x_rows = gl.where(hR, xr_h + rR * s_xr_r, x_ptr + h * s_x_h + tR * s_x_t)
        Xs = gl.load(x_rows[:, None] + pN[None, :], mask=sqR[:, None], other=0.0)
        if FLUSH:  # the history's dt (at most W <= FOLD_K rows): the fold's weights
            kS = gl.arange(0, FOLD_K, SCAN)
            dtH = gl.load(dtr_h + _wrap(rs + kS, R) * s_dtr_r, mask=kS < c, other=0.0)
        # the sequence's dt, A, D
        kk = gl.arange(0, BK, gl.SliceLayout(1, MMG))
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
        bh = gl.allocate_shared_memory(Bs.dtype, [BK, N], SHL, Bs)
        cs = gl.allocate_shared_memory(Cs.dtype, [BLOCK_S, N], SHL, Cs)
        xs = gl.allocate_shared_memory(Xs.dtype, [BK, P], SHL, Xs)
        Gm = mma_v2(bh.load(GA), cs.permute([1, 0]).load(GB), gl.zeros([BK, BLOCK_S], gl.float32, MMG))
        if DT_SOFTPLUS:
            dtn = _softplus(dtn)
        dtn = gl.where(is_new, dtn, 0.0)
        dtp = gl.where(is_hist, dth, dtn)
        lam = gl.convert_layout(gl.associative_scan(gl.convert_layout(dtp, SCAN), 0, _add), dtp.type.layout)
        ss = gl.arange(0, BLOCK_S, gl.SliceLayout(0, MMG))
        pos = c + ss
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
        P: gl.constexpr, N: gl.constexpr, HPG: gl.constexpr, BLOCK_K: gl.constexpr, FOLD_K: gl.constexpr,
        BLOCK_S: gl.constexpr, NC: gl.constexpr, DT_SOFTPLUS: gl.constexpr, GDC: gl.constexpr,
    ):
        """The per-warp verify kernel: program (head, row). Arguments as the TMA kernel's
        (:func:`ssmstate.ops.triton.verify.replay_verify` documents the tensors); ``desc``: :func:`warp_descriptor`
        of the checkpoint, copied as ``NC``-column chunks (:data:`CHUNK_N`). ``rc_ptr``: the step's row cursors, or None (then each page's). ``GDC`` (``pdl=True``):
        each program issues its tile's copy, then waits for the kernel before and lets the next one launch."""
        h = gl.program_id(0)
        row = gl.program_id(1)
        page32 = gl.load(page_ptr + row)
        lo = gl.load(cu_ptr + row)
        q = gl.load(cu_ptr + row + 1) - lo
        if rc_ptr is not None:
            c = gl.load(rc_ptr + s_rc_k + row * s_rc_r)
            rs = gl.load(rc_ptr + row * s_rc_r)
        if (page32 != 0) & (q > 0):
            page = page32.to(gl.int64)
            if rc_ptr is None:
                c = gl.load(nc_ptr + page)
                rs = gl.load(rs_ptr + page)
            c = gl.minimum(gl.maximum(c, 0), window)
            rs = gl.minimum(gl.maximum(rs, 0), R - 1)
            ck_row0 = (page32 * H + h) * P
            if c + q > window:
                _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr,
                     z_ptr, out_ptr, page, h, q, lo, c, rs, R, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
                     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
                     s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, ck_row0, True, P, N, HPG, BLOCK_K, FOLD_K, BLOCK_S, NC,
                     DT_SOFTPLUS, GDC)
            else:
                _row(desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr,
                     z_ptr, out_ptr, page, h, q, lo, c, rs, R, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
                     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
                     s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, ck_row0, False, P, N, HPG, BLOCK_K, FOLD_K, BLOCK_S, NC,
                     DT_SOFTPLUS, GDC)
        if GDC:  # programs that met no row of theirs end after the kernel before too (at once for the others)
            _pdl_wait()
