"""The TMA verify kernel: the default where the geometry allows it (:func:`ssmstate.ops.triton.config.tma_block_p`).

One program per (row, ``HEADS`` heads of one group, ``BLOCK_P`` rows of the head dim); several heads run in a
software pipeline (:func:`_tma_heads`). Every load of a head but the checkpoint is a plain gather (the cursors
first, then the history and window rows); the checkpoint tile arrives by one TMA copy into shared memory and the
readout's tensor-core product reads it there: on non-flush rows the tile never passes through registers. Triton
waits for a single copy where it is issued; in the pipelined loop it issues the next head's copy at the end of an
iteration, so the next head's gathers go out into registers at the top of the iteration instead, and an L2
prefetch (``PF_AHEAD``) starts the next tile's DRAM read there too. Optional L2 prefetches at the program's start
(``PF_*``) stream the first tile and the rings while the cursors come back.

The split launches (``ROUTE`` 1 and 2) run the same per-row work (:func:`_tma_program`) over one route's rows,
ranked on the device, each persistent program streaming an equal share of the heads, one group's heads at a
time in a loop with a runtime count; each launch is built for its own register budget.

Math (both verify kernels): a row's sequence is its ``c`` history rows from the ring followed by its ``q`` new
tokens, indexed ``k``, ring row ``(ring_start + k) % R``; outputs ``Y = X_seqᵀ F + (S0 Cᵀ) * exp(A Λ_w)`` with the
causal factors ``F[k, s] = (B_k·C_s) dt_k exp(A (Λ_{c+s} - Λ_k))``; a flush row (``c + q > W``, decided per row on
the device) also folds its history into the checkpoint, ``S1 = e^{AΛ_h} S0 + (X_h w)ᵀ B_h``, and stores it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmstate.ops.triton.common import (
    chunk, decay, fold_chunk, fold_chunk_value, fold_tile, fold_weights, load_chunk, pdl_wait, prefetch_l2,
    safe_cursors, softplus, wrap,
)
from ssmstate.ops.triton.conv import arrive, conv_loads, conv_operands, conv_outputs, store_window, window_loads
from ssmstate.ops.triton.quant import (
    chunk_amax, codes_as, dequant, encode_scales, encode_tile, fold_store_quant, round_store_value, sr_bits,
    sr_head_key, sr_page_key,
)


@triton.jit
def _tma_gathers(h, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
                 s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p, is_hist,
                 is_new, is_seq, ms, cv, cks_ptr, s_cks_pg, s_cks_h, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr,
                 HAS_Z: tl.constexpr, KW: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr):
    """Head ``h``'s loads but its checkpoint tile: x over the sequence (K, BLOCK_P), the history's dt, the
    window's raw dt (+ dt_bias), A, D, the gate z (BLOCK_P, BLOCK_S) and an 8-bit checkpoint's decode scales
    (BLOCK_P,) (``cks_ptr``: loaded here, ahead of the tile's copy, as the readout needs them once the tile is in);
    absent ones are A. ``KW`` > 0 (the fused layer): the window's x rows are the conv's outputs of the head's
    channels, so x is the history's rows, the conv's loads and the channels' sequence columns (:func:`_conv_x`
    computes from them once the tile's copy has gone out)."""
    QUANT: tl.constexpr = cks_ptr is not None
    if QUANT:
        sc = tl.load(cks_ptr + page * s_cks_pg + h * s_cks_h + offs_p)
    xr_h = xr_ptr + page * s_xr_pg + h * s_xr_h
    if KW > 0:  # x is xBC's x channels (head stride P): the head's channels are h * s_x_h + p
        chx = h * s_x_h + offs_p
        pre_x = conv_loads(cv, chx, KW, BLOCK_T)
        win_x = window_loads(cv, chx, BLOCK_L, KW)
    else:
        # 16-byte aligned rows (the launch checks Step.aligned): stated, as the pick hides it
        x_rows = tl.multiple_of(tl.where(is_hist, xr_h + ring * s_xr_r, x_ptr + h * s_x_h + tok * s_x_t), 16)
        X_raw = tl.load(x_rows[:, None] + offs_p[None, :], mask=is_seq[:, None], other=0.0)
    dth = tl.load(dtr_ptr + page * s_dtr_pg + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
    dtn = tl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=is_new, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_DTB:
        dtn += tl.load(dtb_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32) if HAS_D else A
    if HAS_Z:
        zz = tl.load(z_ptr + tw[None, :] * s_z_t + h * s_z_h + offs_p[:, None], mask=ms[None, :], other=0.0)
    else:
        zz = A
    if KW > 0:  # the history's rows last: a layout change placed at their load would wait there
        X_hist = tl.load(xr_h + ring[:, None] * s_xr_r + offs_p[None, :], mask=is_hist[:, None], other=0.0)
        X_raw = (X_hist, pre_x, win_x)
    if not QUANT:
        sc = A
    return X_raw, dth, dtn, A, Dh, zz, sc


@triton.jit
def _late(x, live):
    """``x`` (``live`` is true on every row that gets here), as a value defined where this is called. The compiler
    places the shared-memory store that feeds a loaded tensor to a tensor-core product right after its load, where
    it waits for the load before any later load goes out; fed through this op, it is placed here instead, once the
    program's loads and its tile's copy have all gone out."""
    return tl.where(live, x, 0.0)


@triton.jit
def _conv_x(X_in, cv, is_new, tok, KW: tl.constexpr, BLOCK_T: tl.constexpr, GATHER: tl.constexpr):
    """The fused layer's x of a head over the sequence from :func:`_tma_gathers`' (history rows, conv loads,
    sequence columns): the history's rows and the window's conv outputs (``cv[5]``: the row's first token), with the
    sequence columns passed on for the window's store."""
    X_hist, pre_x, win_x = X_in
    X = tl.where(is_new[:, None], conv_outputs(cv, pre_x, tok - cv[5], KW, BLOCK_T, GATHER).to(X_hist.dtype), X_hist)
    return X, win_x


@triton.jit
def _tma_head(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
              last, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
              s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p, is_hist,
              is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_raw, dth, dtn, A, Dh, zz, sc, S_pre,
              cks_ptr, s_cks_pg, s_cks_h, key_pg, cv,
              P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr,
              HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
              READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
              IDX64: tl.constexpr, FLUSH: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr,
              NEXT: tl.constexpr, PRE_TILE: tl.constexpr, TMA_STORE: tl.constexpr, KW: tl.constexpr,
              BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, GATHER: tl.constexpr):
    """Head ``h0 + i`` of a :func:`_tma_heads` loop whose last head is ``h0 + last``; its gathers
    (``X_raw`` .. ``zz``) were issued one iteration earlier. Returns head ``i + 1``'s gathers, issued here
    (``NEXT``; else this head's again). ``cks_ptr``, ``s_cks_*``: the decode scales and their page and head
    strides (None: an unquantized checkpoint); ``key_pg``: the page's stochastic-rounding hash state (None: round
    to nearest). ``cv``, ``KW`` > 0: the fused layer's conv operands (:func:`_tma_gathers`); the head's x is computed
    here, once its tile's copy has gone out, and its channels' new conv window stored, ``BLOCK_L`` columns wide."""
    CK_TY: tl.constexpr = ck_ptr.dtype.element_ty
    QMODE: tl.constexpr = (1 if CK_TY == tl.int8 else 2) if cks_ptr is not None else 0
    SR: tl.constexpr = key_pg is not None
    h = h0 + i
    if PF_AHEAD > 0:  # clamped, not masked: no branch in the pipelined body (a repeat hits L2)
        ahead = tl.minimum(i + PF_AHEAD, last)
        prefetch_l2(ck_ptr + (ck_row0 + ahead * P).to(tl.int64) * BLOCK_N, PF_TILE)
    if NEXT:  # the next head's gathers go out now, into registers, and land while this head computes
        X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n = _tma_gathers(
            h0 + tl.minimum(i + 1, last), page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr,
            z_ptr, s_xr_pg, s_xr_h, s_xr_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t,
            s_z_h, ring, tok, tw, offs_p, is_hist, is_new, is_seq, ms, cv, cks_ptr, s_cks_pg, s_cks_h, HAS_D,
            HAS_DTB, HAS_Z, KW, BLOCK_L, BLOCK_T)
    else:
        X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n = X_raw, dth, dtn, A, Dh, zz, sc
    xr_h = xr_ptr + page * s_xr_pg + h * s_xr_h
    dtr_h = dtr_ptr + page * s_dtr_pg + h * s_dtr_h
    if QMODE > 0:  # the tile's decode scales' row (``sc``: loaded with the gathers, before its fold may rewrite them)
        cks_row = cks_ptr + page * s_cks_pg + h * s_cks_h + offs_p
    # the checkpoint tile: one TMA copy into shared memory
    if PRE_TILE:  # EARLY: one head per program, its tile copied by the caller before the Gram
        S0 = S_pre
    else:
        S0 = ck_desc.load([ck_row0 + i * P, 0])
    if KW > 0:  # the window's x rows: the conv's outputs of the head's channels (PRE_TILE: computed by the caller)
        if not PRE_TILE:
            X_raw = _conv_x(X_raw, cv, is_new, tok, KW, BLOCK_T, GATHER)
        X_raw, win_x = X_raw
    # Λ over the sequence, the causal factors F[k, s] = (B_k·C_s) dt_k e^{A (Λ_{c+s} - Λ_k)}
    if DT_SOFTPLUS:
        dtn = softplus(dtn)
    dtn = tl.where(is_new, dtn, 0.0)
    dtp = tl.where(is_hist, dth, dtn)
    lam = tl.cumsum(dtp, axis=0)
    lam_w = tl.sum(tl.where(diag, lam[:, None], 0.0), axis=0)
    F = tl.where(causal, Gm * dtp[:, None] * decay(A, lam_w[None, :] - lam[:, None]), 0.0)
    if HAS_D:  # D x_w rides on the diagonal k = w of the factor matrix
        F += tl.where(diag, Dh, 0.0)
    # y_s = e^{A Λ_w} S0 C_s + Σ_k F[k, s] x_k: the readout from shared memory, then the sequence,
    # both products into one accumulator (the decays scale the readout's columns)
    if QMODE > 0:  # the codes' product (exact: every code is exact in C's 16-bit dtype and in tf32), then the
        # rows' decode scales with the decays
        if READ16:
            Y = tl.dot(codes_as(S0, CwT.dtype, QMODE), CwT) * (sc[:, None] * decay(A, lam_w)[None, :])
        else:  # (the interpreter, which decodes e4m3 from its bits: CODES_FROM_BITS)
            Y = tl.dot(codes_as(S0, tl.float32, QMODE), CwT, input_precision=DOT_PREC) * (
                sc[:, None] * decay(A, lam_w)[None, :])
    elif READ16:  # 16-bit checkpoint in C's dtype: exact products, decays on the accumulator
        Y = tl.dot(S0, CwT) * decay(A, lam_w)[None, :]
    else:  # the decays on the accumulator too: C's operand is the same for every head of the loop
        Y = tl.dot(S0.to(tl.float32), CwT, input_precision=DOT_PREC) * decay(A, lam_w)[None, :]
    XT = tl.trans(X_raw.to(tl.float32))
    Y = tl.dot(XT, F, Y, input_precision=DOT_PREC)
    if HAS_Z:
        z = zz.to(tl.float32)
        Y *= z * tl.sigmoid(z)
    tl.store(out_ptr + tw[None, :] * s_o_t + h * s_o_h + offs_p[:, None], Y.to(out_ptr.dtype.element_ty),
             mask=ms[None, :])
    # append the window's rows to the ring (disjoint from the history: c + q <= R)
    tl.store(xr_h + ring[:, None] * s_xr_r + offs_p[None, :], X_raw, mask=is_new[:, None])
    if pt == 0:
        tl.store(dtr_h + ring * s_dtr_r, dtn, mask=is_new)
    if KW > 0:  # the head's x channels' new conv window (this program is their only reader and writer)
        store_window(cv, win_x, h * s_x_h + offs_p, KW, BLOCK_L)
    if fold:
        # flush row: S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h over the c history rows, stored over S0
        XTw, hi, lo_, carry = fold_weights(XT, dth, A, FOLD_SPLIT)
        ck_page = ck_ptr + page * s_ck_pg + pt * BLOCK_P * BLOCK_N
        mp = offs_p < P
        if SR:
            key_h = sr_head_key(key_pg, h)
        else:
            key_h = h  # unused
        if FOLD_N >= BLOCK_N:  # the whole tile from shared memory, B_h from the hoisted sequence rows
            if FLUSH == 1:
                Bf = Bh
            else:
                Bf = tl.where(is_hist[:, None], B_raw.to(tl.float32), 0.0)
            if QMODE > 0:
                S1 = fold_tile(dequant(S0, sc, QMODE), XTw, hi, lo_, carry, Bf, FOLD_SPLIT, FOLD_PREC)
                enc, scale = encode_scales(chunk_amax(S1, tl.zeros((BLOCK_P,), dtype=tl.float32)), QMODE)
                S1q = encode_tile(S1, enc, key_h, offs_p, tl.arange(0, BLOCK_N), QMODE, SR)
                tl.store(cks_row, scale)
            else:
                S1 = fold_tile(S0, XTw, hi, lo_, carry, Bf, FOLD_SPLIT, FOLD_PREC)
                if SR:
                    S1q = round_store_value(S1, sr_bits(key_h, offs_p, tl.arange(0, BLOCK_N)), CK_TY, True)
                else:
                    S1q = S1.to(CK_TY)
            if TMA_STORE:  # registers to shared memory, then one asynchronous bulk copy to the tile's place
                ck_desc.store([ck_row0 + i * P, 0], S1q)
            else:
                oc, ck, mc = chunk(ck_page, h, s_ck_h, 0, mp, N, BLOCK_N, BLOCK_P, BLOCK_N, IDX64)
                tl.store(ck, S1q)
        elif QMODE > 0:  # N chunk by N chunk, twice: every row's amax before any byte is stored
            fold_store_quant(ck_page, cks_row, h, s_ck_h, mp, offs_p, N, Br_base + ring * s_Br_r, is_hist, XTw, hi,
                             lo_, carry, sc, key_h, BLOCK_N, BLOCK_P, BLOCK_N, FOLD_N, True, FOLD_SPLIT, FOLD_PREC,
                             QMODE, SR, IDX64)
        elif SR:  # a 16-bit checkpoint, stochastically rounded, N chunk by N chunk
            b_hist = Br_base + ring * s_Br_r
            for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N, BLOCK_N, BLOCK_P, FOLD_N, IDX64)
                S1 = fold_chunk_value(load_chunk(ck, mc, True) * carry, oc, b_hist, is_hist, N, XTw, hi, lo_,
                                      FOLD_SPLIT, FOLD_PREC)
                tl.store(ck, round_store_value(S1, sr_bits(key_h, offs_p, oc), CK_TY, True))
        else:  # N chunk by N chunk (chunks re-read, L2 hits, so no full-tile accumulator is live)
            b_hist = Br_base + ring * s_Br_r
            for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N, BLOCK_N, BLOCK_P, FOLD_N, IDX64)
                fold_chunk(load_chunk(ck, mc, True) * carry, ck, mc, oc, b_hist, is_hist, N, XTw, hi, lo_,
                            ck_ptr, True, FOLD_SPLIT, FOLD_PREC)
    return X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n


