"""The fused layer kernel: conv window update, activation, x/B/C split, dt processing and the ReplaySSM verify in
one launch (host entry: :mod:`ssmstate.ops.triton.conv_verify`).

One program per (row, ``HPP`` heads of one group, tile of ``BLOCK_P`` head-dim rows; ``HPP`` is 1 on the GPU). A
program computes the conv outputs it needs straight from the page's old conv window and the step's ``xBC``
inputs, in registers, in the layout the verify math takes them: its heads' x channels over the sequence tile, its
group's B channels over the sequence tile and C channels over the window. Nothing of the conv output goes to
memory but the rows the ring keeps (x, B) and the outputs ``y``.

Who writes the conv window (updated in place) while other programs of the same launch read it:

* an x channel (head h, head-dim row p) is read and written by exactly one program, the one of (row, h, P tile):
  it loads every old column it needs (conv taps and the new window's columns), waits at a barrier for all its
  threads, then stores. No other program touches that channel of that page.
* a B or C channel of group g is read by every program of the row's group g (``GROUP_PROGS`` of them: each needs
  all N channels of B and C) and written by one: the last of them to arrive at the page's counter
  ``counters[page, g]``. Each program increments it (``atomic_add``, acquire-release, GPU scope) as soon as it
  has consumed the old B/C columns, after a barrier of its threads (:func:`~ssmstate.ops.triton.conv.arrive`);
  the program that sees ``GROUP_PROGS - 1`` knows every other program of the group has read them (their reads
  happen-before their release, which happens-before its acquire), resets the counter to 0 for the next launch
  and, at its end, stores the new window (the columns every program of the group loaded with its conv inputs:
  old values, as no other program writes these channels). The interpreter runs programs one after another; the
  GPU tests repeat a launch and compare every result bit for bit. A page is one row of a
  step (the manager's steps never repeat a page; padding rows on page 0 skip everything), so no two rows share a
  counter.
* the rings and the checkpoint are owned as in the verify kernels: appended ring rows are disjoint from the
  history rows any program reads (``c + q <= R``), the B row by the group's first program of P tile 0, the dt row
  by P tile 0, a checkpoint tile by its (head, P tile) program.

All math is fp32. A conv output is rounded to the rings' dtype (as the unfused path stores it) before the verify
math uses it, so both paths feed the verify the same values.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmstate.ops.triton.common import (chunk, decay, fold_chunk, fold_weights, load_chunk, pdl_wait, safe_cursors,
                                        load_tile, softplus)
from ssmstate.ops.triton.conv import arrive


@triton.jit
def _conv_seq(seq, w_ch, b_ch, mch, ll, ss, s_w_k, KW: tl.constexpr, TMAX: tl.constexpr, HAS_BIAS: tl.constexpr,
              SILU: tl.constexpr):
    """``act(bias + Σ_j w_j seq[:, s + j])`` in fp32, a (channels, BLOCK_S) tile for window tokens ``s < TMAX``.

    ``seq``: (channels, BLOCK_L) fp32, the channels' sequence columns (``k - 1`` history, then the row's inputs:
    :func:`_window_seq`). ``w_ch`` / ``b_ch``: the channels' weight row and bias, (channels, 1); ``mch`` their mask.
    Summed as :mod:`~ssmstate.ops.triton.conv` sums (products over the columns, then the bias).
    """
    Y = tl.zeros((seq.shape[0], ss.shape[1]), dtype=tl.float32)
    for t in tl.static_range(TMAX):
        j = ll - t
        wt = tl.load(w_ch + j * s_w_k, mask=mch & (j >= 0) & (j < KW + 1), other=0.0).to(tl.float32)
        Y = tl.where(ss == t, tl.sum(seq * wt, axis=1)[:, None], Y)
    if HAS_BIAS:
        Y += tl.load(b_ch, mask=mch, other=0.0).to(tl.float32)
    if SILU:
        Y = Y * tl.sigmoid(Y)
    return Y


@triton.jit
def _window_seq(win_ch, x_ch, mch, ll, q, end, lo, s_win_c, s_x_t, KW: tl.constexpr):
    """The channels' new window columns ``0 .. KW + q - 1`` (old history, then the row's inputs), conv dtype."""
    hist = ll < KW
    v = tl.load(win_ch + (end - KW + ll) * s_win_c, mask=mch & hist, other=0.0)
    u = tl.load(x_ch + (lo + ll - KW) * s_x_t, mask=mch & (ll >= KW) & (ll < KW + q), other=0.0)
    return tl.where(hist, v, u.to(v.dtype))


@triton.jit
def _store_window(win_ch, seq, mch, ll, q, width, s_win_c, KW: tl.constexpr):
    """Store :func:`_window_seq`'s columns right-aligned (``conv_update``'s new window)."""
    dst = width - (KW + q) + ll
    tl.store(win_ch + dst * s_win_c, seq, mask=mch & (ll < KW + q) & (dst >= 0))


@triton.jit
def _head_loads(h, is_hist, is_new, ring, sk, tw, offs_p, mp, ms, ll, q, lo, end, P, win_page, s_win_d, s_win_c,
                xbc_ptr, s_x_t, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr,
                D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, KW: tl.constexpr, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr,
                HAS_Z: tl.constexpr):
    """Head ``h``'s global loads, issued together (before the group's conv math, so they are in flight with it):
    its x channels' window columns and inputs, its x and dt history, dt of the window, A, D, dt_bias, z."""
    ch = h * P + offs_p
    seq = _window_seq(win_page + ch[:, None] * s_win_d, xbc_ptr + ch[:, None], mp[:, None], ll[None, :], q, end, lo,
                      s_win_c, s_x_t, KW)
    x_rows = xr_base + h * s_xr_h + ring * s_xr_r
    Xh = tl.load(x_rows[None, :] + offs_p[:, None], mask=mp[:, None] & is_hist[None, :], other=0.0)
    dth = tl.load(dtr_base + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
    dtn = tl.load(dt_ptr + (lo + sk) * s_dt_t + h * s_dt_h, mask=is_new, other=0.0)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h) if HAS_D else A
    dtb = tl.load(dtb_ptr + h) if HAS_DTB else A
    if HAS_Z:
        zz = tl.load(z_ptr + tw[None, :] * s_z_t + h * s_z_h + offs_p[:, None], mask=mp[:, None] & ms[None, :],
                     other=0.0)
    else:
        zz = A
    return seq, Xh, dth, dtn, A, Dh, dtb, zz


