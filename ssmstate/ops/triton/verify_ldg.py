"""The portable (LDG) verify kernel: any geometry the Triton backend takes, plain or pipelined loads.

One program per (row, ``HPP`` heads of one group, P tile; ``HPP`` is 1 on the GPU). The checkpoint tile is loaded
whole (first: it needs only the page) or, on long grids, ``S0 Cᵀ`` is streamed through a pipelined loop of
``NC``-column chunks over ``NS`` stages. The math is the TMA kernel's (:mod:`ssmstate.ops.triton.verify_tma`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmstate.ops.triton.common import (chunk, decay, fold_chunk, fold_chunk_value, fold_weights, load_chunk, load_raw,
                                        load_tile, pdl_wait, safe_cursors, softplus)
from ssmstate.ops.triton.quant import (codes, fold_store_quant, load_scale, round_store_value, sr_bits, sr_head_key,
                                       sr_page_key, store_codes)


@triton.jit
def _head_tile(ck_page, h, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, EVEN: tl.constexpr,
               DOT_PREC: tl.constexpr, IDX64: tl.constexpr, QMODE: tl.constexpr):
    """What a head needs of its checkpoint for the outputs: the tile (NC = 0; in its stored type) or ``S0 Cᵀ``
    streamed (NC > 0; a quantized checkpoint's codes, unscaled)."""
    if NC > 0:
        return _readout(ck_page, h, s_ck_h, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC, NS, EVEN,
                        DOT_PREC, IDX64, QMODE)
    else:
        return load_tile(ck_page, h, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)


@triton.jit
def _readout(ck_page, h, s_ck_h, c_rows, ms, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, EVEN: tl.constexpr,
             DOT_PREC: tl.constexpr, IDX64: tl.constexpr, QMODE: tl.constexpr):
    """``S0 Cᵀ`` (BLOCK_P, BLOCK_S) for head ``h``, the tile streamed in NC-column chunks.

    A matmul K loop: the compiler pipelines the chunk loads over NS stages (cp.async into shared
    memory, read there by the tensor cores), so only NS chunks of shared memory and one small
    accumulator are held, instead of the whole tile.
    """
    acc = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
    for n0 in tl.range(0, BLOCK_N, NC, num_stages=NS):
        oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, NC, IDX64)
        acc, Sc = _readout_step(acc, ck, mc, oc, c_rows, ms, N_, EVEN, DOT_PREC, QMODE)
    return acc


@triton.jit
def _readout_step(acc, ck, mc, oc, c_rows, ms, N_, EVEN: tl.constexpr, DOT_PREC: tl.constexpr, QMODE: tl.constexpr):
    """One chunk of the streamed readout: ``acc += S0[:, oc] C[:, oc]ᵀ`` (a quantized checkpoint's codes: the
    scales multiply the sum); returns the chunk too (fp32)."""
    if QMODE > 0:
        Sc = codes(load_raw(ck, mc, EVEN), QMODE)
    else:
        Sc = load_chunk(ck, mc, EVEN)
    Cc = tl.load(c_rows[None, :] + oc[:, None], mask=ms[None, :] & (oc < N_)[:, None], other=0.0)
    return tl.dot(Sc, Cc.to(tl.float32), acc, input_precision=DOT_PREC), Sc


@triton.jit
def _head_inputs(
    h, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms,
    xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h,
    A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr,
    cks_page, s_cks_h, EVEN: tl.constexpr, QMODE: tl.constexpr, ALIGNED: tl.constexpr,
):
    """Head ``h``'s other global loads (issued together, so the loop keeps them in flight a head ahead); a
    quantized checkpoint's decode scales of the tile's rows too (else A)."""
    # x over the sequence, transposed (BLOCK_P, BLOCK_K): ring rows for k < c, the window's inputs after
    x_rows = tl.where(is_hist, xr_base + h * s_xr_h + ring * s_xr_r, x_ptr + h * s_x_h + tok * s_x_t)
    if ALIGNED:  # stated here, on the pick itself (a helper's argument would carry no hint back)
        x_rows = tl.multiple_of(x_rows, 16)
    X_raw = tl.load(x_rows[None, :] + offs_p[:, None], mask=mp[:, None] & is_seq[None, :], other=0.0)
    dth = tl.load(dtr_base + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
    dtn = tl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=is_new, other=0.0)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h) if HAS_D else A
    dtb = tl.load(dtb_ptr + h) if HAS_DTB else A
    if HAS_Z:
        zz = tl.load(z_ptr + tw[None, :] * s_z_t + h * s_z_h + offs_p[:, None], mask=mp[:, None] & ms[None, :],
                     other=0.0)
    else:
        zz = A
    if QMODE > 0:
        sc = load_scale(cks_page + h * s_cks_h + offs_p, mp, EVEN)
    else:
        sc = A
    return X_raw, dth, dtn, A, Dh, dtb, zz, sc


