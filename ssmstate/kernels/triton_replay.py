"""Triton ReplaySSM kernels: verify (both routes), commit, materialize, on the shared page layout.

Each public function has the signature of its PyTorch twin in
:mod:`ssmstate.kernels.reference` (the contract and the ground truth), plus an
optional trailing ``config`` to override the launch heuristic.

Verify, one program per (row, head, P tile), streams the checkpoint tile
``S0`` (P x N) once (its load is issued first: it needs only the page) and
never forms an intermediate state:

* the row's sequence is ``c`` history rows from the ring followed by the ``q``
  new tokens (``c + q <= R``), indexed ``k``; every ring row, history or
  appended, lives at ``(ring_start + k) % R``;
* outputs, on both routes: ``Y = X_seqᵀ F + (S0 Cᵀ) * exp(A Λ_w)`` with the
  causal factor matrix ``F[k, s] = (B_k·C_s) dt_k exp(A (Λ_{c+s} - Λ_k))``
  (the flush route's "outputs from S1 + new rows" is the same quantity);
* the flush decision ``c + q > W`` is taken per row on the device from the
  cursors; a flush row also folds the history into the checkpoint
  (``S1 = e^{AΛ_h} S0 + (X_h w)ᵀ B_h``, N chunk by N chunk) and stores it, so
  one launch serves a mixed batch and nothing syncs.

All math is fp32 (loads are upcast first, which also keeps the CPU
interpreter exact); on the GPU the small products use tensor cores (exact
16-bit products for B·C, tf32 for the output terms, 3xTF32 for the stored
fold). Variants of the state readout and fold (config keys ``READOUT``,
``FOLD``; see :data:`VERIFY_VARIANT`) trade tensor-core dots on the state tile
for plain fp32 FMAs on its register layout, with the same results up to
rounding. Padding rows (page 0) exit at once and write nothing. Tensors are read
and written contiguously along P and N (stride 1 there, as every cache tensor
and the manager's inputs are).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

Tensor = torch.Tensor

#: Triton runs kernels on CPU tensors only through its interpreter, chosen when
#: the kernels are decorated (module import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


# -- shared device helpers ----------------------------------------------------------------


@triton.jit
def _softplus(v):
    # softplus with threshold 20, as every Mamba2 kernel; exp(v) below -15 keeps precision.
    return tl.where(v > 20.0, v, tl.where(v < -15.0, tl.exp(v), tl.log(1.0 + tl.exp(v))))


@triton.jit
def _fold(S, XT, Bseq, dtp, is_hist, A, PREC: tl.constexpr):
    """``e^{AΛ} S + Σ_k dt_k e^{A(Λ - Λ_k)} x_k B_kᵀ`` over the rows where ``is_hist``."""
    dth = tl.where(is_hist, dtp, 0.0)
    lam = tl.cumsum(dth, axis=0)
    tot = tl.sum(dth, axis=0)
    w = tl.where(is_hist, dth * tl.exp(tl.minimum(A * (tot - lam), 0.0)), 0.0)
    upd = tl.dot(XT * w[None, :], Bseq, input_precision=PREC)
    return S * tl.exp(tl.minimum(A * tot, 0.0)) + upd


@triton.jit
def _readout_fma(acc, S, C_ptr, lo, q, s_C_t, g, s_C_g, offs_n, mn, ss,
                 S_LOOP: tl.constexpr, IDX64: tl.constexpr):
    """``acc[:, s] += S · C_s`` over ``S``'s columns ``offs_n``, one fp32 multiply + row sum per token."""
    for s in tl.static_range(S_LOOP):
        ts = lo + s
        if IDX64:
            ts = ts.to(tl.int64)
        cs = tl.load(C_ptr + ts * s_C_t + g * s_C_g + offs_n, mask=mn & (s < q), other=0.0).to(tl.float32)
        ys = tl.sum(S * cs[None, :], axis=1)
        acc += tl.where(ss[None, :] == s, ys[:, None], 0.0)
    return acc