@triton.jit
def _fused_head(
    h, S, seq, Xh, dth, dtn, A, Dh, dtb, zz, Cd, Gm, b_hist, is_hist, is_new, is_seq, causal, diag, ring, sk, ss, tw, offs_p, mp, mS, ms, ll,
    pmt, ring_w, pt, q, lo, end, width, P, N_,
    ck_ptr, ck_page, s_ck_h, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r,
    win_page, s_win_d, s_win_c, xbc_ptr, s_x_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
    dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h,
    S_CK_P: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr,
    EVEN: tl.constexpr, FLUSH: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_D: tl.constexpr,
    HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr, DOT_PREC: tl.constexpr,
    FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr, IDX64: tl.constexpr, TMAX: tl.constexpr,
    ACT16: tl.constexpr,
):
    """One head of a row: its x channels' conv, the verify outputs, the ring append, the flush fold, and its x
    channels' new conv window (this program is their only reader and writer)."""
    ch = h * P + offs_p  # the head's x channels of the conv
    win_ch = win_page + ch[:, None] * s_win_d
    Xs = _conv_seq(seq.to(tl.float32), cw_ptr + ch[:, None] * s_cw_d, cb_ptr + ch[:, None], mp[:, None],
                   ll[None, :], ss[None, :], s_cw_k, KW, TMAX, HAS_BIAS, SILU)
    Xs = Xs.to(Xh.dtype)  # (BLOCK_P, BLOCK_S): x of the window tokens, rounded as the unfused path stores it
    # x over the sequence (BLOCK_P, BLOCK_K): the history, plus the window's x moved to positions c + s by a 0/1
    # matrix (one nonzero product per element: exact)
    if ACT16:
        XT = Xh.to(tl.float32) + tl.dot(Xs, pmt.to(Xs.dtype))
    else:
        XT = Xh.to(tl.float32) + tl.dot(Xs.to(tl.float32), pmt.to(tl.float32), input_precision="ieee")
    dtn = dtn.to(tl.float32)
    A = A.to(tl.float32)
    if HAS_DTB:
        dtn += dtb.to(tl.float32)
    if DT_SOFTPLUS:
        dtn = softplus(dtn)
    dtn = tl.where(is_new, dtn, 0.0)
    dtp = tl.where(is_hist, dth, dtn)
    # y_s = e^{A Λ_w} S0 C_s + Σ_{k<=w} dt_k e^{A (Λ_w - Λ_k)} (B_k.C_s) x_k + D x_w, w = c + s
    lam = tl.cumsum(dtp, axis=0)
    lam_w = tl.sum(tl.where(diag, lam[:, None], 0.0), axis=0)
    F = tl.where(causal, Gm * dtp[:, None] * decay(A, lam_w[None, :] - lam[:, None]), 0.0)
    if HAS_D:  # D x_w rides on the diagonal k = w of the factor matrix
        F += tl.where(diag, Dh.to(tl.float32), 0.0)
    Y = tl.dot(XT, F, input_precision=DOT_PREC)
    Y += tl.dot(S.to(tl.float32), Cd, input_precision=DOT_PREC) * decay(A, lam_w)[None, :]
    if HAS_Z:
        z = zz.to(tl.float32)
        Y *= z * tl.sigmoid(z)
    tl.store(out_ptr + tw[None, :] * s_o_t + h * s_o_h + offs_p[:, None], Y.to(out_ptr.dtype.element_ty),
             mask=mp[:, None] & ms[None, :])
    # append the window's x and dt rows to the ring (disjoint from the history: c + q <= R)
    tl.store(xr_base + h * s_xr_h + ring_w[None, :] * s_xr_r + offs_p[:, None], Xs, mask=mp[:, None] & ms[None, :])
    if pt == 0:
        tl.store(dtr_base + h * s_dtr_h + ring * s_dtr_r, dtn, mask=is_new)
    if FLUSH:  # S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h over the c history rows, stored over S0 chunk by chunk
        XTw, hi, lo_, carry = fold_weights(XT, dth, A, FOLD_SPLIT)
        for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
            oc, ckc, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
            fold_chunk(load_chunk(ckc, mc, EVEN) * carry, ckc, mc, oc, b_hist, is_hist, N_, XTw, hi, lo_, ck_ptr,
                       EVEN, FOLD_SPLIT, FOLD_PREC)
    tl.debug_barrier()  # every thread's reads of these channels' old window columns are done
    _store_window(win_ch, seq, mp[:, None], ll[None, :], q, width, s_win_c, KW)