@triton.jit
def _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
               nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
               s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p, is_hist,
               is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, cks_ptr, s_cks_pg, s_cks_h, key_pg,
               cv, P: tl.constexpr, HEADS: tl.constexpr,
               HSTAGES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr,
               HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
               READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
               IDX64: tl.constexpr, FLUSH: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr,
               DYN: tl.constexpr, FIRST: tl.constexpr, TMA_STORE: tl.constexpr, KW: tl.constexpr,
               BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, GATHER: tl.constexpr):
    """The TMA kernel's heads ``h0 .. h0 + HEADS - 1`` of one row in a software pipeline (``HSTAGES`` tile
    buffers: head i + 1's tile copy and, into registers, its gathers go out while head i computes).
    ``DYN``: the runtime count ``nh`` of heads instead, in a plain loop (one tile buffer; the interpreter
    takes no loop bound from a tensor).
    ``FLUSH``: 1 the row's checkpoint is rewritten (its history folded in), 0 only outputs and ring appends,
    2 the runtime ``flush`` decides.
    ``PF_AHEAD`` > 0: each iteration also asks L2 for the tile (``PF_TILE`` bytes) ``PF_AHEAD`` heads ahead, so
    more of the program's checkpoint is in flight than its shared-memory stages hold."""
    if FLUSH == 2:
        fold = flush
    else:
        fold = FLUSH == 1
    Bh = B_raw
    if FLUSH == 1:
        if FOLD_N >= BLOCK_N:  # the whole-tile fold reads B over the history from registers, loaded once
            Bh = tl.where(is_hist[:, None], B_raw.to(tl.float32), 0.0)
    # the first head's gathers; in the loop, head i + 1's are issued before head i computes (Triton's pipeliner
    # would issue them as cp.async at the end of the iteration and wait for them at the top of the next)
    if FIRST:  # EARLY: the first head's gathers and tile, issued by the caller before its Gram
        X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n, S_pre = first
    else:
        S_pre = B_raw
        X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n = _tma_gathers(
            h0, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
            s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p, is_hist,
            is_new, is_seq, ms, cv, cks_ptr, s_cks_pg, s_cks_h, HAS_D, HAS_DTB, HAS_Z, KW, BLOCK_L,
            BLOCK_T)
    if DYN:
        i = 0
        while i < nh:
            X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n = _tma_head(
                ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
                nh - 1, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h,
                s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_n, dth_n, dtn_n, A_n, D_n,
                zz_n, sc_n, S_pre, cks_ptr, s_cks_pg, s_cks_h, key_pg, cv, P, BLOCK_P, BLOCK_N, FOLD_N, HAS_D,
                HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC,
                FOLD_SPLIT, FOLD_PREC, IDX64, FLUSH, PF_AHEAD, PF_TILE, True, False, TMA_STORE, KW, BLOCK_L, BLOCK_T,
                GATHER)
            i += 1
    else:
        for i in tl.range(0, HEADS, num_stages=HSTAGES):
            X_n, dth_n, dtn_n, A_n, D_n, zz_n, sc_n = _tma_head(
                ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
                HEADS - 1, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h,
                s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_n, dth_n, dtn_n, A_n, D_n,
                zz_n, sc_n, S_pre, cks_ptr, s_cks_pg, s_cks_h, key_pg, cv, P, BLOCK_P, BLOCK_N, FOLD_N, HAS_D,
                HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC,
                FOLD_SPLIT, FOLD_PREC, IDX64, FLUSH, PF_AHEAD, PF_TILE, HEADS > 1, FIRST, TMA_STORE, KW, BLOCK_L,
                BLOCK_T, GATHER)



