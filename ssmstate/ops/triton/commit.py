"""Triton commit and materialize on the shared page layout (same contracts as their twins in
:mod:`ssmstate.ops.reference`).

Commit is one single-program launch that checks the whole batch before any cursor moves; materialize folds each
page's committed ring rows into its checkpoint, one program per (row, head, P tile). Neither allocates nor syncs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmstate.ops.triton.common import dot_precisions, fold, pow2, safe_cursors
from ssmstate.ops.triton.config import device_class, ldg_block_p
from ssmstate.ops.triton.quant import (
    check_sr_seed, chunk_amax, dequant, encode_scales, encode_tile, kernel_checkpoint, round_store_value,
    scale_strides, sr_bits, sr_head_key, sr_page_key,
)

Tensor = torch.Tensor


@triton.jit(do_not_specialize=["layer"])  # layer 1 must stay a runtime int (the SR hash casts it)
def _replay_materialize_kernel(
    ck_ptr, cks_ptr, seed_ptr, layer, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, A_ptr, page_ptr,
    window, R, P, N,
    s_ck_pg, s_ck_h, s_ck_p, s_ck_n,
    s_cks_pg, s_cks_h,
    s_xr_pg, s_xr_h, s_xr_r, s_xr_p,
    s_Br_pg, s_Br_g, s_Br_r, s_Br_n,
    s_dtr_pg, s_dtr_h, s_dtr_r,
    NPT: tl.constexpr, HPG: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FOLD_PREC: tl.constexpr,
):
    # An int8 / e4m3 (bytes) checkpoint is decoded with its scales (cks_ptr) and written back as codes and new
    # scales; seed_ptr (int64 (1,)): the write is stochastically rounded.
    CK_TY: tl.constexpr = ck_ptr.dtype.element_ty
    QMODE: tl.constexpr = (1 if CK_TY == tl.int8 else 2) if cks_ptr is not None else 0
    SR: tl.constexpr = seed_ptr is not None
    pid = tl.program_id(0)
    row = tl.program_id(1)
    h = (pid // NPT).to(tl.int64)
    pt = pid % NPT
    page = tl.load(page_ptr + row).to(tl.int64)
    if page != 0:
        c, rs = safe_cursors(tl.load(nc_ptr + page), tl.load(rs_ptr + page), window, R)
        if c > 0:
            g = h // HPG
            A = tl.load(A_ptr + h).to(tl.float32)
            offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P).to(tl.int64)
            mp = offs_p < P
            offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
            mn = offs_n < N
            ck = ck_ptr + page * s_ck_pg + h * s_ck_h + offs_p[:, None] * s_ck_p + offs_n[None, :]
            mS = mp[:, None] & mn[None, :]
            if QMODE > 0:
                cks_row = cks_ptr + page * s_cks_pg + h * s_cks_h + offs_p
                S = dequant(tl.load(ck, mask=mS, other=0), tl.load(cks_row, mask=mp, other=1.0), QMODE)
            else:
                S = tl.load(ck, mask=mS, other=0.0).to(tl.float32)
            kk = tl.arange(0, BLOCK_K)
            is_hist = kk < c
            ring = ((rs + kk) % R).to(tl.int64)
            dtp = tl.load(dtr_ptr + page * s_dtr_pg + h * s_dtr_h + ring * s_dtr_r, mask=is_hist, other=0.0)
            XT = tl.load(xr_ptr + page * s_xr_pg + h * s_xr_h + ring[None, :] * s_xr_r + offs_p[:, None] * s_xr_p,
                         mask=mp[:, None] & is_hist[None, :], other=0.0).to(tl.float32)
            Bseq = tl.load(Br_ptr + page * s_Br_pg + g * s_Br_g + ring[:, None] * s_Br_r + offs_n[None, :] * s_Br_n,
                           mask=is_hist[:, None] & mn[None, :], other=0.0).to(tl.float32)
            S = fold(S, XT, Bseq, dtp, is_hist, A, FOLD_PREC)
            if SR:
                key_h = sr_head_key(sr_page_key(seed_ptr, layer, page), h)
                bits = sr_bits(key_h, offs_p, offs_n)
            else:
                key_h = h  # unused
                bits = S  # unused
            if QMODE > 0:
                enc, scale = encode_scales(chunk_amax(S, tl.zeros((BLOCK_P,), dtype=tl.float32)), QMODE)
                tl.store(ck, encode_tile(S, enc, key_h, offs_p, offs_n, QMODE, SR), mask=mS)
                tl.store(cks_row, scale, mask=mp)
            else:
                tl.store(ck, round_store_value(S, bits, CK_TY, SR), mask=mS)


# -- commit -------------------------------------------------------------------------------


@triton.jit
def _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc, window, R):
    """Page, validity, accepted count and pending count of the batch rows ``offs``."""
    page = tl.load(page_ptr + offs, mask=offs < rows, other=0)
    valid = page != 0
    a = tl.load(acc_ptr + offs, mask=valid & (offs < n_acc), other=0)
    q = tl.minimum(tl.maximum(tl.load(pend_ptr + page, mask=valid, other=0), 0), R - window)  # [0, T]
    return page, valid, a, q


@triton.jit
def _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV: tl.constexpr):
    a = tl.where(ok, a, 0)
    c, rs = safe_cursors(tl.load(nc_ptr + page, mask=valid, other=0), tl.load(rs_ptr + page, mask=valid, other=0),
                         window, R)
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
        page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, tl.arange(0, BLOCK), rows, n_acc, window, R)
        ok = tl.sum((valid & ((a < 0) | (a > q))).to(tl.int32), axis=0) == 0
        _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV)
    else:
        bad = tl.zeros((BLOCK,), dtype=tl.int32)
        for chunk in tl.static_range(NUM_CHUNKS):
            offs = chunk * BLOCK + tl.arange(0, BLOCK)
            page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc, window, R)
            bad += (valid & ((a < 0) | (a > q))).to(tl.int32)
        ok = tl.sum(bad, axis=0) == 0
        for chunk in tl.static_range(NUM_CHUNKS):
            offs = chunk * BLOCK + tl.arange(0, BLOCK)
            page, valid, a, q = _commit_rows(page_ptr, acc_ptr, pend_ptr, offs, rows, n_acc, window, R)
            _commit_apply(rs_ptr, nc_ptr, pend_ptr, cs_ptr, page, valid, a, q, ok, window, R, UPDATE_CONV)
    err = tl.load(err_ptr)
    tl.store(err_ptr, err | tl.where(ok, 0, 1))


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
    """Commit a verify step on the device (same contract as :func:`ssmstate.ops.reference.replay_commit`).

    One single-program launch; no host synchronization. A batch with any
    ``a < 0`` or ``a > q`` commits 0 for every row and sets ``error_flag``.

    Args:
        ring_start, num_committed, pending, conv_shift: (pages,) int32 cursors, cache-owned, updated in place.
        page_ids: (rows,) int32, 0 = padding. num_accepted: (rows,) or (requests,) int32, same device
            (rows past its length must be padding).
        window: W. ring_len: R. update_conv: write ``conv_shift = q - a``. error_flag: (1,) int32, cache-owned.
    """
    rows = page_ids.shape[0]
    block = min(1024, pow2(rows, 32))
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
    window: int | None = None,
    checkpoint_scale: Tensor | None = None,
    sr_seed: Tensor | None = None,
    layer: int = 0,
) -> None:
    """Fold each page's committed rows into its checkpoint, one layer (see
    :func:`ssmstate.ops.reference.replay_materialize`).

    Cursors are not touched. Args as in :func:`ssmstate.ops.triton.verify.replay_verify`; ``A``: (H,) float;
    ``page_ids``: (rows,) int32, 0 = skip; ``window``: W, the bound ``num_committed`` is read clamped to
    (``R`` if None); ``checkpoint_scale``, ``sr_seed``, ``layer``: as there (a folded page's checkpoint is written
    as a flush row's).
    """
    checkpoint, checkpoint_scale = kernel_checkpoint(checkpoint, checkpoint_scale)
    check_sr_seed(checkpoint, sr_seed, layer)
    pages, H, P, N = checkpoint.shape
    R = x_ring.shape[2]
    G = B_ring.shape[1]
    rows = page_ids.shape[0]
    dev = device_class(checkpoint.device)
    BLOCK_P = min(ldg_block_p(rows, H, P, dev), 64 if checkpoint.device.type == "cuda" else 128)
    NPT = triton.cdiv(P, BLOCK_P)
    _replay_materialize_kernel[(H * NPT, rows)](
        checkpoint, checkpoint_scale, sr_seed, int(layer), x_ring, B_ring, dt_ring, ring_start, num_committed, A,
        page_ids, R if window is None else window, R, P, N,
        *checkpoint.stride(), *scale_strides(checkpoint_scale), *x_ring.stride(), *B_ring.stride(),
        *dt_ring.stride(), NPT=NPT, HPG=H // G, BLOCK_P=BLOCK_P, BLOCK_N=pow2(N), BLOCK_K=pow2(R),
        FOLD_PREC=dot_precisions(dev.compiled)[1], num_warps=4,
    )