@triton.jit
def _fused_heads(
    h0, S, seq, Xh, dth, dtn, A, Dh, dtb, zz, Cd, Gm, b_hist, is_hist, is_new, is_seq, causal, diag, ring, sk, ss, tw, offs_p, mp, mS, ms, ll,
    pmt, ring_w, pt, q, lo, end, width, P, N_,
    ck_ptr, ck_page, s_ck_h, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r,
    win_page, s_win_d, s_win_c, xbc_ptr, s_x_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
    dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h,
    S_CK_P: tl.constexpr, HPP: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    FOLD_N: tl.constexpr, EVEN: tl.constexpr, FLUSH: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr, IDX64: tl.constexpr,
    TMAX: tl.constexpr, ACT16: tl.constexpr,
):
    """Heads ``h0 .. h0 + HPP - 1`` of one row, one route (FLUSH is a constexpr: each loop body specialized);
    ``S`` and the other loads are head ``h0``'s, already in flight."""
    for i in range(HPP):
        _fused_head(h0 + i, S, seq, Xh, dth, dtn, A, Dh, dtb, zz, Cd, Gm, b_hist, is_hist, is_new, is_seq, causal, diag, ring, sk, ss, tw, offs_p, mp,
                    mS, ms, ll, pmt, ring_w, pt, q, lo, end, width, P, N_,
                    ck_ptr, ck_page, s_ck_h, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r,
                    win_page, s_win_d, s_win_c, xbc_ptr, s_x_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                    dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h,
                    S_CK_P, KW, BLOCK_P, BLOCK_N, FOLD_N, EVEN, FLUSH, HAS_BIAS, SILU, HAS_D, HAS_DTB, HAS_Z,
                    DT_SOFTPLUS, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, TMAX, ACT16)
        if HPP > 1:  # the next head's loads (the last step re-loads its own head: L2 hits, no masked load)
            hn = h0 + tl.minimum(i + 1, HPP - 1)
            S = load_tile(ck_page, hn, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)
            seq, Xh, dth, dtn, A, Dh, dtb, zz = _head_loads(
                hn, is_hist, is_new, ring, sk, tw, offs_p, mp, ms, ll, q, lo, end, P, win_page, s_win_d, s_win_c,
                xbc_ptr, s_x_t, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr,
                D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, KW, HAS_D, HAS_DTB, HAS_Z)