@triton.jit
def _verify_head(
    h, S, X_raw, dth, dtn, A, Dh, dtb, zz, sc, cks_page, s_cks_h, key_pg,
    ck_page, Cd, G, b_hist, N_, is_hist, is_new, causal, diag, ring, tw, offs_p, mp, ms, pt,
    ck_ptr, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, out_ptr, s_o_t, s_o_h, s_ck_h,
    S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, EVEN: tl.constexpr,
    FLUSH: tl.constexpr, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
    c_rows, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, IDX64: tl.constexpr,
    QMODE: tl.constexpr, SR: tl.constexpr,
):
    """One head of a verify row from its loaded inputs: outputs, ring append, and on a flush row the fold (a
    quantized checkpoint's: codes and scales rewritten, :func:`~ssmstate.ops.triton.quant.fold_store_quant`;
    ``SR``: stochastically rounded with the page's hash state ``key_pg``)."""
    A = A.to(tl.float32)
    dtn = dtn.to(tl.float32)
    if HAS_DTB:
        dtn += dtb.to(tl.float32)
    if DT_SOFTPLUS:
        dtn = softplus(dtn)
    dtn = tl.where(is_new, dtn, 0.0)
    dtp = tl.where(is_hist, dth, dtn)
    XT = X_raw.to(tl.float32)
    # y_s = e^{A Λ_w} S0 C_s + Σ_{k<=w} dt_k e^{A (Λ_w - Λ_k)} (B_k.C_s) x_k + D x_w, w = c + s
    lam = tl.cumsum(dtp, axis=0)
    lam_w = tl.sum(tl.where(diag, lam[:, None], 0.0), axis=0)
    F = tl.where(causal, G * dtp[:, None] * decay(A, lam_w[None, :] - lam[:, None]), 0.0)
    if HAS_D:  # D x_w rides on the diagonal k = w of the factor matrix
        F += tl.where(diag, Dh.to(tl.float32), 0.0)
    Y = tl.dot(XT, F, input_precision=DOT_PREC)
    if QMODE > 0:  # the codes' product, then each row's decode scale (exact: every code is exact in tf32)
        if NC > 0:
            Y += S * (sc[:, None] * decay(A, lam_w)[None, :])
        else:
            Y += tl.dot(codes(S, QMODE), Cd, input_precision=DOT_PREC) * (
                sc[:, None] * decay(A, lam_w)[None, :])
    elif NC > 0:  # S is S0 Cᵀ (streamed readout)
        Y += S * decay(A, lam_w)[None, :]
    else:
        Y += tl.dot(S.to(tl.float32), Cd, input_precision=DOT_PREC) * decay(A, lam_w)[None, :]
    if HAS_Z:
        z = zz.to(tl.float32)
        Y *= z * tl.sigmoid(z)
    tl.store(out_ptr + tw[None, :] * s_o_t + h * s_o_h + offs_p[:, None], Y.to(out_ptr.dtype.element_ty),
             mask=mp[:, None] & ms[None, :])
    # append the window's x and dt rows to the ring (disjoint from the history: c + q <= R)
    x_ring = xr_base + h * s_xr_h + ring * s_xr_r
    tl.store(x_ring[None, :] + offs_p[:, None], X_raw, mask=mp[:, None] & is_new[None, :])
    if pt == 0:
        tl.store(dtr_base + h * s_dtr_h + ring * s_dtr_r, dtn, mask=is_new)
    if FLUSH:
        # S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h over the c history rows, stored over S0 N chunk by N chunk:
        # each chunk of S0 is re-read (an L2 hit) so no full-tile accumulator is live next to S0
        XTw, hi, lo, carry = fold_weights(XT, dth, A, FOLD_SPLIT)
        if SR:
            key_h = sr_head_key(key_pg, h)
        else:
            key_h = key_pg  # unused
        if QMODE > 0:
            fold_store_quant(ck_page, cks_page + h * s_cks_h + offs_p, h, s_ck_h, mp, offs_p, N_, b_hist, is_hist,
                             XTw, hi, lo, carry, sc, key_h, S_CK_P, BLOCK_P, BLOCK_N, FOLD_N, EVEN, FOLD_SPLIT,
                             FOLD_PREC, QMODE, SR, IDX64)
        elif SR:  # a 16-bit checkpoint, stochastically rounded
            for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
                S1 = fold_chunk_value(load_chunk(ck, mc, EVEN) * carry, oc, b_hist, is_hist, N_, XTw, hi, lo,
                                      FOLD_SPLIT, FOLD_PREC)
                store_codes(ck, mc, round_store_value(S1, sr_bits(key_h, offs_p, oc), ck_ptr.dtype.element_ty, True),
                            EVEN)
        else:
            for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
                fold_chunk(load_chunk(ck, mc, EVEN) * carry, ck, mc, oc, b_hist, is_hist, N_, XTw, hi, lo, ck_ptr,
                           EVEN, FOLD_SPLIT, FOLD_PREC)