@triton.jit
def _rank1_fold(S, lam_k, k, c, rs, R, tot, A, dtr_base, s_dtr_r, xr_base, s_xr_r, offs_p, mp,
                Br_base, s_Br_r, offs_n, mn, IDX64: tl.constexpr):
    """History row ``k`` (masked past ``c``) of the fold: ``S += dt_k e^{A(Λ - Λ_k)} x_k B_kᵀ``."""
    rk = (rs + k) % R
    if IDX64:
        rk = rk.to(tl.int64)
    dk = tl.where(k < c, tl.load(dtr_base + rk * s_dtr_r), 0.0)
    lam_k += dk
    wk = dk * tl.exp(tl.minimum(A * (tot - lam_k), 0.0))
    xk = tl.load(xr_base + rk * s_xr_r + offs_p, mask=mp, other=0.0).to(tl.float32)
    bk = tl.load(Br_base + rk * s_Br_r + offs_n, mask=mn, other=0.0).to(tl.float32)
    return S + (xk * wk)[:, None] * bk[None, :], lam_k


# -- verify -------------------------------------------------------------------------------


@triton.jit
def _replay_verify_kernel(
    ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, P, N,
    s_ck_pg, s_ck_h, s_ck_p,
    s_xr_pg, s_xr_h, s_xr_r,
    s_Br_pg, s_Br_g, s_Br_r,
    s_dtr_pg, s_dtr_h, s_dtr_r,
    s_x_t, s_x_h,
    s_dt_t, s_dt_h,
    s_B_t, s_B_g,
    s_C_t, s_C_g,
    s_z_t, s_z_h,
    s_o_t, s_o_h,
    NPT: tl.constexpr, HPG: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, FOLD_N: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PREC: tl.constexpr, FOLD_PREC: tl.constexpr, IDX64: tl.constexpr, NATIVE_G: tl.constexpr,
    READOUT_FMA: tl.constexpr, READOUT_CHUNK: tl.constexpr, READOUT_16: tl.constexpr, BLOCK_NC: tl.constexpr, FOLD_FMA: tl.constexpr,
    S_LOOP: tl.constexpr,
):
    # One program: one row, one head, one tile of BLOCK_P head-dim rows.
    pid = tl.program_id(0)
    row = tl.program_id(1)
    pt = pid % NPT
    h = (pid // NPT).to(tl.int64)
    g = h // HPG
    page = tl.load(page_ptr + row).to(tl.int64)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if (page != 0) & (q > 0):
        offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        if IDX64:  # the interpreter checks every int32 vector op for overflow: int64 skips it
            offs_p = offs_p.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
        mp = offs_p < P
        mn = offs_n < N
        mS = mp[:, None] & mn[None, :]
        # The checkpoint tile is most of the traffic and needs only the page: issue it first.
        ck = ck_ptr + page * s_ck_pg + h * s_ck_h + offs_p[:, None] * s_ck_p + offs_n[None, :]
        if not READOUT_CHUNK:
            S = tl.load(ck, mask=mS, other=0.0).to(tl.float32)
        c = tl.load(nc_ptr + page)
        rs = tl.load(rs_ptr + page)
        A = tl.load(A_ptr + h).to(tl.float32)
        flush = c + q > window

        # the row's sequence: c history rows from the ring, then the q window tokens
        kk = tl.arange(0, BLOCK_K)
        is_hist = kk < c
        is_new = (kk >= c) & (kk < c + q)
        ring = (rs + kk) % R  # ring row of sequence position k (history and appended alike)
        tok = lo + tl.maximum(kk - c, 0)
        ss = tl.arange(0, BLOCK_S)
        ms = ss < q
        tw = lo + ss
        if IDX64:
            ring = ring.to(tl.int64)
            tok = tok.to(tl.int64)
            tw = tw.to(tl.int64)
        pos = c + ss  # sequence position of window token s

        # One gather per sequence tile: row k comes from the ring (k < c) or the inputs (c <= k < c + q).
        is_seq = kk < c + q
        Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
        b_rows = tl.where(is_hist, Br_base + ring * s_Br_r, B_ptr + g * s_B_g + tok * s_B_t)
        mB = is_seq[:, None] & mn[None, :]
        B_raw = tl.load(b_rows[:, None] + offs_n[None, :], mask=mB, other=0.0)  # (BLOCK_K, BLOCK_N)
        Cw_raw = tl.load(C_ptr + tw[:, None] * s_C_t + g * s_C_g + offs_n[None, :],
                         mask=ms[:, None] & mn[None, :], other=0.0)
        CT = tl.trans(Cw_raw.to(tl.float32))
        # G[k, s] = B_k . C_s
        if NATIVE_G:  # 16-bit B and C: exact products, fp32 accumulation
            G = tl.dot(B_raw, tl.trans(Cw_raw))
        else:
            G = tl.dot(B_raw.to(tl.float32), CT, input_precision=DOT_PREC)
        if (pt == 0) & (h % HPG == 0):  # append the window's B rows to the ring, once per group
            tl.store(Br_base + ring[:, None] * s_Br_r + offs_n[None, :], B_raw,
                     mask=is_new[:, None] & mn[None, :])
        causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
        mo = mp[:, None] & ms[None, :]

        # processed dt over the sequence
        dth = tl.load(dtr_ptr + page * s_dtr_pg + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
        dtn = tl.load(dt_ptr + tok * s_dt_t + h * s_dt_h, mask=is_new, other=0.0).to(tl.float32)
        if HAS_DTB:
            dtn += tl.load(dtb_ptr + h).to(tl.float32)
        if DT_SOFTPLUS:
            dtn = _softplus(dtn)
        dtn = tl.where(is_new, dtn, 0.0)
        dtp = tl.where(is_hist, dth, dtn)
        # x over the sequence, transposed: (BLOCK_P, BLOCK_K)
        xr_base = xr_ptr + page * s_xr_pg + h * s_xr_h
        x_rows = tl.where(is_hist, xr_base + ring * s_xr_r, x_ptr + h * s_x_h + tok * s_x_t)
        X_raw = tl.load(x_rows[None, :] + offs_p[:, None], mask=mp[:, None] & is_seq[None, :], other=0.0)
        XT = X_raw.to(tl.float32)

        # y_s = e^{A Λ_w} S0 C_s + Σ_{k<=w} dt_k e^{A (Λ_w - Λ_k)} (B_k.C_s) x_k, w = c + s.
        # Both routes give these outputs; a flush row also stores the folded history.
        lam = tl.cumsum(dtp, axis=0)
        lam_w = tl.sum(tl.where(kk[:, None] == pos[None, :], lam[:, None], 0.0), axis=0)
        E = tl.exp(tl.minimum(A * (lam_w[None, :] - lam[:, None]), 0.0))
        F = tl.where(causal, G * dtp[:, None] * E, 0.0)
        if HAS_D:  # D x_s rides on the diagonal k = c + s of the factor matrix
            F += tl.where((kk[:, None] == pos[None, :]) & ms[None, :], tl.load(D_ptr + h).to(tl.float32), 0.0)
        Y = tl.dot(XT, F, input_precision=DOT_PREC)
        dec = tl.exp(tl.minimum(A * lam_w, 0.0))
        if READOUT_CHUNK:
            # S0 streamed in BLOCK_NC-column chunks (a loop the compiler can pipeline; one chunk
            # live at a time): fp32 readout, and on a flush row the chunk's fold and store.
            acc = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
            tot = tl.sum(dth, axis=0)
            carry = tl.exp(tl.minimum(A * tot, 0.0))
            XTw = XT * (dth * tl.exp(tl.minimum(A * (tot - tl.cumsum(dth, axis=0)), 0.0)))[None, :]
            dtr_base = dtr_ptr + page * s_dtr_pg + h * s_dtr_h
            ck_row = ck_ptr + page * s_ck_pg + h * s_ck_h + offs_p[:, None] * s_ck_p
            for n0 in range(0, BLOCK_N, BLOCK_NC):
                oc = n0 + tl.arange(0, BLOCK_NC)
                if IDX64:
                    oc = oc.to(tl.int64)
                mnc = oc < N
                mc = mp[:, None] & mnc[None, :]
                Sn = tl.load(ck_row + oc[None, :], mask=mc, other=0.0).to(tl.float32)
                acc = _readout_fma(acc, Sn, C_ptr, lo, q, s_C_t, g, s_C_g, oc, mnc, ss, S_LOOP, IDX64)
                if flush:
                    if FOLD_FMA:
                        Sn = Sn * carry
                        lam_k = A * 0.0
                        if IDX64:  # the interpreter cannot loop to a loaded bound: BLOCK_K masked steps
                            for k in tl.static_range(BLOCK_K):
                                Sn, lam_k = _rank1_fold(Sn, lam_k, k, c, rs, R, tot, A, dtr_base, s_dtr_r, xr_base,
                                                        s_xr_r, offs_p, mp, Br_base, s_Br_r, oc, mnc, IDX64)
                        else:
                            for k in range(0, c):
                                Sn, lam_k = _rank1_fold(Sn, lam_k, k, c, rs, R, tot, A, dtr_base, s_dtr_r, xr_base,
                                                        s_xr_r, offs_p, mp, Br_base, s_Br_r, oc, mnc, IDX64)
                    else:
                        Bc = tl.load(Br_base + ring[:, None] * s_Br_r + oc[None, :],
                                     mask=is_hist[:, None] & mnc[None, :], other=0.0).to(tl.float32)
                        Sn = Sn * carry + tl.dot(XTw, Bc, input_precision=FOLD_PREC)
                    tl.store(ck_row + oc[None, :], Sn.to(ck_ptr.dtype.element_ty), mask=mc)
            Y += acc * dec[None, :]
        elif READOUT_FMA:
            # S0 C_s as fp32 multiply + row reduction per window token, on S0's own register
            # layout (no dot operand conversion of the tile); C_s rows are L1/L2 hits.
            acc = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
            acc = _readout_fma(acc, S, C_ptr, lo, q, s_C_t, g, s_C_g, offs_n, mn, ss, S_LOOP, IDX64)
            Y += acc * dec[None, :]
        elif READOUT_16 and NATIVE_G:
            # the tile rounded to C's 16-bit dtype in registers, one 16-bit MMA (fp32 accumulation)
            Y += tl.dot(S.to(Cw_raw.dtype), tl.trans(Cw_raw)) * dec[None, :]
        else:
            Y += tl.dot(S, CT, input_precision=DOT_PREC) * dec[None, :]
        if HAS_Z:
            zz = tl.load(z_ptr + tw[None, :] * s_z_t + h * s_z_h + offs_p[:, None],
                         mask=mo, other=0.0).to(tl.float32)
            Y *= zz * tl.sigmoid(zz)
        tl.store(out_ptr + tw[None, :] * s_o_t + h * s_o_h + offs_p[:, None],
                 Y.to(out_ptr.dtype.element_ty), mask=mo)
        # append the window's x and dt rows to the ring (disjoint from the history: c + q <= R)
        tl.store(xr_base + ring[None, :] * s_xr_r + offs_p[:, None], X_raw, mask=mp[:, None] & is_new[None, :])
        if pt == 0:
            tl.store(dtr_ptr + page * s_dtr_pg + h * s_dtr_h + ring * s_dtr_r, dtn, mask=is_new)
        if not READOUT_CHUNK:  # (the chunked readout folded chunk by chunk above)
            if FOLD_FMA:
                if flush:
                    # fold the history into the register tile S0, one rank-1 fp32 update per history
                    # row (x_k, B_k: ring rows, L1/L2 hits): exact fp32, no second read of the tile
                    tot = tl.sum(dth, axis=0)
                    S = S * tl.exp(tl.minimum(A * tot, 0.0))
                    lam_k = A * 0.0
                    dtr_base = dtr_ptr + page * s_dtr_pg + h * s_dtr_h
                    if IDX64:  # the interpreter cannot loop to a loaded bound: BLOCK_K masked steps
                        for k in tl.static_range(BLOCK_K):
                            S, lam_k = _rank1_fold(S, lam_k, k, c, rs, R, tot, A, dtr_base, s_dtr_r,
                                                   xr_base, s_xr_r, offs_p, mp, Br_base, s_Br_r, offs_n, mn, IDX64)
                    else:
                        for k in range(0, c):
                            S, lam_k = _rank1_fold(S, lam_k, k, c, rs, R, tot, A, dtr_base, s_dtr_r,
                                                   xr_base, s_xr_r, offs_p, mp, Br_base, s_Br_r, offs_n, mn, IDX64)
                    tl.store(ck, S.to(ck_ptr.dtype.element_ty), mask=mS)
            else:
                if flush:
                    # fold the history into the checkpoint, N chunk by N chunk (the tile is re-read
                    # from L2 so the full tile is not live across this branch)
                    tot = tl.sum(dth, axis=0)
                    wf = dth * tl.exp(tl.minimum(A * (tot - tl.cumsum(dth, axis=0)), 0.0))
                    XTw = XT * wf[None, :]
                    carry = tl.exp(tl.minimum(A * tot, 0.0))
                    ck_row = ck_ptr + page * s_ck_pg + h * s_ck_h + offs_p[:, None] * s_ck_p
                    for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                        oc = n0 + tl.arange(0, FOLD_N)
                        if IDX64:
                            oc = oc.to(tl.int64)
                        mc = mp[:, None] & (oc < N)[None, :]
                        Sc = tl.load(ck_row + oc[None, :], mask=mc, other=0.0).to(tl.float32)
                        Bc = tl.load(Br_base + ring[:, None] * s_Br_r + oc[None, :],
                                     mask=is_hist[:, None] & (oc < N)[None, :], other=0.0).to(tl.float32)
                        Sc = Sc * carry + tl.dot(XTw, Bc, input_precision=FOLD_PREC)
                        tl.store(ck_row + oc[None, :], Sc.to(ck_ptr.dtype.element_ty), mask=mc)


# -- materialize --------------------------------------------------------------------------


@triton.jit
def _replay_materialize_kernel(
    ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, A_ptr, page_ptr,
    R, P, N,
    s_ck_pg, s_ck_h, s_ck_p, s_ck_n,
    s_xr_pg, s_xr_h, s_xr_r, s_xr_p,
    s_Br_pg, s_Br_g, s_Br_r, s_Br_n,
    s_dtr_pg, s_dtr_h, s_dtr_r,
    NPT: tl.constexpr, HPG: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD_PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.program_id(1)
    h = (pid // NPT).to(tl.int64)
    pt = pid % NPT
    page = tl.load(page_ptr + row).to(tl.int64)
    if page != 0:
        c = tl.load(nc_ptr + page)
        if c > 0:
            rs = tl.load(rs_ptr + page)
            g = h // HPG
            A = tl.load(A_ptr + h).to(tl.float32)
            offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P).to(tl.int64)
            mp = offs_p < P
            offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
            mn = offs_n < N
            ck = ck_ptr + page * s_ck_pg + h * s_ck_h + offs_p[:, None] * s_ck_p + offs_n[None, :]
            mS = mp[:, None] & mn[None, :]
            S = tl.load(ck, mask=mS, other=0.0).to(tl.float32)
            kk = tl.arange(0, BLOCK_K)
            is_hist = kk < c
            ring = ((rs + kk) % R).to(tl.int64)
            dtp = tl.load(dtr_ptr + page * s_dtr_pg + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
            XT = tl.load(xr_ptr + page * s_xr_pg + h * s_xr_h + ring[None, :] * s_xr_r + offs_p[:, None] * s_xr_p,
                         mask=mp[:, None] & is_hist[None, :], other=0.0).to(tl.float32)
            Bseq = tl.load(Br_ptr + page * s_Br_pg + g * s_Br_g + ring[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                           mask=is_hist[:, None] & mn[None, :], other=0.0).to(tl.float32)
            S = _fold(S, XT, Bseq, dtp, is_hist, A, FOLD_PREC)
            tl.store(ck, S.to(ck_ptr.dtype.element_ty), mask=mS)


# -- commit -------------------------------------------------------------------------------


@triton.jit
def _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc):
    """Page, validity, accepted count and pending count of the batch rows ``offs``."""
    page = tl.load(page_ptr + offs, mask=offs < rows, other=0)
    valid = page != 0
    a = tl.load(acc_ptr + offs, mask=valid & (offs < n_acc), other=0)
    q = tl.load(pend_ptr + page, mask=valid, other=0)
    return page, valid, a, q


@triton.jit
def _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV: tl.constexpr):
    a = tl.where(ok, a, 0)
    c = tl.load(nc_ptr + page, mask=valid, other=0)
    rs = tl.load(rs_ptr + page, mask=valid, other=0)
    flushed = (c + q) > window
    tl.store(rs_ptr + page, tl.where(flushed, (rs + c) % R, rs), mask=valid)
    tl.store(nc_ptr + page, tl.where(flushed, a, c + a), mask=valid)
    tl.store(pend_ptr + page, tl.zeros_like(q), mask=valid)
    if UPDATE_CONV:
        tl.store(cs_ptr + page, q - a, mask=valid)


@triton.jit
def _replay_commit_kernel(
    rs_ptr, nc_ptr, pend_ptr, cs_ptr, page_ptr, acc_ptr, err_ptr,
    rows, n_acc, window, R,
    UPDATE_CONV: tl.constexpr, BLOCK: tl.constexpr, NUM_CHUNKS: tl.constexpr,
):
    # One program: the whole batch is checked before any cursor moves.
    if NUM_CHUNKS == 1:  # the batch fits one block: load once
        page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, tl.arange(0, BLOCK), rows, n_acc)
        ok = tl.sum((valid & ((a < 0) | (a > q))).to(tl.int32), axis=0) == 0
        _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV)
    else:
        bad = tl.zeros((BLOCK,), dtype=tl.int32)
        for chunk in tl.static_range(NUM_CHUNKS):
            offs = chunk * BLOCK + tl.arange(0, BLOCK)
            page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc)
            bad += (valid & ((a < 0) | (a > q))).to(tl.int32)
        ok = tl.sum(bad, axis=0) == 0
        for chunk in tl.static_range(NUM_CHUNKS):
            offs = chunk * BLOCK + tl.arange(0, BLOCK)
            page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc)
            _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV)
    err = tl.load(err_ptr)
    tl.store(err_ptr, err | tl.where(ok, 0, 1))