@triton.jit
def conv_verify_kernel(
    ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, win_ptr, shift_ptr, cnt_ptr,
    xbc_ptr, dt_ptr, A_ptr, cw_ptr, cb_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, P, N, width, XD, GN,
    s_ck_pg, s_ck_h,
    s_xr_pg, s_xr_h, s_xr_r,
    s_Br_pg, s_Br_g, s_Br_r,
    s_dtr_pg, s_dtr_h, s_dtr_r,
    s_win_pg, s_win_d, s_win_c,
    s_cnt_pg,
    s_x_t,
    s_dt_t, s_dt_h,
    s_cw_d, s_cw_k,
    s_z_t, s_z_h,
    s_o_t, s_o_h,
    S_CK_P: tl.constexpr, KW: tl.constexpr, TMAX: tl.constexpr, NPT: tl.constexpr, HPG: tl.constexpr,
    HPP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_L: tl.constexpr, EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
    IDX64: tl.constexpr, NATIVE_G: tl.constexpr, ACT16: tl.constexpr, GDC: tl.constexpr,
):
    pid = tl.program_id(0)
    row = tl.program_id(1)
    pt = pid % NPT
    hc = pid // NPT  # (group, head chunk)
    g = (hc // (HPG // HPP)).to(tl.int64)
    h0 = (hc * HPP).to(tl.int64)
    page = tl.load(page_ptr + row).to(tl.int64)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if (page != 0) & (q > 0):
        # the first head's tile is most of the first round trip and needs only the page: issue it first
        ck_page = ck_ptr + page * s_ck_pg + pt * BLOCK_P * S_CK_P
        offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        if IDX64:
            offs_p = offs_p.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
        mp = offs_p < P
        mn = offs_n < N
        mS = mp[:, None] & mn[None, :]
        S = load_tile(ck_page, h0, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)
        c, rs = safe_cursors(tl.load(nc_ptr + page), tl.load(rs_ptr + page), window, R)
        end = width - tl.minimum(tl.maximum(tl.load(shift_ptr + page), 0), TMAX)  # shift read clamped to [0, T]
        if GDC:  # a programmatic dependent (pdl=True): the step's inputs only after the kernel before has ended
            pdl_wait()
        ss = tl.arange(0, BLOCK_S)
        ms = ss < q
        tw = lo + ss
        ll = tl.arange(0, BLOCK_L)
        if IDX64:
            tw = tw.to(tl.int64)
            ll = ll.to(tl.int64)
        kk = tl.arange(0, BLOCK_K)
        is_hist = kk < c
        is_new = (kk >= c) & (kk < c + q)
        is_seq = kk < c + q
        ring = (rs + kk) % R  # ring row of sequence position k (history and appended alike)
        ring_new = (rs + c + ss) % R  # ring row of window token s
        sk = tl.maximum(kk - c, 0)  # the row's token at sequence position k (window positions)
        if IDX64:  # the interpreter checks every int32 vector op for overflow: int64 skips it
            ring = ring.to(tl.int64)
            ring_new = ring_new.to(tl.int64)
            sk = sk.to(tl.int64)
        pos = c + ss
        causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
        diag = (kk[:, None] == pos[None, :]) & ms[None, :]
        win_page = win_ptr + page * s_win_pg
        # the group's B over the sequence (ring rows, then the conv of the window's inputs) and C over the window
        chB = XD + g * N + offs_n
        chC = chB + GN
        # their new window columns, loaded beside the conv's taps (stored by one program of the group at the end)
        bw = win_page + chB[:, None] * s_win_d
        cw = win_page + chC[:, None] * s_win_d
        bseq = _window_seq(bw, xbc_ptr + chB[:, None], mn[:, None], ll[None, :], q, end, lo, s_win_c, s_x_t, KW)
        cseq = _window_seq(cw, xbc_ptr + chC[:, None], mn[:, None], ll[None, :], q, end, lo, s_win_c, s_x_t, KW)
        Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
        b_hist = Br_base + ring * s_Br_r  # the history's B rows (re-read per N chunk of a flush row's fold)
        Bh = tl.load(b_hist[:, None] + offs_n[None, :], mask=is_hist[:, None] & mn[None, :], other=0.0)
        xr_base = xr_ptr + page * s_xr_pg
        dtr_base = dtr_ptr + page * s_dtr_pg
        seq, Xh, dth, dtn, A, Dh, dtb, zz = _head_loads(
            h0, is_hist, is_new, ring, sk, tw, offs_p, mp, ms, ll, q, lo, end, P, win_page, s_win_d, s_win_c,
            xbc_ptr, s_x_t, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr,
            D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, KW, HAS_D, HAS_DTB, HAS_Z)
        # the group's B and C over the window (channels, BLOCK_S) from their new window columns
        Bs = _conv_seq(bseq.to(tl.float32), cw_ptr + chB[:, None] * s_cw_d, cb_ptr + chB[:, None], mn[:, None],
                       ll[None, :], ss[None, :], s_cw_k, KW, TMAX, HAS_BIAS, SILU)
        Cs = _conv_seq(cseq.to(tl.float32), cw_ptr + chC[:, None] * s_cw_d, cb_ptr + chC[:, None], mn[:, None],
                       ll[None, :], ss[None, :], s_cw_k, KW, TMAX, HAS_BIAS, SILU)
        # this program has read the group's old B/C window columns (bseq, cseq consumed): arrive at the counter
        last = arrive(cnt_ptr + page * s_cnt_pg + g, 1, NPT * (HPG // HPP))
        Bs = Bs.to(Bh.dtype)  # (BLOCK_N, BLOCK_S), rounded as the unfused path stores B and C
        Cs = Cs.to(Bh.dtype)
        # window token s sits at sequence position c + s: pmt[s, k] = 1 there (a 0/1 placement matrix)
        pmt = ((ss[:, None] + c) == kk[None, :]) & ms[:, None]
        pm = (kk[:, None] == (ss + c)[None, :]) & ms[None, :]  # its transpose
        ring_w = ring_new  # ring rows of the window tokens
        # Gram B·Cᵀ over the sequence: the history's rows, plus the window's moved to their positions (exact)
        if NATIVE_G:  # 16-bit B and C: exact products, fp32 accumulation
            Gm = tl.dot(Bh, Cs)
            Gs = tl.dot(tl.trans(Bs), Cs)
        else:
            Gm = tl.dot(Bh.to(tl.float32), Cs.to(tl.float32), input_precision=DOT_PREC)
            Gs = tl.dot(tl.trans(Bs.to(tl.float32)), Cs.to(tl.float32), input_precision=DOT_PREC)
        Gm += tl.dot(pm.to(tl.float32), Gs, input_precision="ieee")
        Cd = Cs.to(tl.float32)  # (N, BLOCK_S), readout operand
        if (pt == 0) & (h0 % HPG == 0):  # append the window's B rows to the ring, once per group
            tl.store(Br_base + ring_w[None, :] * s_Br_r + offs_n[:, None], Bs, mask=mn[:, None] & ms[None, :])
        if c + q > window:  # flush: fold the history into the checkpoint, outputs from it
            _fused_heads(h0, S, seq, Xh, dth, dtn, A, Dh, dtb, zz, Cd, Gm, b_hist, is_hist, is_new, is_seq, causal, diag, ring, sk, ss, tw, offs_p, mp,
                         mS, ms, ll, pmt, ring_w, pt, q, lo, end, width, P, N,
                         ck_ptr, ck_page, s_ck_h, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r,
                         win_page, s_win_d, s_win_c, xbc_ptr, s_x_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                         dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h,
                         S_CK_P, HPP, KW, BLOCK_P, BLOCK_N, FOLD_N, EVEN, True, HAS_BIAS, SILU, HAS_D, HAS_DTB,
                         HAS_Z, DT_SOFTPLUS, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, TMAX, ACT16)
        else:
            _fused_heads(h0, S, seq, Xh, dth, dtn, A, Dh, dtb, zz, Cd, Gm, b_hist, is_hist, is_new, is_seq, causal, diag, ring, sk, ss, tw, offs_p, mp,
                         mS, ms, ll, pmt, ring_w, pt, q, lo, end, width, P, N,
                         ck_ptr, ck_page, s_ck_h, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r,
                         win_page, s_win_d, s_win_c, xbc_ptr, s_x_t, cw_ptr, s_cw_d, s_cw_k, cb_ptr,
                         dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h,
                         S_CK_P, HPP, KW, BLOCK_P, BLOCK_N, FOLD_N, EVEN, False, HAS_BIAS, SILU, HAS_D, HAS_DTB,
                         HAS_Z, DT_SOFTPLUS, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, TMAX, ACT16)
        if last:  # every other program of the group has read the old columns: the new B and C window
            _store_window(bw, bseq, mn[:, None], ll[None, :], q, width, s_win_c, KW)
            _store_window(cw, cseq, mn[:, None], ll[None, :], q, width, s_win_c, KW)
    if GDC:  # a program that skipped its row ends only after the kernel before too
        pdl_wait()