@triton.jit
def _tma_body(
    page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, S_in, cv,
    P: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, INTERP: tl.constexpr, PF_AHEAD: tl.constexpr, ROUTE: tl.constexpr,
    DYN: tl.constexpr, EARLY: tl.constexpr, FMODE: tl.constexpr, TILE_IN: tl.constexpr, TMA_STORE: tl.constexpr,
    KW: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, LATE: tl.constexpr, GATHER: tl.constexpr,
):
    """:func:`_tma_program` once the row's cursors are known: the sequence of ``BLOCK_K`` rows (history, then the
    window), the shared B rows and Gram, then the heads. ``FMODE``: the row's route when the caller branched on it
    (0 non-flush, 1 flush: that route's build only), else -1 (the heads decide, as ``ROUTE`` says). ``TILE_IN``
    (with ``EARLY``): the head's checkpoint tile is ``S_in``, copied by the caller. ``KW`` > 0 (the fused layer): the
    window's B rows and C (``Cw``: then the conv's loads of C's channels) are conv outputs, from ``cv``, computed
    once the program's loads and its tile's copy have gone out (one round trip for all three conv stages)."""
    (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
     dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t,
     s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r, cks_ptr, seed_ptr, layer, s_cks_pg, s_cks_h, ct) = rt
    (xbc_ptr, s_xbc_t, win_ptr, s_win_pg, s_win_c, shift_ptr, rsh_ptr, s_rsh, cw_ptr, s_cw_d, s_cw_k, cb_ptr, silu,
     width, cnt_ptr, s_cnt_pg, XB, GN) = ct
    # what the tensors' dtypes decide: absent optional inputs (None), 16-bit products on the GPU (exact B·C and, with a
    # 16-bit checkpoint in C's dtype, the readout), the fold's tf32 split (B_h exact in tf32), the precisions
    HAS_D: tl.constexpr = D_ptr is not None
    HAS_DTB: tl.constexpr = dtb_ptr is not None
    HAS_Z: tl.constexpr = z_ptr is not None
    B_TY: tl.constexpr = B_ptr.dtype.element_ty
    C_TY: tl.constexpr = C_ptr.dtype.element_ty
    CK_TY: tl.constexpr = ck_ptr.dtype.element_ty
    GRAM16: tl.constexpr = (not INTERP) and B_TY == C_TY and B_TY.primitive_bitwidth == 16
    QUANT: tl.constexpr = cks_ptr is not None  # int8 / e4m3 codes with decode scales (pages, H, P) fp32
    # a 16-bit readout: a 16-bit checkpoint in C's dtype, or 8-bit codes (exact in C's 16-bit dtype)
    READ16: tl.constexpr = (not INTERP) and C_TY.primitive_bitwidth == 16 and (CK_TY == C_TY or QUANT)
    FOLD_SPLIT: tl.constexpr = (not INTERP) and Br_ptr.dtype.element_ty.primitive_bitwidth == 16
    DOT_PREC: tl.constexpr = "ieee" if INTERP else "tf32"
    FOLD_PREC: tl.constexpr = "ieee" if INTERP else "tf32x3"
    PF_TILE: tl.constexpr = BLOCK_P * BLOCK_N * (CK_TY.primitive_bitwidth // 8)  # one head's tile, in bytes
    kk = tl.arange(0, BLOCK_K)
    is_hist = kk < c
    is_new = (kk >= c) & (kk < c + q)
    is_seq = kk < c + q
    ring = wrap(rs + kk, R)  # ring row of sequence position k (history and appended alike)
    tok = lo + tl.maximum(kk - c, 0)
    if INTERP:
        ring = ring.to(tl.int64)
        tok = tok.to(tl.int64)
    Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
    # EARLY (one head per program): the head's gathers need only the cursors, so they go out before B's rows
    # instead of after the Gram, and its tile copy too, which then overlaps the gathers' round trip
    if KW > 0:  # B and C are xBC's B and C channels (group stride N, from channel XB and XB + GN): the conv's loads
        # and the new windows' columns go out first, the history's B rows after the head's gathers
        chB = XB + g * s_B_g + offs_n
        pre_B = conv_loads(cv, chB, KW, BLOCK_T)
        pre_C = conv_loads(cv, chB + GN, KW, BLOCK_T)
        win_B = window_loads(cv, chB, BLOCK_L, KW)
        win_C = window_loads(cv, chB + GN, BLOCK_L, KW)
    if EARLY:
        X0, dth0, dtn0, A0, D0, zz0, sc0 = _tma_gathers(
            h0, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
            s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p,
            is_hist, is_new, is_seq, ms, cv, cks_ptr, s_cks_pg, s_cks_h, HAS_D, HAS_DTB, HAS_Z, KW, BLOCK_L,
            BLOCK_T)
    if KW > 0:
        B_hist = tl.load(Br_base + ring[:, None] * s_Br_r + offs_n[None, :], mask=is_hist[:, None], other=0.0)
        B_raw = B_hist
    else:
        b_rows = tl.multiple_of(tl.where(is_hist, Br_base + ring * s_Br_r, B_ptr + g * s_B_g + tok * s_B_t), 16)
        B_raw = tl.load(b_rows[:, None] + offs_n[None, :], mask=is_seq[:, None], other=0.0)  # (K, BLOCK_N)
    if TILE_IN:
        S_pre = S_in
    elif EARLY:
        S_pre = ck_desc.load([ck_row0, 0])
    else:
        S_pre = B_raw  # unused: the heads load their own tiles
    if LATE and KW == 0:  # the loaded operands as values defined past their loads and (EARLY) the tile's copy
        B_raw = _late(B_raw, q > 0)
        Cw = _late(Cw, q > 0)
        if EARLY:
            X0 = _late(X0, q > 0)
    if KW > 0:  # the conv outputs of the group's B and C channels (and EARLY, the first head's x), once every load
        # and the tile's copy are out; the history's rows pass through _late, so their layout change (to the conv
        # gather's) is placed here, not at their loads
        B_hist = _late(B_hist, q > 0)
        B_new = conv_outputs(cv, pre_B, tok - lo, KW, BLOCK_T, GATHER)
        B_raw = tl.where(is_new[:, None], B_new.to(B_hist.dtype), B_hist)
        Cw = tl.where(ms[:, None], conv_outputs(cv, pre_C, ss, KW, BLOCK_T, GATHER, BLOCK_S != BLOCK_T), 0.0)
        Cw = Cw.to(C_ptr.dtype.element_ty)
        if EARLY:
            X0 = (_late(X0[0], q > 0), X0[1], X0[2])
            X0 = _conv_x(X0, cv, is_new, tok, KW, BLOCK_T, GATHER)
    if EARLY:
        first = (X0, dth0, dtn0, A0, D0, zz0, sc0, S_pre)
    else:
        first = (B_raw, B_raw, B_raw, B_raw, B_raw, B_raw, B_raw, B_raw)  # unused: the heads load their own
    if GRAM16:  # 16-bit B and C: exact products, fp32 accumulation
        Gm = tl.dot(B_raw, tl.trans(Cw))
    else:
        Gm = tl.dot(B_raw.to(tl.float32), tl.trans(Cw.to(tl.float32)), input_precision=DOT_PREC)
    if (pt == 0) & (h0 % HPG == 0):  # the group's first program appends the window's B rows to the ring
        tl.store(Br_base + ring[:, None] * s_Br_r + offs_n[None, :], B_raw, mask=is_new[:, None])
    if KW > 0:  # every program of the row's group reads its B and C channels' old window columns; the last of them
        # to arrive (its tile copy in flight meanwhile) stores their new window
        if arrive(cnt_ptr + page * s_cnt_pg + g, nh, HPG * (P // BLOCK_P)):
            store_window(cv, win_B, chB, KW, BLOCK_L)
            store_window(cv, win_C, chB + GN, KW, BLOCK_L)
    pos = c + ss
    causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
    diag = (kk[:, None] == pos[None, :]) & ms[None, :]
    CwT = tl.trans(Cw) if READ16 else tl.trans(Cw.to(tl.float32))  # the readout's operand, for every head
    if seed_ptr is not None:  # stochastic rounding of the flush writes: the page's hash state
        key_pg = sr_page_key(seed_ptr, layer, page)
    else:
        key_pg = seed_ptr  # None
    flush = c + q > window
    # the fold mode as a constant where it is known at compile time (one route's rows; one head deciding inside
    # its loop), else one call per route so each loop body holds only its own values (a static loop over the
    # modes compiles to a different, larger build)
    if FMODE >= 0:  # the caller branched on the route: this build holds that route only
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, cks_ptr, s_cks_pg, s_cks_h,
                   key_pg, cv, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, INTERP, FMODE, PF_AHEAD, PF_TILE, DYN, EARLY, TMA_STORE, KW, BLOCK_L, BLOCK_T, GATHER)
    elif ROUTE != 0 or (HEADS == 1 and not DYN):
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, cks_ptr, s_cks_pg, s_cks_h,
                   key_pg, cv, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, INTERP, (ROUTE - 1) if (HEADS > 1 or DYN) else 2, PF_AHEAD, PF_TILE, DYN, EARLY,
                   TMA_STORE, KW, BLOCK_L, BLOCK_T, GATHER)
    elif flush:
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, cks_ptr, s_cks_pg, s_cks_h,
                   key_pg, cv, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, INTERP, 1, PF_AHEAD, PF_TILE, DYN, EARLY, TMA_STORE, KW, BLOCK_L, BLOCK_T, GATHER)
    else:
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, cks_ptr, s_cks_pg, s_cks_h,
                   key_pg, cv, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, INTERP, 0, PF_AHEAD, PF_TILE, DYN, EARLY, TMA_STORE, KW, BLOCK_L, BLOCK_T, GATHER)