# -- launch configuration ------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def _block_p(P: int, cap: int) -> int:
    """Largest power-of-two tile <= cap that divides P (16 minimum; tails are masked)."""
    for b in (128, 64, 32, 16):
        if b <= cap and P % b == 0:
            return b
    return min(cap, _pow2(P))


#: Verify kernel variants (config keys): ``READOUT`` "dot" (``tl.dot(S0, Cᵀ)``, tf32 on the GPU),
#: "dot16" (the tile rounded to C's 16-bit dtype in registers for one 16-bit MMA, as FlashInfer's
#: readout does; fp32 like "dot" where B/C are not 16-bit or under the interpreter) or
#: "fma" (fp32 multiply + row sum per window token on S0's register layout) or "chunk" (S0 streamed in
#: ``BLOCK_NC``-column chunks through a loop, fp32 readout and, on flush rows, the fold and store per
#: chunk with no second read of the tile); ``FOLD`` "dot3" (3xTF32
#: ``tl.dot`` per N chunk, the chunk re-read from L2) or "fma" (rank-1 fp32 updates of the register
#: tile, one per history row). The default heuristic merges VERIFY_VARIANT into every config it returns:
#: the one place to switch the default (it may carry launch keys too, e.g. ``BLOCK_NC``, ``num_warps``).
VERIFY_VARIANT: dict[str, Any] = {"READOUT": "dot", "FOLD": "dot3"}
_VARIANT_VALUES = {"READOUT": ("dot", "fma", "chunk", "dot16"), "FOLD": ("dot3", "fma")}