@triton.jit
def _verify_heads(
    h0, S, ck_page, Cd, G, b_hist, N_, is_hist, is_new, is_seq, causal, diag, ring, tok, tw, offs_p, mp, mS, ms, pt,
    ck_ptr, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h,
    A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h, cks_page, s_cks_h, key_pg,
    S_CK_P: tl.constexpr, HPP: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, EVEN: tl.constexpr, FLUSH: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
    c_rows, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, IDX64: tl.constexpr,
    QMODE: tl.constexpr, SR: tl.constexpr, ALIGNED: tl.constexpr,
):
    """Heads ``h0 .. h0 + HPP - 1`` of one row in a loop (HPP > 1 only in the interpreter: fewer, longer
    programs); ``S`` is head ``h0``'s tile, already in flight (NC = 0; with NC > 0 the loop streams each head's
    tile itself)."""
    if NC > 0:
        S = _head_tile(ck_page, h0, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC, NS,
                       EVEN, DOT_PREC, IDX64, QMODE)
    X_raw, dth, dtn, A, Dh, dtb, zz, sc = _head_inputs(
        h0, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t,
        dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h,
        HAS_D, HAS_DTB, HAS_Z, cks_page, s_cks_h, EVEN, QMODE, ALIGNED)
    for i in range(HPP):
        _verify_head(h0 + i, S, X_raw, dth, dtn, A, Dh, dtb, zz, sc, cks_page, s_cks_h, key_pg,
                     ck_page, Cd, G, b_hist, N_, is_hist, is_new, causal, diag, ring, tw, offs_p, mp, ms, pt,
                     ck_ptr, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, out_ptr, s_o_t, s_o_h, s_ck_h,
                     S_CK_P, BLOCK_P, BLOCK_N, FOLD_N, EVEN, FLUSH, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS,
                     DOT_PREC, FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, QMODE, SR)
        if HPP > 1:  # the next head (the last step re-loads its own head: L2 hits, no masked load)
            hn = h0 + tl.minimum(i + 1, HPP - 1)
            S = _head_tile(ck_page, hn, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC,
                           NS, EVEN, DOT_PREC, IDX64, QMODE)
            X_raw, dth, dtn, A, Dh, dtb, zz, sc = _head_inputs(
                hn, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms, xr_base, s_xr_h, s_xr_r, x_ptr,
                s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr,
                s_z_t, s_z_h, HAS_D, HAS_DTB, HAS_Z, cks_page, s_cks_h, EVEN, QMODE, ALIGNED)