@triton.jit
def _tma_program(
    pt, h0_32, nh, row, rt,
    P: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_KN: tl.constexpr,
    BLOCK_S: tl.constexpr, DT_SOFTPLUS: tl.constexpr, INTERP: tl.constexpr, PF_CK: tl.constexpr, PF_X: tl.constexpr,
    PF_B: tl.constexpr, PF_DT: tl.constexpr, PF_AHEAD: tl.constexpr, ROUTE: tl.constexpr, DYN: tl.constexpr,
    EARLY: tl.constexpr, GDC: tl.constexpr, TMA_STORE: tl.constexpr, KW: tl.constexpr, BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr, LATE: tl.constexpr, GATHER: tl.constexpr,
):
    """One program's work of the TMA verify kernel: row ``row``, P tile ``pt``, the ``HEADS`` heads of one group
    from ``h0_32`` (``DYN``: ``nh`` of them, counted at run time); ``ROUTE`` 0 serves every row, 1 only non-flush
    rows, 2 only flush rows (the others exit after their cursor). With row cursors (``rc_ptr``) the row's cursors
    come from them, loaded beside the page id, instead of from its page after it. Non-flush rows take a
    ``BLOCK_KN``-row sequence tile where that is shorter than ``BLOCK_K`` (:func:`_tma_body`). ``GDC``
    (``pdl=True``): 1 the program waits for the kernel before after its cursors and L2 prefetches, 2 also after
    its tile's TMA copy (EARLY), then lets the next kernel launch; 0 no wait. ``KW`` > 0: the fused layer (x, B and
    C are the conv outputs of xBC's channels, computed in the program; ``BLOCK_L`` columns of new conv window)."""
    (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
     dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t,
     s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r, cks_ptr, seed_ptr, layer, s_cks_pg, s_cks_h, ct) = rt
    (xbc_ptr, s_xbc_t, win_ptr, s_win_pg, s_win_c, shift_ptr, rsh_ptr, s_rsh, cw_ptr, s_cw_d, s_cw_k, cb_ptr, silu,
     width, cnt_ptr, s_cnt_pg, XB, GN) = ct
    ROWCUR: tl.constexpr = rc_ptr is not None
    page32 = tl.load(page_ptr + row)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if ROWCUR:  # the row's cursors, gathered once per step: in the page id's round trip, not one after it
        c_row, rs_row = safe_cursors(tl.load(rc_ptr + s_rc_k + row * s_rc_r), tl.load(rc_ptr + row * s_rc_r),
                                     window, R)
    if KW > 0:  # the row's conv shift: gathered with the step (beside the page id), else its page's after it
        shift = tl.load(rsh_ptr + row * s_rsh) if rsh_ptr is not None else tl.load(shift_ptr + page32.to(tl.int64))
    keep = (page32 != 0) & (q > 0)
    if ROWCUR:  # clamped cursors are never negative (W, R >= 1): the test only keeps the compiler from sinking
        # their loads past this branch (behind the page id's round trip, which is what they are here to avoid)
        keep = keep & ((c_row | rs_row) >= 0)
    if ROUTE != 0:  # one route's rows only: the other's exit after their cursor (without ROWCUR, one more round trip)
        if ROWCUR:
            c_route = c_row
        else:
            c_route = tl.minimum(tl.maximum(tl.load(nc_ptr + page32.to(tl.int64), mask=keep, other=0), 0), window)
        keep = keep & ((c_route + q > window) == (ROUTE == 2))
    if keep:
        ck_row0 = (page32 * H + h0_32) * P + pt * BLOCK_P  # the first head's tile row in the (pages * H * P, N) view
        page = page32.to(tl.int64)
        h0 = h0_32.to(tl.int64)
        g = h0 // HPG
        # L2 prefetches (bytes; 0 = off): the first head's tile and x ring, the group's B ring stream into L2
        # while the cursors and gathers make their dependent round trips
        if PF_CK:
            prefetch_l2(ck_ptr + ck_row0.to(tl.int64) * BLOCK_N, PF_CK)
        if PF_X:
            prefetch_l2(xr_ptr + page * s_xr_pg + h0 * s_xr_h, PF_X)
        if PF_B:
            prefetch_l2(Br_ptr + page * s_Br_pg + g * s_Br_g, PF_B)
        if PF_DT:
            prefetch_l2(dtr_ptr + page * s_dtr_pg + h0 * s_dtr_h, PF_DT)
        # GDC (a programmatic dependent, pdl=True): the page id, cursors and the prefetches above went out while
        # the kernel before ran, and with GDC 2 (EARLY) the head's tile copy too; the step's inputs (x, B, C,
        # dt, z) only after that kernel has ended
        TILE_IN: tl.constexpr = GDC == 2 and EARLY
        if TILE_IN:
            S_in = ck_desc.load([ck_row0, 0])
        else:
            S_in = page  # unused
        if GDC:
            pdl_wait()
        offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        ss = tl.arange(0, BLOCK_S)
        ms = ss < q
        tw = lo + ss
        if INTERP:  # the interpreter checks every int32 vector op for overflow: int64 skips it
            offs_p = offs_p.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
            tw = tw.to(tl.int64)
        # what the heads share: C over the window, the cursors, the sequence's B rows and the Gram B·Cᵀ
        if KW > 0:  # C is the conv's outputs of the group's C channels, computed in _tma_body
            cv = conv_operands(xbc_ptr, s_xbc_t, win_ptr, page, s_win_pg, s_win_c, shift, lo, q, width, cw_ptr, s_cw_d,
                               s_cw_k, cb_ptr, silu, KW)
            Cw = page  # unused
        else:
            cv = page  # unused
            Cw = tl.load(C_ptr + tw[:, None] * s_C_t + g * s_C_g + offs_n[None, :], mask=ms[:, None], other=0.0)
        if ROWCUR:
            c = c_row
            rs = rs_row
        else:
            c, rs = safe_cursors(tl.load(nc_ptr + page), tl.load(rs_ptr + page), window, R)
        # a non-flush row's sequence is at most W rows (c + q <= W), so its build may take a tile of BLOCK_KN rows,
        # not the ring's BLOCK_K: each route its own build (one launch for both routes: a branch on the route)
        if ROUTE == 0 and BLOCK_KN < BLOCK_K:
            if c + q > window:
                _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, S_in, cv,
                          P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, DT_SOFTPLUS, INTERP,
                          PF_AHEAD, ROUTE, DYN, EARLY, 1, TILE_IN, TMA_STORE, KW, BLOCK_L, BLOCK_T, LATE, GATHER)
            else:
                _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, S_in, cv,
                          P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_KN, BLOCK_S, DT_SOFTPLUS, INTERP,
                          PF_AHEAD, ROUTE, DYN, EARLY, 0, TILE_IN, TMA_STORE, KW, BLOCK_L, BLOCK_T, LATE, GATHER)
        else:  # one route's rows (the split non-flush launch: the short tile), or one build for both
            BK: tl.constexpr = BLOCK_KN if ROUTE == 1 else BLOCK_K
            _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, S_in, cv,
                      P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BK, BLOCK_S, DT_SOFTPLUS, INTERP, PF_AHEAD,
                      ROUTE, DYN, EARLY, -1, TILE_IN, TMA_STORE, KW, BLOCK_L, BLOCK_T, LATE, GATHER)