def verify_config(rows: int, H: int, P: int, N: int, R: int, T: int, device: torch.device,
                  G: int = 1) -> dict[str, Any]:
    """Launch heuristic for :func:`replay_verify` (no autotuning: the interpreter cannot run it).

    A program streams one head's ``BLOCK_P x N`` checkpoint tile. Only grids of
    fewer programs than half the SMs (e.g. batch 1 with few heads per rank) split P:
    on the H200 at 128 heads, batch 1 ran 6.5 µs unsplit against 7.2 µs with P split
    in two (``docs/benchmarks/verify_h200_variants_b1.json``). The ``READOUT``/``FOLD``
    variants in :data:`VERIFY_VARIANT` stay at ``dot``/``dot3``: every other variant was
    slower on the H200 at batch 64 and 256 (``docs/performance.md`` §4).
    """
    if not _compiled(device):  # the interpreter pays per program: one masked tile per head
        return {"BLOCK_P": min(_pow2(P), 128), "num_warps": 4, "num_stages": 1, **VERIFY_VARIANT}
    BLOCK_P = _block_p(P, 64)
    sms = _num_sms(device)
    while rows * H * triton.cdiv(P, BLOCK_P) < 0.5 * sms and BLOCK_P > 16 and P % (BLOCK_P // 2) == 0:
        BLOCK_P //= 2
    return {"BLOCK_P": BLOCK_P, "num_warps": 4, "num_stages": 1, "FOLD_N": 16, **VERIFY_VARIANT}


def _compiled(device: torch.device) -> bool:
    """Kernels run compiled for a GPU (not in the interpreter)."""
    return not INTERPRETED and device.type == "cuda"


def _dot_prec(device: torch.device) -> tuple[str, str]:
    """(output terms, stored fold): tf32 / 3xTF32 on the GPU; the interpreter computes fp32 anyway."""
    return ("tf32", "tf32x3") if _compiled(device) else ("ieee", "ieee")


def _outer(**named: Tensor) -> tuple[int, ...]:
    """Strides but the last; the kernels read and write the last dimension contiguously."""
    (name, t), = named.items()
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    return t.stride()[:-1]


def _check_T(T: int) -> None:
    if T > 16:
        raise ValueError(f"the Triton verify kernel handles windows of at most 16 tokens, got T={T}")


# -- wrappers -----------------------------------------------------------------------------


def replay_verify(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    window: int,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    dt_softplus: bool = True,
    max_seqlen: int | None = None,
    config: dict[str, Any] | None = None,
) -> Tensor:
    """ReplaySSM verify for one layer (same contract as :func:`reference.replay_verify`).

    One launch; the flush decision ``c + q > window`` is taken per row on the
    device. No allocation, no host synchronization (CUDA-graph safe).

    Args:
        checkpoint: (pages, H, P, N) fp32/bf16/fp16; rewritten on flush rows. Inner dim contiguous.
        x_ring: (pages, H, R, P) act dtype. B_ring: (pages, G, R, N) act dtype.
        dt_ring: (pages, H, R) fp32 processed dt.
        ring_start, num_committed: (pages,) int32 cursors, read only.
        x: (tokens, H, P) in ``x_ring``'s dtype (bf16/fp16/fp32). dt: (tokens, H) raw, any float.
        A: (H,) float, negative. B, C: (tokens, G, N), B in ``B_ring``'s dtype.
        page_ids: (rows,) int32, 0 = padding row.
        cu_seqlens: (rows + 1,) int32. window: W; R = x_ring.shape[2] must be >= W + max q.
        out: (tokens, H, P), written for every non-padding token.
        D: (H,) skip or None. dt_bias: (H,) or None. z: (tokens, H, P) gate or None.
        Every tensor with a P or N dimension must be contiguous in it (stride 1).
        max_seqlen: longest row (<= 16); defaults to ``R - window`` (= T on the layout).
        config: launch override, keys ``BLOCK_P``, ``FOLD_N`` (N chunk of the "dot3" fold), ``num_warps``,
            ``num_stages``, and the variants ``READOUT`` ("dot"/"fma"/"chunk", ``BLOCK_NC`` the chunk width)
            and ``FOLD`` ("dot3"/"fma"), see
            :data:`VERIFY_VARIANT`; results agree to fp32/tf32 rounding across variants.
    Returns:
        ``out``.
    """
    pages, H, P, N = checkpoint.shape
    R = x_ring.shape[2]
    G = B_ring.shape[1]
    T = max_seqlen if max_seqlen is not None else R - window
    _check_T(T)
    if x.dtype != x_ring.dtype or B.dtype != B_ring.dtype:
        raise ValueError(f"x/B ({x.dtype}/{B.dtype}) must have the ring dtypes ({x_ring.dtype}/{B_ring.dtype})")
    rows = page_ids.shape[0]
    dev = x.device
    cfg = dict(verify_config(rows, H, P, N, R, T, dev, G))
    if config:
        cfg.update(config)
    for key, allowed in _VARIANT_VALUES.items():
        if cfg.get(key, VERIFY_VARIANT[key]) not in allowed:
            raise ValueError(f"config {key} must be one of {allowed}, got {cfg[key]!r}")
    BLOCK_P = cfg["BLOCK_P"]
    NPT = triton.cdiv(P, BLOCK_P)
    dot_prec, fold_prec = _dot_prec(dev)
    dummy = dt_ring
    Dp = D if D is not None else dummy
    dtbp = dt_bias if dt_bias is not None else dummy
    zp = z if z is not None else x
    grid = (H * NPT, rows)
    _replay_verify_kernel[grid](
        checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed,
        x, dt, A, B, C, Dp, dtbp, zp, out,
        page_ids, cu_seqlens,
        window, R, P, N,
        *_outer(checkpoint=checkpoint), *_outer(x_ring=x_ring), *_outer(B_ring=B_ring), *dt_ring.stride(),
        *_outer(x=x), *dt.stride(), *_outer(B=B), *_outer(C=C), *_outer(z=zp), *_outer(out=out),
        NPT=NPT, HPG=H // G,
        BLOCK_P=BLOCK_P, BLOCK_N=_pow2(N), BLOCK_K=_pow2(R), BLOCK_S=_pow2(T),
        FOLD_N=min(_pow2(N), int(cfg.get("FOLD_N", 16 if _compiled(dev) else 128))),
        HAS_D=D is not None, HAS_DTB=dt_bias is not None, HAS_Z=z is not None, DT_SOFTPLUS=bool(dt_softplus),
        DOT_PREC=dot_prec, FOLD_PREC=fold_prec, IDX64=INTERPRETED,
        NATIVE_G=_compiled(dev) and B.dtype == C.dtype and B.dtype in (torch.bfloat16, torch.float16),
        READOUT_FMA=cfg.get("READOUT", VERIFY_VARIANT["READOUT"]) == "fma",
        READOUT_CHUNK=cfg.get("READOUT", VERIFY_VARIANT["READOUT"]) == "chunk",
        READOUT_16=cfg.get("READOUT", VERIFY_VARIANT["READOUT"]) == "dot16",
        BLOCK_NC=min(_pow2(N), int(cfg.get("BLOCK_NC", 32))),
        FOLD_FMA=cfg.get("FOLD", VERIFY_VARIANT["FOLD"]) == "fma", S_LOOP=min(T, _pow2(T)),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def replay_commit(
    ring_start: Tensor,
    num_committed: Tensor,
    pending: Tensor,
    conv_shift: Tensor,
    page_ids: Tensor,
    num_accepted: Tensor,
    window: int,
    ring_len: int,
    update_conv: bool,
    error_flag: Tensor,
) -> None:
    """Commit a verify step on the device (same contract as :func:`reference.replay_commit`).

    One single-program launch; no host synchronization. A batch with any
    ``a < 0`` or ``a > q`` commits 0 for every row and sets ``error_flag``.

    Args:
        ring_start, num_committed, pending, conv_shift: (pages,) int32 cursors, updated in place.
        page_ids: (rows,) int32, 0 = padding. num_accepted: (rows,) or (requests,) int32, same device
            (rows past its length must be padding).
        window: W. ring_len: R. update_conv: write ``conv_shift = q - a``. error_flag: (1,) int32.
    """
    rows = page_ids.shape[0]
    block = min(1024, _pow2(rows, 32))
    _replay_commit_kernel[(1,)](
        ring_start, num_committed, pending, conv_shift, page_ids, num_accepted, error_flag,
        rows, num_accepted.shape[0], window, ring_len,
        UPDATE_CONV=bool(update_conv), BLOCK=block, NUM_CHUNKS=triton.cdiv(rows, block), num_warps=4,
    )


def replay_materialize(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    A: Tensor,
    page_ids: Tensor,
    config: dict[str, Any] | None = None,
) -> None:
    """Fold each page's committed rows into its checkpoint, one layer (see :func:`reference.replay_materialize`).

    Cursors are not touched. Args as in :func:`replay_verify`; ``A``: (H,) float;
    ``page_ids``: (rows,) int32, 0 = skip.
    """
    pages, H, P, N = checkpoint.shape
    R = x_ring.shape[2]
    G = B_ring.shape[1]
    rows = page_ids.shape[0]
    dev = checkpoint.device
    cfg = dict(verify_config(rows, H, P, N, R, 1, dev))
    if config:
        cfg.update(config)
    BLOCK_P = min(cfg["BLOCK_P"], 64 if dev.type == "cuda" else 128)
    NPT = triton.cdiv(P, BLOCK_P)
    _replay_materialize_kernel[(H * NPT, rows)](
        checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, A, page_ids,
        R, P, N,
        *checkpoint.stride(), *x_ring.stride(), *B_ring.stride(), *dt_ring.stride(),
        NPT=NPT, HPG=H // G, BLOCK_P=BLOCK_P, BLOCK_N=_pow2(N), BLOCK_K=_pow2(R),
        FOLD_PREC=_dot_prec(dev)[1], num_warps=cfg["num_warps"],
    )