@triton.jit(do_not_specialize=["layer"])  # layer 1 must stay a runtime int (the SR hash casts it)
def verify_ldg_kernel(
    ck_ptr, cks_ptr, seed_ptr, layer, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, P, N,
    s_ck_pg, s_ck_h,
    s_cks_pg, s_cks_h,
    s_xr_pg, s_xr_h, s_xr_r,
    s_Br_pg, s_Br_g, s_Br_r,
    s_dtr_pg, s_dtr_h, s_dtr_r,
    s_x_t, s_x_h,
    s_dt_t, s_dt_h,
    s_B_t, s_B_g,
    s_C_t, s_C_g,
    s_z_t, s_z_h,
    s_o_t, s_o_h,
    S_CK_P: tl.constexpr, NPT: tl.constexpr, HPG: tl.constexpr, HPP: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, EVEN: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr, IDX64: tl.constexpr,
    NATIVE_G: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr,
    GDC: tl.constexpr, ALIGNED: tl.constexpr,
):
    # One program: one row, HPP heads of one group, one tile of BLOCK_P head-dim rows. What depends on the group only (cursors,
    # B and C tiles, the Gram B·Cᵀ) is computed once for the HPP heads. A quantized checkpoint (its decode scales
    # cks_ptr, (pages, H, P) fp32) is int8 or e4m3 bytes (uint8): QMODE 1 / 2. ALIGNED: every row of the rings, x and
    # B starts on a 16-byte boundary (the launch checked it), so the picked sequence rows load as 16-byte vectors.
    CK_TY: tl.constexpr = ck_ptr.dtype.element_ty
    QMODE: tl.constexpr = (1 if CK_TY == tl.int8 else 2) if cks_ptr is not None else 0
    SR: tl.constexpr = seed_ptr is not None  # stochastic rounding of the flush rows' writes (int64 (1,) seed)
    pid = tl.program_id(0)
    row = tl.program_id(1)
    pt = pid % NPT
    chunk = pid // NPT  # (group, head chunk)
    g = (chunk // (HPG // HPP)).to(tl.int64)
    h0 = (chunk * HPP).to(tl.int64)
    page = tl.load(page_ptr + row).to(tl.int64)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if (page != 0) & (q > 0):
        offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        if IDX64:
            offs_p = offs_p.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
        mp = offs_p < P
        mn = offs_n < N
        mS = mp[:, None] & mn[None, :]
        ss = tl.arange(0, BLOCK_S)
        ms = ss < q
        tw = lo + ss
        if IDX64:
            tw = tw.to(tl.int64)
        c_rows = C_ptr + tw * s_C_t + g * s_C_g  # C over the window, row pointers
        # the first head's tile is most of the first round trip and needs only the page: issue it first
        ck_page = ck_ptr + page * s_ck_pg + pt * BLOCK_P * S_CK_P
        if QMODE > 0:
            cks_page = cks_ptr + page * s_cks_pg
        else:
            cks_page = ck_page  # unused
        if SR:
            key_pg = sr_page_key(seed_ptr, layer, page)
        else:
            key_pg = page  # unused
        if NC > 0:  # streamed: the readout (or a flush row's fold) starts in the head loop
            S = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
        else:
            S = load_tile(ck_page, h0, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)
        c, rs = safe_cursors(tl.load(nc_ptr + page), tl.load(rs_ptr + page), window, R)
        if GDC:  # a programmatic dependent (pdl=True): the step's inputs only after the kernel before has ended
            pdl_wait()
        kk = tl.arange(0, BLOCK_K)
        is_hist = kk < c
        is_new = (kk >= c) & (kk < c + q)
        is_seq = kk < c + q
        ring = (rs + kk) % R  # ring row of sequence position k (history and appended alike)
        tok = lo + tl.maximum(kk - c, 0)
        if IDX64:  # the interpreter checks every int32 vector op for overflow: int64 skips it
            ring = ring.to(tl.int64)
            tok = tok.to(tl.int64)
        pos = c + ss
        causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
        diag = (kk[:, None] == pos[None, :]) & ms[None, :]
        # the group's B over the sequence (ring rows, then the window's inputs) and C over the window
        Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
        b_rows = tl.where(is_hist, Br_base + ring * s_Br_r, B_ptr + g * s_B_g + tok * s_B_t)
        if ALIGNED:
            b_rows = tl.multiple_of(b_rows, 16)
        B_raw = tl.load(b_rows[:, None] + offs_n[None, :], mask=is_seq[:, None] & mn[None, :], other=0.0)
        Cw_raw = tl.load(c_rows[:, None] + offs_n[None, :], mask=ms[:, None] & mn[None, :], other=0.0)
        if NATIVE_G:  # 16-bit B and C: exact products, fp32 accumulation
            G = tl.dot(B_raw, tl.trans(Cw_raw))
        else:
            G = tl.dot(B_raw.to(tl.float32), tl.trans(Cw_raw.to(tl.float32)), input_precision=DOT_PREC)
        Cd = tl.trans(Cw_raw.to(tl.float32))  # (N, BLOCK_S), readout operand
        if (pt == 0) & (h0 % HPG == 0):  # append the window's B rows to the ring, once per group
            tl.store(Br_base + ring[:, None] * s_Br_r + offs_n[None, :], B_raw, mask=is_new[:, None] & mn[None, :])
        flush = c + q > window
        xr_base = xr_ptr + page * s_xr_pg
        dtr_base = dtr_ptr + page * s_dtr_pg
        b_hist = Br_base + ring * s_Br_r  # the history's B rows (re-read per N chunk of a flush row's fold)
        # two calls, one per route, so each loop body is specialized (FLUSH is a constexpr)
        if flush:
            _verify_heads(h0, S, ck_page, Cd, G, b_hist, N, is_hist, is_new, is_seq, causal, diag, ring, tok, tw,
                          offs_p, mp, mS, ms, pt, ck_ptr, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t,
                          dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr,
                          z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h, cks_page, s_cks_h, key_pg, S_CK_P, HPP,
                          BLOCK_P, BLOCK_N, FOLD_N, EVEN, True, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, DOT_PREC,
                          FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, QMODE, SR, ALIGNED)
        else:
            _verify_heads(h0, S, ck_page, Cd, G, b_hist, N, is_hist, is_new, is_seq, causal, diag, ring, tok, tw,
                          offs_p, mp, mS, ms, pt, ck_ptr, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t,
                          dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr,
                          z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h, cks_page, s_cks_h, key_pg, S_CK_P, HPP,
                          BLOCK_P, BLOCK_N, FOLD_N, EVEN, False, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, DOT_PREC,
                          FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, QMODE, SR, ALIGNED)
    if GDC:  # a program that skipped its row ends only after the kernel before too
        pdl_wait()