@triton.jit(do_not_specialize=["layer"])  # layer 1 must stay a runtime int (the SR hash casts it)
def verify_tma_kernel(
    rows,
    ck_desc, ck_ptr, cks_ptr, seed_ptr, layer, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, H, N,
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
    s_rc_k, s_rc_r,
    xbc_ptr, win_ptr, shift_ptr, rsh_ptr, cw_ptr, cb_ptr, cnt_ptr, silu, width, XB, GN,
    s_xbc_t, s_win_pg, s_win_c, s_rsh, s_cw_d, s_cw_k, s_cnt_pg,
    P: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_KN: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_ROWS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    INTERP: tl.constexpr, PF_CK: tl.constexpr, PF_X: tl.constexpr, PF_B: tl.constexpr, PF_DT: tl.constexpr,
    PF_AHEAD: tl.constexpr, ROUTE: tl.constexpr, EARLY: tl.constexpr, GDC: tl.constexpr, TMA_STORE: tl.constexpr,
    KW: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, LATE: tl.constexpr, GATHER: tl.constexpr,
):
    """The TMA verify kernel. ``ROUTE`` 0: one program per (row, ``HEADS`` heads, P tile), both routes. ``ROUTE`` 1 / 2
    (the split launches): a persistent grid over the non-flush / flush rows, each program streaming an equal,
    contiguous share of the route's (row, P tile, head) items; on the GPU the two launches are programmatic
    dependents (the second starts as the first's programs exit, and ends only after the first).

    ``KW`` > 0: the fused layer (:mod:`ssmstate.ops.triton.conv_verify`). ``x``, ``B`` and ``C`` are then views of
    ``xBC``'s channels (from 0, ``XB`` and ``XB + GN``), the step's conv inputs, and every program computes the conv
    outputs it reads (its head's x channels, its group's B and C) from them and the page's conv window ``win_ptr``
    (``KW`` columns of history ending ``shift`` columns before its right end, ``width`` columns), with ``cw_ptr`` /
    ``cb_ptr`` (weight, bias or None) and the activation (``silu``); it stores its head's x channels' new window,
    and the last program of a row's group to arrive at ``cnt_ptr`` (zero between launches) the group's B and C
    channels' (each program reads them: none may store them while another has still to read). ``GATHER``: how
    the conv outputs reach their sequence rows (:func:`~ssmstate.ops.triton.conv.conv_outputs`)."""
    NPT: tl.constexpr = P // BLOCK_P
    PDL: tl.constexpr = 0 if INTERP else ROUTE
    # what every program passes on but the constants (a tuple's constants would lose their constexpr type)
    rt = (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
          dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r,
          s_Br_pg, s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
          s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r, cks_ptr, seed_ptr, layer, s_cks_pg, s_cks_h,
          (xbc_ptr, s_xbc_t, win_ptr, s_win_pg, s_win_c, shift_ptr, rsh_ptr, s_rsh, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
           silu, width, cnt_ptr, s_cnt_pg, XB, GN))
    if PDL == 1 and not GDC:  # the first of two launches: the second may start as soon as SMs free up (GPU
        # only; with GDC each program lets it start once past its wait, in _tma_program)
        tl.extra.cuda.gdc_launch_dependents()
    if ROUTE == 0:  # one program per (row, head block, P tile)
        pid = tl.program_id(0)
        _tma_program(pid % NPT, (pid // NPT) * HEADS, HEADS, tl.program_id(1), rt,
                     P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_KN, BLOCK_S, DT_SOFTPLUS, INTERP,
                     PF_CK, PF_X, PF_B, PF_DT, PF_AHEAD, ROUTE, False, EARLY, GDC, TMA_STORE, KW, BLOCK_L, BLOCK_T,
                     LATE, GATHER)
    else:
        # a persistent grid over the route's rows, ranked on the device: an empty route costs one pass over the
        # cursors. Route item x is head x % per_row of the route's row x // per_row, every head of unit cost, so
        # a share needs one rank lookup per segment (a run of one group's heads of one row)
        ROWCUR: tl.constexpr = rc_ptr is not None
        ridx = tl.arange(0, BLOCK_ROWS)
        mr = ridx < rows
        pg = tl.load(page_ptr + ridx, mask=mr, other=0)
        qv = tl.load(cu_ptr + ridx + 1, mask=mr, other=0) - tl.load(cu_ptr + ridx, mask=mr, other=0)
        live = mr & (pg != 0) & (qv > 0)
        if ROWCUR:
            cv = tl.load(rc_ptr + s_rc_k + ridx * s_rc_r, mask=live, other=0)
        else:
            cv = tl.load(nc_ptr + pg.to(tl.int64), mask=live, other=0)
        cv = tl.minimum(tl.maximum(cv, 0), window)  # as _tma_program reads it (safe_cursors)
        sel = live & ((cv + qv > window) == (ROUTE == 2))
        one = sel.to(tl.int32)
        per_row = NPT * H
        pid = tl.program_id(0).to(tl.int64)
        rank = tl.where(sel, tl.cumsum(one, axis=0) - one, -1)  # the route's rows in order; -1 the others
        total = tl.sum(one, axis=0).to(tl.int64) * per_row
        x = pid * total // tl.num_programs(0)
        end = (pid + 1) * total // tl.num_programs(0)
        k = x // per_row
        r = tl.min(tl.where(rank == k, ridx, BLOCK_ROWS), axis=0)
        while x < end:  # a while loop: the interpreter's range() takes no tensor bounds
            j = x - k * per_row
            pt = (j // H).to(tl.int32)
            h = (j % H).to(tl.int32)
            nh = tl.minimum(end - x, HPG - h % HPG).to(tl.int32)  # to the group's (row's) end or the share's
            _tma_program(pt, h, nh, r, rt,
                         P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_KN, BLOCK_S, DT_SOFTPLUS,
                         INTERP, PF_CK, PF_X, PF_B, PF_DT, PF_AHEAD, ROUTE, True, EARLY, GDC, TMA_STORE, KW,
                         BLOCK_L, BLOCK_T, LATE, GATHER)
            x += nh
            k = x // per_row
            r = tl.min(tl.where(rank == k, ridx, BLOCK_ROWS), axis=0)  # the same row, or the route's next
    if PDL == 2:  # the second launch ends only once the first has (its rows are disjoint: nothing to wait for
        # before), so what follows both in the stream sees both launches' writes
        tl.extra.cuda.gdc_wait()
    if GDC:  # programs that met no row of theirs (or a persistent one's last) end after the kernel before too
        pdl_wait()
