"""Triton ReplaySSM kernels: verify (both routes), commit, materialize, on the shared page layout.

Each public function has the signature of its PyTorch twin in
:mod:`ssmstate.ops.reference` (the contract and the ground truth), plus an
optional trailing ``config`` to override the launch heuristic.

Verify has two kernels over the same math; both read the checkpoint tile ``S0``
(P x N) once and never form an intermediate state. The TMA kernel (the default where
the geometry allows: :func:`tma_block_p`) takes one program per (row, head, 64 head-dim
rows): the tile arrives by one TMA copy into shared memory and the readout's
tensor-core product reads it there. The LDG kernel (any geometry; ``KERNEL="ldg"``)
takes one program per (row, ``HPP`` heads of one group, P tile) and loads the tile
with plain or pipelined loads. Both:

* the row's sequence is ``c`` history rows from the ring followed by the ``q``
  new tokens (``c + q <= R``), indexed ``k``; every ring row, history or
  appended, lives at ``(ring_start + k) % R``;
* outputs, on both routes: ``Y = X_seqᵀ F + (S0 Cᵀ) * exp(A Λ_w)`` with the
  causal factor matrix ``F[k, s] = (B_k·C_s) dt_k exp(A (Λ_{c+s} - Λ_k))``
  (the flush route's "outputs from S1 + new rows" is the same quantity); the
  Gram ``B·Cᵀ`` is computed once per program for its heads;
* ``S0 Cᵀ``: the TMA kernel reads the tile in shared memory; the LDG kernel loads
  the whole tile (first: it needs only the page) or streams it in column chunks
  through a pipelined loop (config ``NC``);
* the flush decision ``c + q > W`` is taken per row on the device from the
  cursors; a flush row also folds the history into the checkpoint
  (``S1 = e^{AΛ_h} S0 + (X_h w)ᵀ B_h``, N chunk by N chunk) and stores it, so
  one launch serves a mixed batch and nothing syncs.

All math is fp32 (loads are upcast first, which also keeps the CPU
interpreter exact); on the GPU the small products use tensor cores (exact
16-bit products for B·C, tf32 for the output terms, and for the stored fold
two tf32 products of a hi/lo split of ``X_h w`` against the 16-bit ``B_h``,
which tf32 holds exactly; 3xTF32 for fp32 rings). Padding rows (page 0) exit at
once and write nothing. Tensors are read and written contiguously along P and N
(stride 1 there, as every cache tensor and the manager's inputs are).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops.reference import check_row_cursors_shape

Tensor = torch.Tensor

#: Triton runs kernels on CPU tensors only through its interpreter, chosen when
#: the kernels are decorated (module import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: the TMA kernel's diagnostics trace (``replay_verify(trace=...)``): int64 stamps per program, and the segments
#: (a row's run of heads) whose stamps it keeps (later ones share the last slots)
TRACE_SLOTS = 32
TRACE_SEGS = 5
_TRACE_SLOTS: tl.constexpr = tl.constexpr(TRACE_SLOTS)
_TRACE_SEGS: tl.constexpr = tl.constexpr(TRACE_SEGS)



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
    w = tl.where(is_hist, dth * _decay(A, tot - lam), 0.0)
    upd = tl.dot(XT * w[None, :], Bseq, input_precision=PREC)
    return S * _decay(A, tot) + upd


# -- verify -------------------------------------------------------------------------------


@triton.jit
def _tf32_split(v):
    """``v = hi + lo`` with ``hi`` exact in tf32 (10 mantissa bits): two tf32 products give ~fp32."""
    hi = (v.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, v - hi


@triton.jit
def _wrap(i, R):
    """``i % R`` for ``0 <= i < 3R`` (ring rows): two selects instead of an integer division."""
    i = tl.where(i >= R, i - R, i)
    return tl.where(i >= R, i - R, i)


@triton.jit
def _prefetch_l2(addr, nbytes):
    """Ask the TMA unit to stream ``nbytes`` (a multiple of 16) from ``addr`` (16-byte aligned) into L2.

    A hint with no result: thread 0 issues one ``cp.async.bulk.prefetch.L2``, so DRAM streams the
    bytes while the program's dependent loads go on; the later load of them hits L2. GPU only
    (inline PTX): the interpreter cannot run it.
    """
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stamp(trace, slot, dep, TRACE: tl.constexpr):
    """Diagnostics (``TRACE``): store ``%globaltimer`` (ns; comparable across SMs, coarse on some GPUs) and the SM's
    ``%clock64`` (cycles) at ``trace[slot]`` once ``dep`` (an int32 scalar the stamp waits for) is known. GPU only
    (inline PTX); nothing is emitted without ``TRACE``."""
    if TRACE:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=tl.int64,
                                      is_pure=False, pack=1)
        k = tl.inline_asm_elementwise("mov.u64 $0, %clock64; // $1", "=l,r", [dep], dtype=tl.int64,
                                      is_pure=False, pack=1)
        tl.store(trace + 2 * slot, t)
        tl.store(trace + 2 * slot + 1, k)


@triton.jit
def _pdl_wait():
    """In a program launched as a programmatic dependent (``pdl=True``): wait for the kernel before to end (at once
    where the program has waited already), then let the next kernel launch. Always in that order: once every
    program has triggered or exited the next kernel may start, and it must never start while the kernel before
    this one runs, since its own early reads count on every kernel before it having ended. So a program that
    skipped its work (a padding row, the other route) calls this before it exits, too."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _decay(A, lam):
    """``e^{A lam}``, clamped at 1 (A < 0, lam >= 0: only rounding can push the exponent above 0)."""
    return tl.exp(tl.minimum(A * lam, 0.0))


@triton.jit
def _fold_weights(XT, dth, A, FOLD_SPLIT: tl.constexpr):
    """The fold's factors: ``XTw = X_hᵀ diag(w)`` with ``w_k = dt_k e^{A(Λ - Λ_k)}``, its tf32 hi/lo
    split (FOLD_SPLIT; else both are ``XTw``), and the carry ``e^{AΛ}`` of the checkpoint."""
    tot = tl.sum(dth, axis=0)
    XTw = XT * (dth * _decay(A, tot - tl.cumsum(dth, axis=0)))[None, :]
    if FOLD_SPLIT:
        hi, lo = _tf32_split(XTw)
    else:
        hi, lo = XTw, XTw
    return XTw, hi, lo, _decay(A, tot)


@triton.jit
def _fold_tile(S0, XTw, hi, lo, carry, Bh, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr):
    """The whole tile's fold ``e^{AΛ} S0 + (X_h w)ᵀ B_h`` in fp32 from :func:`_fold_weights`' factors (``Bh``: fp32,
    zero past the history)."""
    S1 = S0.to(tl.float32) * carry
    if FOLD_SPLIT:  # B_h exact in tf32 (16-bit ring): split only the x side, two tf32 dots
        S1 = tl.dot(hi, Bh, acc=S1, input_precision="tf32")
        S1 = tl.dot(lo, Bh, acc=S1, input_precision="tf32")
    else:
        S1 = tl.dot(XTw, Bh, acc=S1, input_precision=FOLD_PREC)
    return S1


@triton.jit
def _fold_chunk(Sc, ck, mc, oc, b_hist, is_hist, N_, XTw, hi, lo, ck_ptr, EVEN: tl.constexpr,
                FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr):
    """Store ``Sc + (X_h w)ᵀ B_h[:, oc]`` (``Sc``: the chunk's carried checkpoint) over the chunk ``ck``."""
    Bc = tl.load(b_hist[:, None] + oc[None, :], mask=is_hist[:, None] & (oc < N_)[None, :], other=0.0).to(tl.float32)
    if FOLD_SPLIT:  # B_h exact in tf32 (16-bit ring): split only the x side, two tf32 dots
        Sc = tl.dot(hi, Bc, acc=Sc, input_precision="tf32")
        Sc = tl.dot(lo, Bc, acc=Sc, input_precision="tf32")
    else:
        Sc = tl.dot(XTw, Bc, acc=Sc, input_precision=FOLD_PREC)
    if EVEN:
        tl.store(ck, Sc.to(ck_ptr.dtype.element_ty))
    else:
        tl.store(ck, Sc.to(ck_ptr.dtype.element_ty), mask=mc)


@triton.jit
def _load_chunk(ck, mc, EVEN: tl.constexpr):
    """A chunk of the checkpoint as fp32 (no mask where P and N fill the blocks)."""
    if EVEN:
        return tl.load(ck).to(tl.float32)
    else:
        return tl.load(ck, mask=mc, other=0.0).to(tl.float32)


@triton.jit
def _load_tile(ck_page, h, s_ck_h, mS, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
               EVEN: tl.constexpr):
    """Head ``h``'s checkpoint tile (BLOCK_P, BLOCK_N), in the checkpoint's dtype."""
    # offsets from constants only (the row stride S_CK_P is a constexpr): one base address per head
    ck = ck_page + h * s_ck_h + (tl.arange(0, BLOCK_P)[:, None] * S_CK_P + tl.arange(0, BLOCK_N)[None, :])
    if EVEN:  # no masks where P and N fill the blocks: fewer instructions
        return tl.load(ck)
    else:
        return tl.load(ck, mask=mS, other=0.0)


@triton.jit
def _head_tile(ck_page, h, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, EVEN: tl.constexpr,
               DOT_PREC: tl.constexpr, IDX64: tl.constexpr, FLUSH: tl.constexpr, FUSE: tl.constexpr):
    """What a head needs of its checkpoint for the outputs: the tile (NC = 0) or ``S0 Cᵀ`` streamed (NC > 0;
    nothing on a flush row, whose stream folds as it reads)."""
    if FLUSH and FUSE:
        return tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
    elif NC > 0:
        return _readout(ck_page, h, s_ck_h, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC, NS, EVEN,
                        DOT_PREC, IDX64)
    else:
        return _load_tile(ck_page, h, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)


@triton.jit
def _readout(ck_page, h, s_ck_h, c_rows, ms, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, EVEN: tl.constexpr,
             DOT_PREC: tl.constexpr, IDX64: tl.constexpr):
    """``S0 Cᵀ`` (BLOCK_P, BLOCK_S) for head ``h``, the tile streamed in NC-column chunks.

    A matmul K loop: the compiler pipelines the chunk loads over NS stages (cp.async into shared
    memory, read there by the tensor cores), so only NS chunks of shared memory and one small
    accumulator are held, instead of the whole tile.
    """
    acc = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
    for n0 in tl.range(0, BLOCK_N, NC, num_stages=NS):
        oc, ck, mc = _chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, NC, IDX64)
        acc, Sc = _readout_step(acc, ck, mc, oc, c_rows, ms, N_, EVEN, DOT_PREC)
    return acc


@triton.jit
def _chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, NC: tl.constexpr,
           IDX64: tl.constexpr):
    """Columns ``n0 .. n0 + NC - 1`` of head ``h``'s tile: their indices, pointers and mask."""
    oc = n0 + tl.arange(0, NC)
    if IDX64:
        oc = oc.to(tl.int64)
    ck = ck_page + h * s_ck_h + (tl.arange(0, BLOCK_P)[:, None] * S_CK_P + oc[None, :])
    return oc, ck, mp[:, None] & (oc < N_)[None, :]


@triton.jit
def _readout_step(acc, ck, mc, oc, c_rows, ms, N_, EVEN: tl.constexpr, DOT_PREC: tl.constexpr):
    """One chunk of the streamed readout: ``acc += S0[:, oc] C[:, oc]ᵀ``; returns the chunk too (fp32)."""
    Sc = _load_chunk(ck, mc, EVEN)
    Cc = tl.load(c_rows[None, :] + oc[:, None], mask=ms[None, :] & (oc < N_)[:, None], other=0.0)
    return tl.dot(Sc, Cc.to(tl.float32), acc, input_precision=DOT_PREC), Sc


@triton.jit
def _head_inputs(
    h, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms,
    xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h,
    A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr,
):
    """Head ``h``'s other global loads (issued together, so the loop keeps them in flight a head ahead)."""
    # x over the sequence, transposed (BLOCK_P, BLOCK_K): ring rows for k < c, the window's inputs after
    x_rows = tl.where(is_hist, xr_base + h * s_xr_h + ring * s_xr_r, x_ptr + h * s_x_h + tok * s_x_t)
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
    return X_raw, dth, dtn, A, Dh, dtb, zz


@triton.jit
def _verify_head(
    h, S, X_raw, dth, dtn, A, Dh, dtb, zz,
    ck_page, Cd, G, b_hist, N_, is_hist, is_new, causal, diag, ring, tw, offs_p, mp, ms, pt,
    ck_ptr, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, out_ptr, s_o_t, s_o_h, s_ck_h,
    S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, EVEN: tl.constexpr,
    FLUSH: tl.constexpr, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
    c_rows, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, IDX64: tl.constexpr,
    FUSE: tl.constexpr,
):
    """One head of a verify row from its loaded inputs: outputs, ring append, and on a flush row the fold."""
    A = A.to(tl.float32)
    dtn = dtn.to(tl.float32)
    if HAS_DTB:
        dtn += dtb.to(tl.float32)
    if DT_SOFTPLUS:
        dtn = _softplus(dtn)
    dtn = tl.where(is_new, dtn, 0.0)
    dtp = tl.where(is_hist, dth, dtn)
    XT = X_raw.to(tl.float32)
    # y_s = e^{A Λ_w} S0 C_s + Σ_{k<=w} dt_k e^{A (Λ_w - Λ_k)} (B_k.C_s) x_k + D x_w, w = c + s
    lam = tl.cumsum(dtp, axis=0)
    lam_w = tl.sum(tl.where(diag, lam[:, None], 0.0), axis=0)
    F = tl.where(causal, G * dtp[:, None] * _decay(A, lam_w[None, :] - lam[:, None]), 0.0)
    if HAS_D:  # D x_w rides on the diagonal k = w of the factor matrix
        F += tl.where(diag, Dh.to(tl.float32), 0.0)
    Y = tl.dot(XT, F, input_precision=DOT_PREC)
    if FLUSH and FUSE:
        # one stream over S0 in NC-column chunks: the readout S0 Cᵀ and the fold
        # S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h of each chunk, stored over it (S0 read once)
        XTw, hi, lo, carry = _fold_weights(XT, dth, A, FOLD_SPLIT)
        S = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
        for n0 in tl.range(0, BLOCK_N, NC, num_stages=NS):
            oc, ck, mc = _chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, NC, IDX64)
            S, Sc = _readout_step(S, ck, mc, oc, c_rows, ms, N_, EVEN, DOT_PREC)
            _fold_chunk(Sc * carry, ck, mc, oc, b_hist, is_hist, N_, XTw, hi, lo, ck_ptr, EVEN, FOLD_SPLIT,
                        FOLD_PREC)
    if NC > 0:  # S is S0 Cᵀ (streamed readout)
        Y += S * _decay(A, lam_w)[None, :]
    else:
        Y += tl.dot(S.to(tl.float32), Cd, input_precision=DOT_PREC) * _decay(A, lam_w)[None, :]
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
    if FLUSH and not FUSE:
        # S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h over the c history rows, stored over S0 N chunk by N chunk:
        # each chunk of S0 is re-read (an L2 hit) so no full-tile accumulator is live next to S0
        XTw, hi, lo, carry = _fold_weights(XT, dth, A, FOLD_SPLIT)
        for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
            oc, ck, mc = _chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
            _fold_chunk(_load_chunk(ck, mc, EVEN) * carry, ck, mc, oc, b_hist, is_hist, N_, XTw, hi, lo, ck_ptr,
                        EVEN, FOLD_SPLIT, FOLD_PREC)


@triton.jit
def _verify_heads(
    h0, S, ck_page, Cd, G, b_hist, N_, is_hist, is_new, is_seq, causal, diag, ring, tok, tw, offs_p, mp, mS, ms, pt,
    ck_ptr, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h,
    A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h,
    S_CK_P: tl.constexpr, HPP: tl.constexpr, PREFETCH: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, EVEN: tl.constexpr, FLUSH: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
    c_rows, BLOCK_S: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, IDX64: tl.constexpr,
    FUSE: tl.constexpr,
):
    """Heads ``h0 .. h0 + HPP - 1`` of one row in a loop; ``S`` is head ``h0``'s tile, already in flight
    (NC = 0; with NC > 0 the loop streams each head's tile itself).

    PREFETCH double-buffers in registers: head i + 1's tile (1), or all its loads (2), are issued
    before head i computes, so their DRAM round trip is off the loop's critical path (the last step
    re-loads its own head, L2 hits, instead of a masked load).
    """
    if NC > 0:
        S = _head_tile(ck_page, h0, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC, NS,
                       EVEN, DOT_PREC, IDX64, FLUSH, FUSE)
    X_raw, dth, dtn, A, Dh, dtb, zz = _head_inputs(
        h0, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t,
        dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h,
        HAS_D, HAS_DTB, HAS_Z)
    for i in range(HPP):
        hn = h0 + tl.minimum(i + 1, HPP - 1)
        if (PREFETCH >= 1) and (HPP > 1):  # the next head's tile (or readout) before this head computes
            S2 = _head_tile(ck_page, hn, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC, NS,
                            EVEN, DOT_PREC, IDX64, FLUSH, FUSE)
        if (PREFETCH >= 2) and (HPP > 1):  # and its other loads
            X2, dth2, dtn2, A2, D2, dtb2, zz2 = _head_inputs(
                hn, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h,
                s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr, s_z_t, s_z_h,
                HAS_D, HAS_DTB, HAS_Z)
        _verify_head(h0 + i, S, X_raw, dth, dtn, A, Dh, dtb, zz,
                     ck_page, Cd, G, b_hist, N_, is_hist, is_new, causal, diag, ring, tw, offs_p, mp, ms, pt,
                     ck_ptr, xr_base, s_xr_h, s_xr_r, dtr_base, s_dtr_h, s_dtr_r, out_ptr, s_o_t, s_o_h, s_ck_h,
                     S_CK_P, BLOCK_P, BLOCK_N, FOLD_N, EVEN, FLUSH, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS,
                     DOT_PREC, FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, FUSE)
        if HPP > 1:
            if PREFETCH >= 1:
                S = S2
            else:
                S = _head_tile(ck_page, hn, s_ck_h, mS, c_rows, ms, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, BLOCK_S, NC,
                               NS, EVEN, DOT_PREC, IDX64, FLUSH, FUSE)
            if PREFETCH >= 2:
                X_raw, dth, dtn, A, Dh, dtb, zz = X2, dth2, dtn2, A2, D2, dtb2, zz2
            else:
                X_raw, dth, dtn, A, Dh, dtb, zz = _head_inputs(
                    hn, is_hist, is_new, is_seq, ring, tok, tw, offs_p, mp, ms, xr_base, s_xr_h, s_xr_r, x_ptr,
                    s_x_h, s_x_t, dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr, z_ptr,
                    s_z_t, s_z_h, HAS_D, HAS_DTB, HAS_Z)


@triton.jit
def _replay_verify_kernel(
    ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, P, N,
    s_ck_pg, s_ck_h,
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
    NATIVE_G: tl.constexpr, PREFETCH: tl.constexpr, NC: tl.constexpr, NS: tl.constexpr, FUSE: tl.constexpr,
    GDC: tl.constexpr,
):
    # One program: one row, HPP heads of one group (a loop whose checkpoint loads the compiler
    # pipelines), one tile of BLOCK_P head-dim rows. What depends on the group only (cursors,
    # B and C tiles, the Gram B·Cᵀ) is computed once for the HPP heads.
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
        if NC > 0:  # streamed: the readout (or a flush row's fold) starts in the head loop
            S = tl.zeros((BLOCK_P, BLOCK_S), dtype=tl.float32)
        else:
            S = _load_tile(ck_page, h0, s_ck_h, mS, S_CK_P, BLOCK_P, BLOCK_N, EVEN)
        c = tl.load(nc_ptr + page)
        rs = tl.load(rs_ptr + page)
        if GDC:  # a programmatic dependent (pdl=True): the step's inputs only after the kernel before has ended
            _pdl_wait()
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
                          z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h, S_CK_P, HPP, PREFETCH,
                          BLOCK_P, BLOCK_N, FOLD_N, EVEN, True, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, DOT_PREC,
                          FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, FUSE)
        else:
            _verify_heads(h0, S, ck_page, Cd, G, b_hist, N, is_hist, is_new, is_seq, causal, diag, ring, tok, tw,
                          offs_p, mp, mS, ms, pt, ck_ptr, xr_base, s_xr_h, s_xr_r, x_ptr, s_x_h, s_x_t,
                          dtr_base, s_dtr_h, s_dtr_r, dt_ptr, s_dt_t, s_dt_h, A_ptr, D_ptr, dtb_ptr,
                          z_ptr, s_z_t, s_z_h, out_ptr, s_o_t, s_o_h, s_ck_h, S_CK_P, HPP, PREFETCH,
                          BLOCK_P, BLOCK_N, FOLD_N, EVEN, False, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, DOT_PREC,
                          FOLD_SPLIT, FOLD_PREC, c_rows, BLOCK_S, NC, NS, IDX64, FUSE)
    if GDC:  # a program that skipped its row ends only after the kernel before too
        _pdl_wait()


# -- verify, TMA route -----------------------------------------------------------------------
#
# One program per (row, HEADS heads of one group, BLOCK_P rows of the head dim); several heads run in a
# software pipeline (_tma_heads). Every load of a head but the checkpoint is a plain gather (the cursors
# first, then the history and window rows); the checkpoint tile arrives by one TMA copy into shared memory
# and the readout's tensor-core product reads it there: on non-flush rows the tile never passes through
# registers, which is what kept the LDG routes issue-bound. Triton waits for a single copy where it is
# issued (docs/performance_log.md §7); in the pipelined loop it issues the next head's copy at the end of an
# iteration, so the next head's gathers go out into registers at the top of the iteration instead (§10),
# and an L2 prefetch (PF_AHEAD) starts the next tile's DRAM read there too. Optional L2 prefetches at the
# program's start (PF_*) stream the first tile and the rings while the cursors come back; measured useful
# only for grids under one program per SM (§8).
# Persistent launches (PERSIST, _verify_tma_kernel) run the same per-row work (_tma_program) over a route's
# rows ranked on the device: round-robin (row, head block) items, or (STREAM) an equal contiguous share of
# the heads per program, walked one group's heads at a time in a loop with a runtime count (§11). SPLIT runs
# the two routes as two launches, each built for its own register budget; PDL lets the second start while
# the first drains. TRACE (replay_verify's ``trace``) stamps each program's phases with the GPU's timers (§12).


@triton.jit
def _after(v, dep):
    """``v`` bit for bit, as a value the compiler cannot compute before ``dep`` (a scalar): an opaque zero from
    ``dep`` ORed into every element. GPU only (inline PTX)."""
    zero = tl.inline_asm_elementwise("mov.b32 $0, 0; // $1", "=r,r", [dep.to(tl.int32, bitcast=True)],
                                     dtype=tl.int32, is_pure=True, pack=1)
    return (v.to(tl.int32, bitcast=True) | zero).to(tl.float32, bitcast=True)


@triton.jit
def _tile_regs(ck_ptr, ck_row0, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """The checkpoint tile at row ``ck_row0`` of the (pages * H * P, N) view by plain loads into registers
    (``TILE_LDG``): unlike a TMA copy, which Triton waits for where it is issued, the loads are waited for at
    their first use, so whatever the program computes before its readout overlaps their round trip."""
    rows = ck_row0.to(tl.int64) + tl.arange(0, BLOCK_P)
    return tl.load(ck_ptr + rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])


@triton.jit
def _tma_gathers(h, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
                 s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p, is_hist,
                 is_new, is_seq, ms, HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr):
    """Head ``h``'s loads but its checkpoint tile: x over the sequence (K, BLOCK_P), the history's dt, the
    window's raw dt (+ dt_bias), A, D and the gate z (BLOCK_P, BLOCK_S); absent ones are A."""
    xr_h = xr_ptr + page * s_xr_pg + h * s_xr_h
    x_rows = tl.where(is_hist, xr_h + ring * s_xr_r, x_ptr + h * s_x_h + tok * s_x_t)
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
    return X_raw, dth, dtn, A, Dh, zz


@triton.jit
def _tma_head(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
              last, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
              s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p, is_hist,
              is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_raw, dth, dtn, A, Dh, zz, S_pre,
              P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr,
              HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
              READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
              IDX64: tl.constexpr, FLUSH: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr,
              NEXT: tl.constexpr, PRE_TILE: tl.constexpr, TMA_STORE: tl.constexpr):
    """Head ``h0 + i`` of a :func:`_tma_heads` loop whose last head is ``h0 + last``; its gathers
    (``X_raw`` .. ``zz``) were issued one iteration earlier. Returns head ``i + 1``'s gathers, issued here
    (``NEXT``; else this head's again)."""
    h = h0 + i
    if PF_AHEAD > 0:  # clamped, not masked: no branch in the pipelined body (a repeat hits L2)
        ahead = tl.minimum(i + PF_AHEAD, last)
        _prefetch_l2(ck_ptr + (ck_row0 + ahead * P).to(tl.int64) * BLOCK_N, PF_TILE)
    if NEXT:  # the next head's gathers go out now, into registers, and land while this head computes
        X_n, dth_n, dtn_n, A_n, D_n, zz_n = _tma_gathers(
            h0 + tl.minimum(i + 1, last), page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr,
            z_ptr, s_xr_pg, s_xr_h, s_xr_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t,
            s_z_h, ring, tok, tw, offs_p, is_hist, is_new, is_seq, ms, HAS_D, HAS_DTB, HAS_Z)
    else:
        X_n, dth_n, dtn_n, A_n, D_n, zz_n = X_raw, dth, dtn, A, Dh, zz
    xr_h = xr_ptr + page * s_xr_pg + h * s_xr_h
    dtr_h = dtr_ptr + page * s_dtr_pg + h * s_dtr_h
    # the checkpoint tile: one TMA copy into shared memory
    if PRE_TILE:  # EARLY 3: one head per program, its tile loaded by the caller before the Gram
        S0 = S_pre
    else:
        S0 = ck_desc.load([ck_row0 + i * P, 0])
    # Λ over the sequence, the causal factors F[k, s] = (B_k·C_s) dt_k e^{A (Λ_{c+s} - Λ_k)}
    if DT_SOFTPLUS:
        dtn = _softplus(dtn)
    dtn = tl.where(is_new, dtn, 0.0)
    dtp = tl.where(is_hist, dth, dtn)
    lam = tl.cumsum(dtp, axis=0)
    lam_w = tl.sum(tl.where(diag, lam[:, None], 0.0), axis=0)
    F = tl.where(causal, Gm * dtp[:, None] * _decay(A, lam_w[None, :] - lam[:, None]), 0.0)
    if HAS_D:  # D x_w rides on the diagonal k = w of the factor matrix
        F += tl.where(diag, Dh, 0.0)
    if PRE_TILE == 2:  # TILE_LDG: the tile in registers reaches shared memory (or the product) only after the factors
        S0 = _after(S0, tl.sum(tl.sum(F, axis=1), axis=0))
    # y_s = e^{A Λ_w} S0 C_s + Σ_k F[k, s] x_k: the readout from shared memory, then the sequence,
    # both products into one accumulator (the decays scale the readout's columns)
    if READ16:  # 16-bit checkpoint in C's dtype: exact products, decays on the accumulator
        Y = tl.dot(S0, CwT) * _decay(A, lam_w)[None, :]
    else:  # the decays on the accumulator too: C's operand is the same for every head of the loop
        Y = tl.dot(S0.to(tl.float32), CwT, input_precision=DOT_PREC) * _decay(A, lam_w)[None, :]
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
    if fold:
        # flush row: S1 = e^{A Λ_h} S0 + (X_h w)ᵀ B_h over the c history rows, stored over S0
        XTw, hi, lo_, carry = _fold_weights(XT, dth, A, FOLD_SPLIT)
        ck_page = ck_ptr + page * s_ck_pg + pt * BLOCK_P * BLOCK_N
        mp = offs_p < P
        if FOLD_N >= BLOCK_N:  # the whole tile from shared memory, B_h from the hoisted sequence rows
            if FLUSH == 1:
                Bf = Bh
            else:
                Bf = tl.where(is_hist[:, None], B_raw.to(tl.float32), 0.0)
            S1 = _fold_tile(S0, XTw, hi, lo_, carry, Bf, FOLD_SPLIT, FOLD_PREC)
            if TMA_STORE:  # registers to shared memory, then one asynchronous bulk copy to the tile's place
                ck_desc.store([ck_row0 + i * P, 0], S1.to(ck_ptr.dtype.element_ty))
            else:
                oc, ck, mc = _chunk(ck_page, h, s_ck_h, 0, mp, N, BLOCK_N, BLOCK_P, BLOCK_N, IDX64)
                tl.store(ck, S1.to(ck_ptr.dtype.element_ty))
        else:  # N chunk by N chunk (chunks re-read, L2 hits, so no full-tile accumulator is live)
            b_hist = Br_base + ring * s_Br_r
            for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
                oc, ck, mc = _chunk(ck_page, h, s_ck_h, n0, mp, N, BLOCK_N, BLOCK_P, FOLD_N, IDX64)
                _fold_chunk(_load_chunk(ck, mc, True) * carry, ck, mc, oc, b_hist, is_hist, N, XTw, hi, lo_,
                            ck_ptr, True, FOLD_SPLIT, FOLD_PREC)
    return X_n, dth_n, dtn_n, A_n, D_n, zz_n


@triton.jit
def _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
               nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
               s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p, is_hist,
               is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, P: tl.constexpr, HEADS: tl.constexpr,
               HSTAGES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr,
               HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
               READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
               IDX64: tl.constexpr, FLUSH: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr,
               DYN: tl.constexpr, FIRST: tl.constexpr, TMA_STORE: tl.constexpr):
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
    if FIRST:  # EARLY: issued by the caller before its Gram
        X_n, dth_n, dtn_n, A_n, D_n, zz_n, S_pre = first
    else:
        S_pre = B_raw
        X_n, dth_n, dtn_n, A_n, D_n, zz_n = _tma_gathers(
            h0, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
            s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p, is_hist,
            is_new, is_seq, ms, HAS_D, HAS_DTB, HAS_Z)
    if DYN:
        i = 0
        while i < nh:
            X_n, dth_n, dtn_n, A_n, D_n, zz_n = _tma_head(
                ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
                nh - 1, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h,
                s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_n, dth_n, dtn_n, A_n, D_n,
                zz_n, S_pre, P, BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC,
                FOLD_SPLIT, FOLD_PREC, IDX64, FLUSH, PF_AHEAD, PF_TILE, True, False, TMA_STORE)
            i += 1
    else:
        for i in tl.range(0, HEADS, num_stages=HSTAGES):
            X_n, dth_n, dtn_n, A_n, D_n, zz_n = _tma_head(
                ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0, i,
                HEADS - 1, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h,
                s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, Bh, B_raw, fold, X_n, dth_n, dtn_n, A_n, D_n,
                zz_n, S_pre, P, BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC,
                FOLD_SPLIT, FOLD_PREC, IDX64, FLUSH, PF_AHEAD, PF_TILE, HEADS > 1, (FIRST - 1) if FIRST >= 2 else 0, TMA_STORE)


@triton.jit
def _tma_body(
    page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, trace, slot, S_in,
    P: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    GRAM16: tl.constexpr, READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr,
    FOLD_PREC: tl.constexpr, IDX64: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr, ROUTE: tl.constexpr,
    DYN: tl.constexpr, TRACE: tl.constexpr, EARLY: tl.constexpr, FMODE: tl.constexpr, TILE_IN: tl.constexpr,
    TMA_STORE: tl.constexpr, TILE_LDG: tl.constexpr,
):
    """:func:`_tma_program` once the row's cursors are known: the sequence of ``BLOCK_K`` rows (history, then the
    window), the shared B rows and Gram, then the heads. ``FMODE``: the row's route when the caller branched on it
    (0 non-flush, 1 flush: that route's build only), else -1 (the heads decide, as ``ROUTE`` says). ``TILE_IN``
    (with ``EARLY`` 3): the head's checkpoint tile is ``S_in``, copied by the caller."""
    (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
     dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t,
     s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r) = rt
    kk = tl.arange(0, BLOCK_K)
    is_hist = kk < c
    is_new = (kk >= c) & (kk < c + q)
    is_seq = kk < c + q
    ring = _wrap(rs + kk, R)  # ring row of sequence position k (history and appended alike)
    tok = lo + tl.maximum(kk - c, 0)
    if IDX64:
        ring = ring.to(tl.int64)
        tok = tok.to(tl.int64)
    Br_base = Br_ptr + page * s_Br_pg + g * s_Br_g
    # EARLY: the first head's gathers need only the cursors, so they go out beside B's rows (1: after them;
    # 2, 3: before them) instead of after the Gram; 3 (one head per program): its tile too, whose copy then
    # overlaps the gathers' round trip
    if EARLY >= 2:
        X0, dth0, dtn0, A0, D0, zz0 = _tma_gathers(
            h0, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
            s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p,
            is_hist, is_new, is_seq, ms, HAS_D, HAS_DTB, HAS_Z)
    b_rows = tl.where(is_hist, Br_base + ring * s_Br_r, B_ptr + g * s_B_g + tok * s_B_t)
    B_raw = tl.load(b_rows[:, None] + offs_n[None, :], mask=is_seq[:, None], other=0.0)  # (K, BLOCK_N)
    if EARLY == 1:
        X0, dth0, dtn0, A0, D0, zz0 = _tma_gathers(
            h0, page, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, s_xr_pg, s_xr_h, s_xr_r,
            s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, ring, tok, tw, offs_p,
            is_hist, is_new, is_seq, ms, HAS_D, HAS_DTB, HAS_Z)
    if TILE_IN:
        S_pre = S_in
    elif EARLY == 3:
        if TILE_LDG > 0:
            S_pre = _tile_regs(ck_ptr, ck_row0, BLOCK_P, BLOCK_N)
        else:
            S_pre = ck_desc.load([ck_row0, 0])
    else:
        S_pre = B_raw  # unused: the heads load their own tiles
    if EARLY == 0:
        first = (B_raw, B_raw, B_raw, B_raw, B_raw, B_raw, B_raw)  # unused: the heads load their own
    else:
        first = (X0, dth0, dtn0, A0, D0, zz0, S_pre)
    if GRAM16:  # 16-bit B and C: exact products, fp32 accumulation
        Gm = tl.dot(B_raw, tl.trans(Cw))
    else:
        Gm = tl.dot(B_raw.to(tl.float32), tl.trans(Cw.to(tl.float32)), input_precision=DOT_PREC)
    if (pt == 0) & (h0 % HPG == 0):  # the group's first program appends the window's B rows to the ring
        tl.store(Br_base + ring[:, None] * s_Br_r + offs_n[None, :], B_raw, mask=is_new[:, None])
    if TRACE:
        _stamp(trace, slot + 2, tl.sum(tl.sum(Gm, axis=1), axis=0).to(tl.int32, bitcast=True), TRACE)
    pos = c + ss
    causal = is_seq[:, None] & (kk[:, None] <= pos[None, :]) & ms[None, :]
    diag = (kk[:, None] == pos[None, :]) & ms[None, :]
    CwT = tl.trans(Cw) if READ16 else tl.trans(Cw.to(tl.float32))  # the readout's operand, for every head
    flush = c + q > window
    # the fold mode as a constant where it is known at compile time (one route's rows; one head deciding inside
    # its loop), else one call per route so each loop body holds only its own values: a static loop over the
    # modes compiled to a different build (200 more instructions, 255 registers), not the one measured
    # _tma_heads' FIRST: 0 it loads the first head's gathers itself, 1 they are ``first``, 2 also its tile (EARLY 3)
    FIRST: tl.constexpr = ((3 if TILE_LDG == 2 else 2) if EARLY == 3 else 1) if EARLY else 0
    if FMODE >= 0:  # the caller branched on the route: this build holds that route only
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, IDX64, FMODE, PF_AHEAD, PF_TILE, DYN, FIRST, TMA_STORE)
    elif ROUTE != 0 or (HEADS == 1 and not DYN):
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, IDX64, (ROUTE - 1) if (HEADS > 1 or DYN) else 2, PF_AHEAD, PF_TILE, DYN, FIRST, TMA_STORE)
    elif flush:
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, IDX64, 1, PF_AHEAD, PF_TILE, DYN, FIRST, TMA_STORE)
    else:
        _tma_heads(ck_desc, ck_ptr, xr_ptr, dtr_ptr, x_ptr, dt_ptr, A_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr, page, h0,
                   nh, ck_row0, pt, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r,
                   s_x_t, s_x_h, s_dt_t, s_dt_h, s_z_t, s_z_h, s_o_t, s_o_h, Br_base, ring, tok, tw, offs_p,
                   is_hist, is_new, is_seq, ms, causal, diag, Gm, CwT, B_raw, flush, first, P, HEADS, HSTAGES,
                   BLOCK_P, BLOCK_N, FOLD_N, HAS_D, HAS_DTB, HAS_Z, DT_SOFTPLUS, READ16, DOT_PREC, FOLD_SPLIT,
                   FOLD_PREC, IDX64, 0, PF_AHEAD, PF_TILE, DYN, FIRST, TMA_STORE)
    _stamp(trace, slot + 3, nh, TRACE)
    if TRACE:
        tl.store(trace + 2 * (slot + 4), nh)


@triton.jit
def _tma_program(
    pt, h0_32, nh, row, rt, trace, slot,
    P: tl.constexpr, NPT: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    GRAM16: tl.constexpr, READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr,
    FOLD_PREC: tl.constexpr, IDX64: tl.constexpr, PF_CK: tl.constexpr, PF_X: tl.constexpr, PF_B: tl.constexpr,
    PF_DT: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr, ROUTE: tl.constexpr, DYN: tl.constexpr,
    TRACE: tl.constexpr, EARLY: tl.constexpr, ROWCUR: tl.constexpr, BLOCK_KN: tl.constexpr,
    KSPLIT: tl.constexpr, GDC: tl.constexpr, TMA_STORE: tl.constexpr, TILE_LDG: tl.constexpr,
):
    """One program's work of the TMA verify kernel: row ``row``, P tile ``pt``, the ``HEADS`` heads of one group
    from ``h0_32`` (``DYN``: ``nh`` of them, counted at run time); ``ROUTE`` 0 serves every row, 1 only non-flush
    rows, 2 only flush rows (the others exit after their cursor). ``TRACE``: stamps at ``trace[slot .. slot + 3]``:
    the segment's start, its cursors known, its Gram done, its heads done (:func:`_stamp`), and at ``slot + 4`` its
    head count. ``ROWCUR``: the row's cursors come from the per-step row cursors (``rc``), loaded beside the page
    id, instead of from its page after it. ``KSPLIT``: non-flush rows take a ``BLOCK_KN``-row sequence tile
    (:func:`_tma_body`). ``GDC`` (``pdl=True``): 1 the program waits for the kernel before after its cursors and L2
    prefetches, 2 also after its tile's TMA copy (EARLY 3), then lets the next kernel launch; 0 no wait."""
    (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
     dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r, s_Br_pg,
     s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t, s_C_g, s_z_t,
     s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r) = rt
    _stamp(trace, slot, row, TRACE)
    page32 = tl.load(page_ptr + row)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if ROWCUR:  # the row's cursors, gathered once per step: in the page id's round trip, not one after it
        c_row = tl.load(rc_ptr + s_rc_k + row * s_rc_r)
        rs_row = tl.load(rc_ptr + row * s_rc_r)
    keep = (page32 != 0) & (q > 0)
    if ROWCUR:  # cursors are never negative: the test only keeps the compiler from sinking their loads past
        # this branch (behind the page id's round trip, which is what they are here to avoid)
        keep = keep & ((c_row | rs_row) >= 0)
    if ROUTE != 0:  # one route's rows only: the other's exit after their cursor (without ROWCUR, one more round trip)
        if ROWCUR:
            c_route = c_row
        else:
            c_route = tl.load(nc_ptr + page32.to(tl.int64), mask=keep, other=0)
        keep = keep & ((c_route + q > window) == (ROUTE == 2))
    if keep:
        ck_row0 = (page32 * H + h0_32) * P + pt * BLOCK_P  # the first head's tile row in the (pages * H * P, N) view
        page = page32.to(tl.int64)
        h0 = h0_32.to(tl.int64)
        g = h0 // HPG
        # L2 prefetches (bytes; 0 = off): the first head's tile and x ring, the group's B ring stream into L2
        # while the cursors and gathers make their dependent round trips
        if PF_CK:
            _prefetch_l2(ck_ptr + ck_row0.to(tl.int64) * BLOCK_N, PF_CK)
        if PF_X:
            _prefetch_l2(xr_ptr + page * s_xr_pg + h0 * s_xr_h, PF_X)
        if PF_B:
            _prefetch_l2(Br_ptr + page * s_Br_pg + g * s_Br_g, PF_B)
        if PF_DT:
            _prefetch_l2(dtr_ptr + page * s_dtr_pg + h0 * s_dtr_h, PF_DT)
        # GDC (a programmatic dependent, pdl=True): the page id, cursors and the prefetches above went out while
        # the kernel before ran, and with GDC 2 (EARLY 3) the head's tile copy too; the step's inputs (x, B, C,
        # dt, z) only after that kernel has ended
        TILE_IN: tl.constexpr = GDC == 2 and EARLY == 3
        if TILE_IN:
            if TILE_LDG > 0:
                S_in = _tile_regs(ck_ptr, ck_row0, BLOCK_P, BLOCK_N)
            else:
                S_in = ck_desc.load([ck_row0, 0])
        else:
            S_in = page  # unused
        if GDC:
            _pdl_wait()
        offs_p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        ss = tl.arange(0, BLOCK_S)
        ms = ss < q
        tw = lo + ss
        if IDX64:  # the interpreter checks every int32 vector op for overflow: int64 skips it
            offs_p = offs_p.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
            tw = tw.to(tl.int64)
        # what the heads share: C over the window, the cursors, the sequence's B rows and the Gram B·Cᵀ
        Cw = tl.load(C_ptr + tw[:, None] * s_C_t + g * s_C_g + offs_n[None, :], mask=ms[:, None], other=0.0)
        if ROWCUR:
            c = c_row
            rs = rs_row
        else:
            c = tl.load(nc_ptr + page)
            rs = tl.load(rs_ptr + page)
        _stamp(trace, slot + 1, c + rs, TRACE)
        # KSPLIT: a non-flush row's sequence is at most W rows (c + q <= W), so its build takes a tile of BLOCK_KN
        # rows, not the ring's BLOCK_K: each route its own build (one launch for both routes: a branch on the route)
        if KSPLIT and ROUTE == 0 and BLOCK_KN < BLOCK_K:
            if c + q > window:
                _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, trace, slot,
                          S_in, P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, HAS_D, HAS_DTB,
                          HAS_Z, DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_AHEAD, PF_TILE,
                          ROUTE, DYN, TRACE, EARLY, 1, TILE_IN, TMA_STORE, TILE_LDG)
            else:
                _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, trace, slot,
                          S_in, P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_KN, BLOCK_S, HAS_D, HAS_DTB,
                          HAS_Z, DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_AHEAD, PF_TILE,
                          ROUTE, DYN, TRACE, EARLY, 0, TILE_IN, TMA_STORE, TILE_LDG)
        else:  # one route's rows (SPLIT's non-flush launch: the short tile), or one build for both
            BK: tl.constexpr = BLOCK_KN if KSPLIT and ROUTE == 1 else BLOCK_K
            _tma_body(page, h0, g, pt, nh, q, lo, c, rs, ck_row0, offs_p, offs_n, ss, ms, tw, Cw, rt, trace, slot, S_in,
                      P, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BK, BLOCK_S, HAS_D, HAS_DTB, HAS_Z,
                      DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_AHEAD, PF_TILE, ROUTE,
                      DYN, TRACE, EARLY, -1, TILE_IN, TMA_STORE, TILE_LDG)


@triton.jit
def _verify_tma_kernel(
    rows,
    ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr,
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, out_ptr,
    page_ptr, cu_ptr,
    window, R, H, N,
    s_ck_pg, s_ck_h,
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
    trace_ptr,
    P: tl.constexpr, NPT: tl.constexpr, HPG: tl.constexpr, HEADS: tl.constexpr, HSTAGES: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, FOLD_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DTB: tl.constexpr, HAS_Z: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    GRAM16: tl.constexpr, READ16: tl.constexpr, DOT_PREC: tl.constexpr, FOLD_SPLIT: tl.constexpr,
    FOLD_PREC: tl.constexpr, IDX64: tl.constexpr, PF_CK: tl.constexpr, PF_X: tl.constexpr, PF_B: tl.constexpr,
    PF_DT: tl.constexpr, PF_AHEAD: tl.constexpr, PF_TILE: tl.constexpr,
    ROUTE: tl.constexpr, PERSIST: tl.constexpr, BLOCK_ROWS: tl.constexpr, FLUSH_W: tl.constexpr,
    NONFLUSH_W: tl.constexpr, PDL: tl.constexpr, TRACE: tl.constexpr, EARLY: tl.constexpr, ROWCUR: tl.constexpr,
    BLOCK_KN: tl.constexpr, KSPLIT: tl.constexpr, GDC: tl.constexpr, TMA_STORE: tl.constexpr,
    TILE_LDG: tl.constexpr,
):
    # what every program passes on but the constants (a tuple's constants would lose their constexpr type)
    rt = (ck_desc, ck_ptr, xr_ptr, Br_ptr, dtr_ptr, rs_ptr, nc_ptr, rc_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr,
          dtb_ptr, z_ptr, out_ptr, page_ptr, cu_ptr, window, R, H, N, s_ck_pg, s_ck_h, s_xr_pg, s_xr_h, s_xr_r,
          s_Br_pg, s_Br_g, s_Br_r, s_dtr_pg, s_dtr_h, s_dtr_r, s_x_t, s_x_h, s_dt_t, s_dt_h, s_B_t, s_B_g, s_C_t,
          s_C_g, s_z_t, s_z_h, s_o_t, s_o_h, s_rc_k, s_rc_r)
    # TRACE: this program's _TRACE_SLOTS stamps: its start, (persistent) its rows ranked, 5 per segment (the first
    # _TRACE_SEGS; _tma_program), its segment count and its end
    trace = trace_ptr + (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)) * (2 * _TRACE_SLOTS)
    _stamp(trace, 0, tl.program_id(0), TRACE)
    if PDL == 1 and not GDC:  # the first of two launches: the second may start as soon as SMs free up (GPU
        # only; with GDC each program lets it start once past its wait, in _tma_program)
        tl.extra.cuda.gdc_launch_dependents()
    if PERSIST == 0:  # one program per (row, head block, P tile)
        pid = tl.program_id(0)
        _tma_program(pid % NPT, (pid // NPT) * HEADS, HEADS, tl.program_id(1), rt, trace, 2,
            P, NPT, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, HAS_D, HAS_DTB, HAS_Z,
            DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_CK, PF_X, PF_B, PF_DT, PF_AHEAD,
            PF_TILE, ROUTE, False, TRACE, EARLY, ROWCUR, BLOCK_KN, KSPLIT, GDC, TMA_STORE, TILE_LDG)
        segs = 1
    else:
        # a persistent grid over the route's rows (flush rows for ROUTE 2), ranked on the device: an empty route
        # costs one pass over the cursors
        ridx = tl.arange(0, BLOCK_ROWS)
        mr = ridx < rows
        pg = tl.load(page_ptr + ridx, mask=mr, other=0)
        qv = tl.load(cu_ptr + ridx + 1, mask=mr, other=0) - tl.load(cu_ptr + ridx, mask=mr, other=0)
        live = mr & (pg != 0) & (qv > 0)
        if ROWCUR:
            cv = tl.load(rc_ptr + s_rc_k + ridx * s_rc_r, mask=live, other=0)
        else:
            cv = tl.load(nc_ptr + pg.to(tl.int64), mask=live, other=0)
        sel = live & ((cv + qv > window) == (ROUTE == 2))
        one = sel.to(tl.int32)
        _stamp(trace, 1, tl.sum(one, axis=0), TRACE)
        segs = 0
        if PERSIST == 1:  # (row, head block, P tile) items dealt out round-robin
            rank = tl.where(sel, tl.cumsum(one, axis=0) - one, -1)  # the route's rows in order; -1 the others
            blocks = (H // HEADS) * NPT
            items = tl.sum(one, axis=0) * blocks
            k = tl.program_id(0)
            while k < items:  # a while loop: the interpreter's range() takes no tensor bounds
                r = tl.min(tl.where(rank == k // blocks, ridx, BLOCK_ROWS), axis=0)
                pid = k % blocks
                _tma_program(pid % NPT, (pid // NPT) * HEADS, HEADS, r, rt, trace,
                    2 + 5 * tl.minimum(segs, _TRACE_SEGS - 1),
                    P, NPT, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, HAS_D, HAS_DTB, HAS_Z,
                    DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_CK, PF_X, PF_B, PF_DT,
                    PF_AHEAD, PF_TILE, ROUTE, False, TRACE, EARLY, ROWCUR, BLOCK_KN, KSPLIT, GDC, TMA_STORE, TILE_LDG)
                segs += 1
                k += tl.num_programs(0)
        else:  # PERSIST 2: each program streams an equal, contiguous share of the (row, P tile, head) items' cost,
            # one group's heads at a time (a share ends on any head: no program waits on a longer block)
            per_row = NPT * H
            pid = tl.program_id(0).to(tl.int64)
            if ROUTE == 0:  # both routes in one launch: a flush row's head costs FLUSH_W / NONFLUSH_W of another's
                wr = tl.where(live, tl.where(cv + qv > window, FLUSH_W, NONFLUSH_W), 0)
                start = tl.cumsum(wr, axis=0) - wr  # a row's first item's cost offset, in rows of weight 1
                total = tl.sum(wr, axis=0).to(tl.int64) * per_row
                x = pid * total // tl.num_programs(0)
                end = (pid + 1) * total // tl.num_programs(0)
                while x < end:  # the items whose cost starts in [x, end): the row holding x, then the next
                    r = tl.max(tl.where((wr > 0) & (start.to(tl.int64) * per_row <= x), ridx, -1), axis=0)
                    w = tl.sum(tl.where(ridx == r, wr, 0), axis=0).to(tl.int64)
                    base = tl.sum(tl.where(ridx == r, start, 0), axis=0).to(tl.int64) * per_row
                    j = (x - base + w - 1) // w
                    j_end = tl.minimum((end - base + w - 1) // w, per_row)
                    pt = (j // H).to(tl.int32)
                    h = (j % H).to(tl.int32)
                    nh = tl.minimum(j_end - j, HPG - h % HPG).to(tl.int32)  # to the group's end or the share's
                    if nh > 0:
                        _tma_program(pt, h, nh, r, rt, trace, 2 + 5 * tl.minimum(segs, _TRACE_SEGS - 1),
                            P, NPT, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, HAS_D, HAS_DTB,
                            HAS_Z, DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_CK, PF_X,
                            PF_B, PF_DT, PF_AHEAD, PF_TILE, ROUTE, True, TRACE, EARLY,
                            ROWCUR, BLOCK_KN, KSPLIT, GDC, TMA_STORE, TILE_LDG)
                        segs += 1
                    x = tl.where(nh > 0, base + (j + nh) * w, base + per_row * w)  # past the segment, or the row
            else:  # one route's rows, every head of unit cost: route item x is head x % per_row of the route's
                # row x // per_row, so a share needs one rank lookup per segment instead of a weighted search
                rank = tl.where(sel, tl.cumsum(one, axis=0) - one, -1)  # the route's rows in order; -1 the others
                total = tl.sum(one, axis=0).to(tl.int64) * per_row
                x = pid * total // tl.num_programs(0)
                end = (pid + 1) * total // tl.num_programs(0)
                k = x // per_row
                r = tl.min(tl.where(rank == k, ridx, BLOCK_ROWS), axis=0)
                while x < end:
                    j = x - k * per_row
                    pt = (j // H).to(tl.int32)
                    h = (j % H).to(tl.int32)
                    nh = tl.minimum(end - x, HPG - h % HPG).to(tl.int32)  # to the group's (row's) end or the share's
                    _tma_program(pt, h, nh, r, rt, trace, 2 + 5 * tl.minimum(segs, _TRACE_SEGS - 1),
                        P, NPT, HPG, HEADS, HSTAGES, BLOCK_P, BLOCK_N, FOLD_N, BLOCK_K, BLOCK_S, HAS_D, HAS_DTB, HAS_Z,
                        DT_SOFTPLUS, GRAM16, READ16, DOT_PREC, FOLD_SPLIT, FOLD_PREC, IDX64, PF_CK, PF_X, PF_B, PF_DT,
                        PF_AHEAD, PF_TILE, ROUTE, True, TRACE, EARLY, ROWCUR, BLOCK_KN, KSPLIT, GDC, TMA_STORE, TILE_LDG)
                    segs += 1
                    x += nh
                    k = x // per_row
                    r = tl.min(tl.where(rank == k, ridx, BLOCK_ROWS), axis=0)  # the same row, or the route's next
    if PDL == 2:  # the second launch ends only once the first has (its rows are disjoint: nothing to wait for
        # before), so what follows both in the stream sees both launches' writes
        tl.extra.cuda.gdc_wait()
    if GDC:  # programs that met no row of theirs (or a persistent one's last) end after the kernel before too
        _pdl_wait()
    if TRACE:
        tl.store(trace + 2 * (_TRACE_SLOTS - 2), segs)
    _stamp(trace, _TRACE_SLOTS - 1, segs, TRACE)


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


#: peak DRAM GB/s per SM under which the big-batch TMA launches keep fewer bytes in flight per SM (verify_config):
#: the H100 80GB HBM3 is under it (3,352 GB/s over 132 SMs: 25.4), the H200 over it (4,800 over 132: 36.4)
_LEAN_GBPS_PER_SM = 30.0


def _dram_gbps_per_sm(device: torch.device) -> float:
    """Peak DRAM bandwidth per SM in GB/s, from the driver's memory clock and bus width; 0.0 where not reported."""
    if device.type != "cuda":
        return 0.0
    return _dram_gbps_per_sm_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _dram_gbps_per_sm_of(index: int) -> float:
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(index)
        return props["mem_clock_rate"] * props["mem_bus_width"] * 2 / 8e6 / props["multiprocessor_count"]
    except Exception:  # advisory only: a driver that cannot say gets the launches measured on the H200
        return 0.0


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def _block_p(P: int, cap: int) -> int:
    """Largest power-of-two tile <= cap that divides P (16 minimum; tails are masked)."""
    for b in (128, 64, 32, 16):
        if b <= cap and P % b == 0:
            return b
    return min(cap, _pow2(P))


def tma_block_p(P: int, N: int, device: torch.device) -> int:
    """Head-dim rows per program of the TMA kernel for this geometry, or 0 where it does not apply.

    One warpgroup's tensor-core tile is 64 rows (so P must be a multiple of 64 on the GPU); the
    interpreter takes any power-of-two tile >= 16 that divides P. The TMA box holds N whole:
    a power of two in [16, 256].
    """
    if N & (N - 1) or not 16 <= N <= 256:
        return 0
    if _compiled(device):
        return 64 if P % 64 == 0 else 0
    for b in (64, 32, 16):
        if P % b == 0:
            return b
    return 0


def tma_heads(H: int, G: int, cap: int = 16) -> int:
    """Heads per program of the TMA kernel's pipelined loop: the largest power of two <= ``cap`` dividing H / G."""
    hpg = H // max(G, 1)
    heads = 1
    while heads * 2 <= cap and hpg % (heads * 2) == 0:
        heads *= 2
    return heads


def tma_supported(checkpoint: Tensor, block_p: int) -> bool:
    """The TMA kernel can read ``checkpoint`` (pages, H, P, N) as (pages * H * P, N) tiles of ``block_p`` rows."""
    pages, H, P, N = checkpoint.shape
    return (block_p > 0 and P % block_p == 0 and tma_block_p(P, N, checkpoint.device) > 0
            and checkpoint.is_contiguous() and checkpoint.data_ptr() % 16 == 0)


def verify_config(rows: int, H: int, P: int, N: int, R: int, T: int, device: torch.device,
                  G: int = 1, kernel: str | None = None, state_size: int = 4, shape: bool = True) -> dict[str, Any]:
    """Launch heuristic for :func:`replay_verify` (no autotuning: the interpreter cannot run it).

    ``shape=False``: the TMA kernel's base launch only (one head per program, uncapped), for a caller that
    chooses the launch shape itself (a config naming ``HEADS``, ``HSTAGES``, ``SPLIT`` or ``STREAM``), so that
    none of the heuristic's shape keys (its register cap, L2 prefetches, heads, streams) leak into it.

    ``kernel``: "tma" or "ldg", or None to choose: the TMA kernel wherever the geometry allows
    (:func:`tma_block_p`) and, on the GPU, the ring has at most 32 rows (its 64-row sequence tile
    measured slower than the LDG kernel's), one head and 64 head-dim rows per program, registers
    capped at 96 (5 programs per SM), the head's gathers and tile copy issued beside B's rows (``EARLY`` 3:
    one dependent round trip fewer, 7-13 % faster at batch 1-32; on the streamed launches below it measured
    no faster, so they keep the plain order); a grid of at most one program per SM (batch 1) instead runs
    uncapped with L2 prefetches (``L2PF`` 2: measured 4-11 % faster there, slower at batch 8, within
    noise at 64-256 non-flush, 2-5 % faster on flush rows); a grid of at least 96 heads per SM and at
    most ``_STREAM_ROWS`` rows (batch 99-1024 at H=128) takes the route-split launches (``SPLIT`` 1,
    ``STREAM`` 2, ``PDL`` 1: persistent programs streaming equal shares of each route's heads, the
    non-flush launch at 3 programs per SM under a 168-register cap; on a card with under ``_LEAN_GBPS_PER_SM``
    of peak DRAM bandwidth per SM, such as the H100 80GB HBM3, 2 per SM uncapped, and the pipelined launch below
    from 15 of its programs per SM on: fewer bytes in flight per SM suffice there, measured faster on the H100 at
    batch 128 and 256); longer grids with 15 programs per SM
    when each takes a group's 16 heads run those heads in a 2-stage pipeline, uncapped,
    the next head's tile prefetched into L2 (``PFHEADS`` 1: 6 % faster on flush rows), flush rows folded
    from the shared-memory tile (measured 10 % faster non-flush, 1.5-4.5 % mixed there
    at T=2-8; slower mixed on shorter grids, where the flush rows' longer programs leave a tail); only as
    measured: 16 heads per program, 32 KB tiles (``state_size`` bytes per checkpoint element). For the
    LDG kernel, measured on the H200 (``docs/performance_log.md`` §6): one head per program (``HPP`` 1) with the
    registers capped at 80 (``maxnreg``: 6 programs per SM instead of 4-5) beat every multi-head
    program; once the grid has >= 16 programs per SM, streaming the checkpoint through a
    3-stage pipeline of 32-column chunks (``NC``/``NS``) beats loading the whole tile, which
    stays best for small batches. P is split only for grids under half a program per SM.
    The interpreter gets a whole group's heads per program (fewer, slower programs).
    """
    block_tma = tma_block_p(P, N, device)
    # the TMA kernel's sequence tiles on the GPU: pow2(R) rows for flush rows, pow2(W) (W = R - T) for non-flush
    # rows with KSPLIT; a 64-row tile for every row measured slower than the LDG kernel, one for flush rows only
    # (KSPLIT: W = 32, R = 36) 1.6-1.9x faster than it (session 13, run 2)
    long_ring = _pow2(R) > 32
    seq_ok = _pow2(R - T) <= 32
    if kernel is None:
        kernel = "tma" if block_tma and (seq_ok or not _compiled(device)) else "ldg"
    if kernel == "tma":
        cfg = {"KERNEL": "tma", "BLOCK_P": block_tma or 64, "num_warps": 4, "num_stages": 1, "FOLD_N": 32}
        if shape and _compiled(device) and seq_ok:
            programs = rows * H * (P // cfg["BLOCK_P"])
            # the pipelined launch only as measured: 16 heads per program, 32 KB tiles (fp32, 64 x 128)
            pipelined = tma_heads(H, G) == 16 and cfg["BLOCK_P"] * N * state_size == 32768
            sms = _num_sms(device)
            long_grid = programs // 16 >= 15 * sms
            # a card with less DRAM bandwidth per SM needs fewer bytes in flight per SM (below); asked only where
            # it matters, the streamed and pipelined grids
            lean = (pipelined and not long_ring and programs >= 96 * sms
                    and 0.0 < _dram_gbps_per_sm(device) < _LEAN_GBPS_PER_SM)
            if programs <= sms:
                # under one program per SM: latency-bound, the prefetches overlap the round trips; EARLY 3 (the
                # gathers and the tile copy beside B's rows): 6.62 -> 5.75 us at batch 1 (session 11, run 2). A flush
                # row folds in 64-column chunks (two L2 re-reads, not four), which fit uncapped. Against FOLD_N 32 in
                # one process (session 16, runs 2 / 3): W=16 flush 9.21 -> 8.97 / 9.18 -> 9.03 us, non-flush within
                # 1 %; W=32 non-flush 6.29 -> 5.78 / 6.28 -> 5.76 (the same rows' code, built differently), flush
                # 11.52 -> 11.15 / 11.42 -> 11.22. Whole tiles (FOLD_N 128) measured up to 14 % slower
                cfg.update(L2PF=2, EARLY=3, FOLD_N=64, **({"KSPLIT": 1} if long_ring else {}))
            elif pipelined and programs >= 96 * sms and rows <= _STREAM_ROWS and not (lean and long_grid):
                # batch >= 99 at H=128 (12,672 heads on 132 SMs): the route-split launches. Non-flush rows: 3
                # persistent programs per SM (168 registers, one 32 KB tile buffer each) stream equal shares of the
                # heads, the next head's tile prefetched into L2; flush rows: a second persistent launch, uncapped
                # (the whole-tile fold), started early (PDL) to fill the first one's tail. Measured against the
                # pipelined launch below at batch 256: 9 % faster non-flush, 4-5 % faster mixed; against the one-head
                # launch at 64-128: 9-16 % faster non-flush, equal to 6 % faster mixed (session 9, runs 1-3). At
                # batch 32 it was 6 % slower mixed, at 8 slower throughout. At 64 the one-head launch below is as fast
                # non-flush and flush and 4-5 % faster mixed (sessions 11 and 12, with row cursors: 90.24 / 198.19 /
                # 115.49 us against 89.52 / 197.05 / 121.66), at 128 6-8 % slower non-flush: the switch sits between,
                # untimed.
                # KSPLIT: the non-flush launch's sequence tile of pow2(W) rows, 1.6-1.8 % faster non-flush at batch
                # 128-256 and W=16 (16 rows, not 32), 1.9x faster than the LDG kernel at W=32 (session 13, run 2)
                # TMA_STORE (the flush launch's new checkpoint by one bulk store): flush rows 1.7-3 % faster at W=32
                # (session 16, runs 2 / 3: batch 128 620.65 -> 605.20 / 610.88 -> 600.49 us, batch 256 1219.55 ->
                # 1182.98 / 1201.07 -> 1164.95), 5-7 % slower at W=16 (380.07 -> 401.93, 737.10 -> 785.56)
                # Lean cards (H100 80GB HBM3, 3.01 TB/s copy; session 18, runs 3 / 4, T=4 W=16): 2 programs per SM,
                # uncapped, measured faster at batch 128: 224.75 -> 217.37 / 224.53 -> 216.77 us non-flush, flush
                # 477.27 -> 477.52 / 477.07 -> 475.59, mixed 270.67 -> 264.37 / 271.08 -> 263.58; the pipelined launch
                # there was faster non-flush (214.15 / 214.07) but 4-5 % slower mixed (282.47 / 283.31)
                cfg.update(SPLIT=1, STREAM=2, PDL=1, PFHEADS=1, KSPLIT=1,
                           **({"PROGS": 2} if lean else {"PROGS": 3, "maxnreg": 168}),
                           **({"TMA_STORE": 1} if long_ring else {}))
            elif pipelined and not long_ring and long_grid:
                # lean cards from batch 248 (H=128) on, in place of the streamed launches (H100, session 18, runs 3 /
                # 4, batch 256): non-flush 437.23 -> 416.68 / 439.50 -> 416.56 us, flush 934.22 -> 889.41 / 935.71 ->
                # 889.48, mixed 549.56 -> 515.10 / 549.05 -> 515.38; the streamed launch at 2 programs per SM came
                # between (421.08 / 420.17 non-flush, 537.06 / 536.58 mixed)
                # a group's heads in a 2-stage pipeline, uncapped (2 programs per SM), flush rows folded from
                # the shared-memory tile in one product. Only for long grids: a flush row's program runs about
                # twice as long, and with fewer programs per SM that tail cost mixed batches more than the
                # pipeline gains (measured at T=4: 4.5 % faster mixed at batch 256, 10-23 % slower at 32-128).
                # Each iteration also asks L2 for the next head's tile (PFHEADS=1), whose TMA copy the pipeliner
                # issues only at the iteration's end: 6 % faster on flush rows, the same on the others; 2 or
                # more heads ahead measured slower (session 8, runs 1 and 4-7)
                cfg.update(HEADS=16, HSTAGES=2, FOLD_N=_pow2(N), PFHEADS=1)
            elif long_ring:  # flush rows' 64-row sequence tile in the same launch (53 KB, 4 programs per SM): W=32
                # measured 1.4-1.6x faster than the LDG kernel at batch 8-64, and 7-25 % faster mixed than the route-
                # split launches (which are up to 8 % faster on non-flush rows alone; session 13, run 2)
                cfg.update(maxnreg=128, EARLY=3, KSPLIT=1)
            else:  # 5 programs per SM (43 KB of shared memory each); EARLY 3 measured 7-9 % faster at batch 8-32.
                # KSPLIT (the non-flush rows' 16-row tile, a second build in the launch) measured 1-5 % slower here
                cfg.update(maxnreg=96, EARLY=3)
        return cfg
    HPG = H // max(G, 1)
    if not _compiled(device):
        return {"KERNEL": "ldg", "HPP": HPG, "BLOCK_P": min(_pow2(P), 128), "num_warps": 4, "num_stages": 1}
    BLOCK_P = _block_p(P, 64)
    sms = _num_sms(device)
    while rows * H * triton.cdiv(P, BLOCK_P) < 0.5 * sms and BLOCK_P > 16 and P % (BLOCK_P // 2) == 0:
        BLOCK_P //= 2
    cfg: dict[str, Any] = {"KERNEL": "ldg", "HPP": 1, "BLOCK_P": BLOCK_P, "num_warps": 4, "num_stages": 1,
                           "FOLD_N": 32}
    if rows * H * triton.cdiv(P, BLOCK_P) >= 16 * sms:
        cfg.update(NC=32, NS=3, FUSE=False)
    if _pow2(R) <= 32:  # a 64-row sequence tile (W = 32) spills under the cap
        cfg["maxnreg"] = 80
    return cfg


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
        raise ShapeError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    return t.stride()[:-1]


def _check_T(T: int) -> None:
    if T > 16:
        raise ShapeError(f"the Triton verify kernel handles windows of at most 16 tokens, got T={T}")


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
    trace: Tensor | None = None,
    row_cursors: Tensor | None = None,
    pdl: bool = False,
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
        config: launch override (see :func:`verify_config`): its keys replace the heuristic's, and a config that
            names ``HEADS``, ``HSTAGES``, ``SPLIT`` or ``STREAM`` starts from the base launch instead (none of
            the heuristic's register cap, prefetches, heads or streams). Keys: ``KERNEL`` ("tma" or "ldg"; default: TMA
            where :func:`tma_block_p` allows and the ring has at most 32 rows; keys of the LDG kernel only,
            ``HPP``, ``NC``, ``NS``, ``FUSE``, ``PREFETCH``, select it), ``HPP`` heads of one group per program
            (divides H / G), ``BLOCK_P`` head-dim rows per program, ``NC`` (0: whole checkpoint tile; a power
            of two >= 16 on the GPU: the tile streamed in NC-column chunks over ``NS`` pipeline stages),
            ``FUSE`` (flush rows fold while streaming, NC > 0), ``FOLD_N`` (N chunk of the fold otherwise),
            ``PREFETCH`` (HPP > 1: 0, 1 = next head's tile, 2 = all its loads ahead), ``L2PF`` (TMA kernel only:
            0, 1 = prefetch the first checkpoint tile into L2 once the page id is known, 2 = also the x and dt
            rings of the program's heads and the group's B ring; GPU only, a no-op in the interpreter),
            ``HEADS`` (TMA kernel only: heads of one group per program, divides H / G) in a software pipeline
            of ``HSTAGES`` tile buffers (a launch whose buffers overflow shared memory raises ConfigError),
            ``PFHEADS`` (TMA kernel, HEADS > 1 or STREAM: each iteration prefetches the tile PFHEADS heads ahead
            into L2; GPU only), ``SPLIT`` (1: two launches, non-flush rows under the config's register cap, flush
            rows uncapped in a persistent launch), ``SPLIT_HEADS`` (heads per item of that flush launch),
            ``STREAM`` (persistent launches of ``PROGS`` programs per SM, each streaming an equal contiguous
            share of the (row, P tile, head) items: 1 the non-flush launch with SPLIT, or both routes in one
            launch without it, a flush row's heads weighted ``FLUSH_W`` / 4; 2 both SPLIT launches; at most
            1,024 rows), ``PDL`` (1 with SPLIT, GPU only: the flush launch starts as the first launch's
            programs exit and ends only after it), ``EARLY`` (1: each segment's first head's gathers go out right after
            B's rows, before the Gram, instead of after it; 2: right before B's rows; 3, one head per program and
            no STREAM: as 2, and the head's tile copy too), ``KSPLIT`` (1: non-flush rows take a sequence tile of
            ``pow2(min(W, R))`` rows, flush rows one of ``pow2(R)``: two builds in one launch, or the short one in
            SPLIT's non-flush launch), ``PDL_TILE`` (with ``pdl=True`` only: what of the checkpoint goes out before
            the wait: 0 nothing more than the config's prefetches, 1 the first tile into L2, 2 with EARLY=3 the
            tile's TMA copy itself; default with EARLY=3: 2 where the grid is at most one program per SM, 1 from
            16 programs per SM; else 0), ``TILE_LDG`` (1, with EARLY=3: that tile by plain loads into registers
            instead of one TMA copy, so that the Gram and the factors overlap its round trip), ``TMA_STORE`` (1: a flush row's new checkpoint leaves by one TMA bulk
            store from shared memory instead of stores from registers, in launches that fold whole tiles: SPLIT's
            flush launch, or ``FOLD_N`` >= N), ``num_warps``, ``num_stages``, ``maxnreg`` (register cap, GPU only; at least
            128, or 0, where the capped launch holds a sequence tile over 32 rows: a lower cap was measured to build
            a faulting kernel). Results agree to fp32/tf32 rounding across configs.
        trace: diagnostics, TMA kernel on the GPU only: (2, programs, 32, 2) int64, caller-owned. Launch ``j`` (0,
            and 1 the flush launch of ``SPLIT``) writes ``trace[j, program, slot]``: (``%globaltimer`` ns,
            ``%clock64`` cycles) at the program's start (slot 0), its rows ranked (1, persistent launches), per
            segment ``s < 5`` (a run of one row's heads; later ones reuse the last) at ``2 + 5 s`` its start, its
            cursors known, its Gram done, its heads done and its head count, the segment count (30) and the end
            (31). A traced launch is a different build (each stamp waits for its value): it shows where a program's
            time goes, not the untraced time (``benchmarks/trace_verify.py`` reads it).
        row_cursors: (2, rows) int32 or None: ``ring_start`` and ``num_committed`` of each row's page, gathered
            once per step (``StepPlan.row_cursors``) and equal to the pages' cursors (the reference checks it).
            The TMA kernel then loads a row's cursors in the page id's round trip instead of one after it; the
            LDG kernel reads the pages' cursors either way.
        pdl: launch as a programmatic dependent of the kernel before it in the stream (GPU only; ignored in the
            interpreter). Each program issues its page id, cursors and (config ``PDL_TILE``) its first checkpoint
            tile's read, then waits (``griddepcontrol.wait``) for that kernel to end before reading the step's inputs,
            and then lets the next kernel launch; so the launch and those reads overlap the kernel before (the
            layer's conv). Safe when the kernel before writes none of the pages' tensors, cursors, ``page_ids``,
            ``cu_seqlens`` or ``row_cursors``, and, if it is itself a programmatic dependent, lets its dependents
            launch only after its own wait, as :func:`ssmstate.ops.triton.conv.conv_update` (``pdl=True``)
            and this kernel do. Results are the same bits as without.
    Returns:
        ``out``.
    """
    pages, H, P, N = checkpoint.shape
    R = x_ring.shape[2]
    G = B_ring.shape[1]
    T = max_seqlen if max_seqlen is not None else R - window
    _check_T(T)
    if x.dtype != x_ring.dtype or B.dtype != B_ring.dtype:
        raise ShapeError(f"x/B ({x.dtype}/{B.dtype}) must have the ring dtypes ({x_ring.dtype}/{B_ring.dtype})")
    rows = page_ids.shape[0]
    dev = x.device
    if not isinstance(pdl, bool):
        raise ConfigError(f"pdl must be a bool, got {pdl!r}")
    gdc_on = pdl and _compiled(dev)  # the launch waits for the kernel before (GPU only)
    if row_cursors is not None:
        check_row_cursors_shape(row_cursors, rows, dev)
    config = dict(config or {})
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
    kernel = config.get("KERNEL")
    if kernel not in (None, "tma", "ldg"):
        raise ConfigError(f"config KERNEL must be 'tma' or 'ldg', got {kernel!r}")
    ldg_keys = sorted(set(config) & _LDG_KEYS)
    if kernel == "tma" and ldg_keys:
        raise ConfigError(f"config keys {ldg_keys} apply to the LDG kernel only (KERNEL='ldg')")
    if kernel is None and (ldg_keys or not tma_supported(checkpoint, tma_block_p(P, N, dev))):
        kernel = "ldg"
    tma_keys = sorted(set(config) & _TMA_KEYS)
    if kernel == "ldg" and tma_keys:
        raise ConfigError(f"config keys {tma_keys} apply to the TMA kernel only (KERNEL='tma')")
    cfg = verify_config(rows, H, P, N, R, T, dev, G, kernel=kernel, state_size=checkpoint.element_size(),
                        shape=not set(config) & _SHAPE_KEYS)
    cfg.update(config)
    if trace is not None and cfg["KERNEL"] != "tma":
        raise ConfigError("trace records the TMA kernel only (KERNEL='tma')")
    for key in _CONFIG_KEYS - {"KERNEL", "FUSE"}:  # every other key is an int
        if key in cfg and (isinstance(cfg[key], bool) or not isinstance(cfg[key], int)):
            raise ConfigError(f"config {key} must be an int, got {cfg[key]!r}")
    fold_n = cfg.get("FOLD_N")
    if fold_n is not None and (fold_n < 1 or fold_n & (fold_n - 1) or (_compiled(dev) and fold_n < 16)):
        raise ConfigError(f"config FOLD_N must be a power of two (>= 16 on the GPU), got {fold_n}")
    HPG = H // G
    HPP = int(cfg.get("HPP", HPG))
    if HPP < 1 or HPG % HPP:
        raise ConfigError(f"config HPP must divide the {HPG} heads per group, got {HPP}")
    BLOCK_N = _pow2(N)
    NC = min(BLOCK_N, int(cfg.get("NC", 0)))
    if NC < 0 or NC & (NC - 1):
        raise ConfigError(f"config NC must be 0 or a power of two, got {cfg['NC']}")
    dot_prec, fold_prec = _dot_prec(dev)
    dummy = dt_ring
    fold_split = _compiled(dev) and B_ring.dtype in (torch.bfloat16, torch.float16)
    # what both kernels take, in their order: the step's tensors, then the strides but the last of every tensor
    step = (x, dt, A, B, C, D if D is not None else dummy, dt_bias if dt_bias is not None else dummy,
            z if z is not None else x, out, page_ids, cu_seqlens)
    strides = (*_outer(checkpoint=checkpoint)[:2], *_outer(x_ring=x_ring), *_outer(B_ring=B_ring), *dt_ring.stride(),
               *_outer(x=x), *dt.stride(), *_outer(B=B), *_outer(C=C), *_outer(z=z if z is not None else x),
               *_outer(out=out))
    flags = dict(HAS_D=D is not None, HAS_DTB=dt_bias is not None, HAS_Z=z is not None, DT_SOFTPLUS=bool(dt_softplus),
                 DOT_PREC=dot_prec, FOLD_SPLIT=fold_split, FOLD_PREC=fold_prec, IDX64=INTERPRETED,
                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                 **({"maxnreg": int(cfg["maxnreg"])} if cfg.get("maxnreg") and _compiled(dev) else {}))
    if cfg["KERNEL"] == "tma":
        BLOCK_P = cfg["BLOCK_P"]
        if not tma_supported(checkpoint, BLOCK_P):
            raise ConfigError(f"the TMA verify kernel needs a contiguous checkpoint, P divisible by BLOCK_P={BLOCK_P} "
                             f"and N a power of two in [16, 256]; got {tuple(checkpoint.shape)} "
                             f"(use KERNEL='ldg')")
        HEADS, HSTAGES = cfg.get("HEADS", 1), cfg.get("HSTAGES", 1)
        if HEADS < 1 or HPG % HEADS:
            raise ConfigError(f"config HEADS must divide the {HPG} heads per group, got {HEADS}")
        if HSTAGES < 1:
            raise ConfigError(f"config HSTAGES must be >= 1, got {HSTAGES}")
        SPLIT = cfg.get("SPLIT", 0)
        if SPLIT not in (0, 1):
            raise ConfigError(f"config SPLIT must be 0 or 1, got {SPLIT}")
        split_heads = cfg.get("SPLIT_HEADS", min(8, tma_heads(H, G)))
        if split_heads < 1 or HPG % split_heads:
            raise ConfigError(f"config SPLIT_HEADS must divide the {HPG} heads per group, got {split_heads}")
        STREAM = cfg.get("STREAM", 0)
        if STREAM not in (0, 1, 2) or (STREAM == 2 and not SPLIT):
            raise ConfigError(f"config STREAM must be 0, 1 or 2 (2 with SPLIT=1), got {STREAM} with SPLIT={SPLIT}")
        flush_w = cfg.get("FLUSH_W", 10)
        if not 1 <= flush_w <= 64:
            raise ConfigError(f"config FLUSH_W (a flush row's head cost, in quarters of another's) must be in "
                              f"[1, 64], got {flush_w}")
        PFHEADS = cfg.get("PFHEADS", 0)
        if PFHEADS < 0 or (PFHEADS and HEADS == 1 and not STREAM):
            raise ConfigError(f"config PFHEADS must be >= 0 and needs HEADS > 1 or STREAM, got {PFHEADS} with "
                              f"HEADS={HEADS}")
        progs = cfg.get("PROGS", 3)
        if progs < 1:
            raise ConfigError(f"config PROGS must be >= 1, got {progs}")
        if STREAM and rows > _STREAM_ROWS:
            raise ConfigError(f"config STREAM ranks the rows in registers: at most {_STREAM_ROWS} rows, got {rows}")
        PDL = cfg.get("PDL", 0)
        if PDL not in (0, 1) or (PDL and not SPLIT):
            raise ConfigError(f"config PDL must be 0 or 1 (1 with SPLIT=1), got {PDL}")
        pdl_on = bool(PDL) and _compiled(dev)
        # pdl: the first launch waits for the kernel before; SPLIT's flush launch starts only once every program
        # of the first is past that wait (PDL 1 lets it start then), so it needs none of its own
        early = cfg.get("EARLY", 0)
        if early not in (0, 1, 2, 3) or (early == 3 and (HEADS != 1 or STREAM)):
            raise ConfigError(f"config EARLY must be 0, 1, 2 or 3 (3 with one head per program, no STREAM), got "
                              f"{early} with HEADS={HEADS}, STREAM={STREAM}")
        # PDL_TILE's default, as measured in the layer chain (session 15, runs 2-3): the tile's copy before the wait
        # where the grid is at most one program per SM (batch 1: 2-8 % faster than 0 or 1); the first tile into L2
        # in a one-program-per-head launch of at least 16 programs per SM (batch 32-64: 1.5-2 % faster than 0;
        # at batch 8 8-10 % slower, and 2 is 12-20 % slower at 8-64); else nothing more (batch 128-256: 0 and 1
        # within 1 %)
        sms = _num_sms(dev) if _compiled(dev) else 1
        programs = H // HEADS * (P // BLOCK_P) * rows
        pdl_tile = cfg.get("PDL_TILE", 2 if early == 3 and programs <= sms else
                           1 if early == 3 and programs >= 16 * sms else 0)
        if pdl_tile not in (0, 1, 2) or (pdl_tile == 2 and early != 3):
            raise ConfigError(f"config PDL_TILE must be 0, 1 or 2 (2 with EARLY=3), got {pdl_tile} with EARLY={early}")
        tile_ldg = cfg.get("TILE_LDG", 0)
        if tile_ldg not in (0, 1) or (tile_ldg and early != 3):
            raise ConfigError(f"config TILE_LDG must be 0 or 1 (1 with EARLY=3), got {tile_ldg} with EARLY={early}")
        ksplit = cfg.get("KSPLIT", 0)
        if ksplit not in (0, 1):
            raise ConfigError(f"config KSPLIT must be 0 or 1, got {ksplit}")
        tma_store = cfg.get("TMA_STORE", 0)
        if tma_store not in (0, 1) or (tma_store and not SPLIT and
                                       int(cfg.get("FOLD_N", 32 if _compiled(dev) else N)) < N):
            raise ConfigError(f"config TMA_STORE must be 0 or 1 (1 where a launch folds whole tiles: SPLIT=1, or "
                              f"FOLD_N >= N={N}), got {tma_store} with SPLIT={SPLIT}, FOLD_N={cfg.get('FOLD_N')}")
        cap = cfg.get("maxnreg") or 0  # an int (checked above) or absent
        if _pow2(R) > 32 and 0 < cap < _LONG_RING_MIN_REGS and not (SPLIT and ksplit):
            # the capped launch holds a 64-row sequence tile (the LDG kernel's twin check is below, in its branch):
            # ptxas (Triton 3.6's) built one such launch at maxnreg 104 (FOLD_N 64, EARLY 3, KSPLIT 1, W=32) into a
            # kernel whose shared-memory store faults, from PTX byte-identical to the correct maxnreg-128 build but
            # for the cap (session 14, run 2)
            raise ConfigError(f"config maxnreg {cap} is below {_LONG_RING_MIN_REGS} on a ring of {R} rows (a "
                              f"{_pow2(R)}-row sequence tile in the capped launch): use maxnreg >= "
                              f"{_LONG_RING_MIN_REGS} or 0 (uncapped), or SPLIT=1 with KSPLIT=1")
        desc = TensorDescriptor.from_tensor(checkpoint.view(pages * H * P, N), [BLOCK_P, N])
        tile_bytes = BLOCK_P * N * checkpoint.element_size()  # one head's checkpoint tile
        rc = row_cursors if row_cursors is not None else ring_start  # (a placeholder)
        rc_strides = row_cursors.stride() if row_cursors is not None else (0, 0)

        def launch(grid, heads, hstages, fold_n, pfheads, l2pf, launch_flags, route, persist, pdl=0, gdc=0):
            if gdc and pdl_tile == 1:  # the first tile's DRAM read goes out before the wait, into L2
                l2pf = max(l2pf, 1)
            _verify_tma_kernel[grid](
                rows, desc, checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, rc, *step, window, R, H,
                N, *strides, *rc_strides, trace[1 if route == 2 else 0] if trace is not None else page_ids,
                # (page_ids: a placeholder)
                P=P, NPT=P // BLOCK_P, HPG=HPG, HEADS=heads, HSTAGES=hstages, BLOCK_P=BLOCK_P,
                BLOCK_N=N, BLOCK_K=_pow2(R), BLOCK_S=_pow2(T), FOLD_N=min(N, fold_n),
                GRAM16=_compiled(dev) and B.dtype == C.dtype and B.element_size() == 2,
                READ16=_compiled(dev) and checkpoint.dtype == C.dtype and checkpoint.element_size() == 2,
                **_l2_prefetch(l2pf, tile_bytes, x_ring, B_ring, dt_ring, heads, dev),
                PF_AHEAD=pfheads if _compiled(dev) else 0, PF_TILE=tile_bytes,
                ROUTE=route, PERSIST=persist, BLOCK_ROWS=_pow2(rows) if persist else 16, FLUSH_W=flush_w,
                # EARLY 3 loads one head's tile ahead: one head per program, not persistent (not SPLIT's flush launch)
                NONFLUSH_W=4, PDL=pdl, TRACE=trace is not None, ROWCUR=row_cursors is not None,
                EARLY=early if heads == 1 and not persist else min(early, 2),
                BLOCK_KN=_pow2(min(window, R)), KSPLIT=ksplit, GDC=gdc, TMA_STORE=tma_store and fold_n >= N,
                # 2: the tile reaches shared memory only after the factors (inline PTX, GPU only)
                TILE_LDG=(2 if _compiled(dev) else 1) if tile_ldg and heads == 1 and not persist else 0,
                **launch_flags, **({"launch_pdl": True} if pdl == 2 or gdc else {}),
            )

        grid = (progs * sms, 1) if STREAM else (H // HEADS * (P // BLOCK_P), rows)
        flush_grid = (2 * sms if _compiled(dev) else 3, 1)
        if trace is not None and not (_compiled(dev) and trace.device == dev and trace.dtype == torch.int64
                                      and trace.dim() == 4 and trace.shape[0] == 2
                                      and trace.shape[2:] == (_TRACE_SLOTS, 2) and trace.is_contiguous()):
            raise ShapeError(f"trace must be a contiguous (2, programs, {_TRACE_SLOTS}, 2) int64 tensor on the GPU "
                             f"running the TMA kernel, got {tuple(trace.shape)} {trace.dtype} on {trace.device}")
        if trace is not None and trace.shape[1] < max(grid[0] * grid[1], flush_grid[0] if SPLIT else 0):
            raise ShapeError(f"trace holds {trace.shape[1]} programs per launch; this launch runs {grid[0] * grid[1]}"
                             + (f" and {flush_grid[0]}" if SPLIT else ""))
        # a launch whose pipeline stages overflow shared memory fails before it runs. With SPLIT the flush launch
        # (two 64 x N fp32 tiles at most: within Hopper's 227 KB for N <= 256) could only fail after the first
        # launch ran, which writes outputs and ring rows past the committed ones, never a cursor or a checkpoint
        try:
            fold_n = int(cfg.get("FOLD_N", 32 if _compiled(dev) else N))
            # STREAM: PROGS programs per SM, each streaming an equal share of the heads' cost (SPLIT: the non-flush
            # rows' heads), one tile buffer; else one program per (row, head block, P tile)
            launch(grid, HEADS, 1 if STREAM else HSTAGES, fold_n, PFHEADS, int(cfg.get("L2PF", 0)), flags,
                   route=1 if SPLIT else 0, persist=2 if STREAM else 0, pdl=1 if pdl_on else 0,
                   gdc=(2 if pdl_tile == 2 else 1) if gdc_on else 0)
            if SPLIT:  # flush rows: a persistent launch, uncapped: (row, head block) items round-robin, or streamed
                flush_flags = {k: v for k, v in flags.items() if k != "maxnreg"}
                if STREAM == 2:
                    launch(flush_grid, split_heads, 1, N, 1, 0, flush_flags, route=2, persist=2,
                           pdl=2 if pdl_on else 0)
                else:
                    launch(flush_grid, split_heads, 2 if split_heads > 1 else 1, N, 1 if split_heads > 1 else 0, 0,
                           flush_flags, route=2, persist=1, pdl=2 if pdl_on else 0)
        except OutOfResources as exc:
            raise ConfigError(f"launch {cfg} does not fit this GPU ({exc}); use fewer HSTAGES or HEADS") from exc
        return out
    if _compiled(dev) and cfg.get("maxnreg") and NC == 0 and _pow2(R) > 32:
        raise ConfigError("config maxnreg with the whole-tile LDG kernel and a ring of more than 32 rows faulted on "
                          "the H200 (misaligned address, docs/performance_log.md §15); drop maxnreg or stream the tile "
                          "(NC > 0)")
    BLOCK_P = cfg["BLOCK_P"]
    NPT = triton.cdiv(P, BLOCK_P)
    _replay_verify_kernel[(H // HPP * NPT, rows)](
        checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, *step, window, R, P, N, *strides,
        S_CK_P=checkpoint.stride(2), NPT=NPT, HPG=HPG, HPP=HPP,
        BLOCK_P=BLOCK_P, BLOCK_N=BLOCK_N, BLOCK_K=_pow2(R), BLOCK_S=_pow2(T),
        FOLD_N=min(BLOCK_N, int(cfg.get("FOLD_N", 32 if _compiled(dev) else BLOCK_N))),
        EVEN=(P % BLOCK_P == 0) and N == BLOCK_N,
        NATIVE_G=_compiled(dev) and B.dtype == C.dtype and B.dtype in (torch.bfloat16, torch.float16),
        PREFETCH=int(cfg.get("PREFETCH", 1)), NC=NC, NS=int(cfg.get("NS", 3)),
        FUSE=NC > 0 and bool(cfg.get("FUSE", False)), GDC=gdc_on, **flags,
        **({"launch_pdl": True} if gdc_on else {}),
    )
    return out


def _l2_prefetch(level: int, tile_bytes: int, x_ring: Tensor, B_ring: Tensor, dt_ring: Tensor, heads: int,
                 device: torch.device) -> dict[str, int]:
    """The TMA kernel's L2 prefetch sizes in bytes (``PF_CK``, ``PF_X``, ``PF_B``, ``PF_DT``; 0 = none).

    ``level`` (config ``L2PF``): 0 none, 1 the first head's checkpoint tile (``tile_bytes``), 2 also the rings: the x and dt
    rings of the program's ``heads`` heads (one contiguous span: a program's heads are consecutive) and the
    group's B ring. A bulk prefetch needs 16-byte aligned addresses and sizes, so a ring whose per-page or
    per-program offsets or whose span (first row to the end of the last) are not is left out; the
    interpreter runs none (inline PTX).
    """
    if level not in (0, 1, 2):
        raise ConfigError(f"config L2PF must be 0, 1 or 2, got {level}")
    if level == 0 or not _compiled(device):
        return {"PF_CK": 0, "PF_X": 0, "PF_B": 0, "PF_DT": 0}

    def ring_bytes(ring: Tensor, count: int) -> int:
        """Bytes from ``count`` consecutive heads' (or one group's) first row to the end of the last."""
        e = ring.element_size()
        inner = (ring.shape[2] - 1) * ring.stride(2) + (ring.shape[3] if ring.dim() == 4 else 1)
        span = ((count - 1) * ring.stride(1) + inner) * e
        # a program starts at a multiple of `count` heads: its offset is a multiple of count * stride(1)
        ok = (ring.data_ptr() % 16 == 0 and span % 16 == 0 and ring.stride(0) * e % 16 == 0
              and count * ring.stride(1) * e % 16 == 0)
        return span if ok else 0

    rings = ({"PF_X": ring_bytes(x_ring, heads), "PF_B": ring_bytes(B_ring, 1), "PF_DT": ring_bytes(dt_ring, heads)}
             if level == 2 else {"PF_X": 0, "PF_B": 0, "PF_DT": 0})
    return {"PF_CK": tile_bytes, **rings}


#: config keys :func:`replay_verify` accepts, and those that only the LDG / the TMA kernel reads
_LDG_KEYS = frozenset({"HPP", "NC", "NS", "FUSE", "PREFETCH"})
_TMA_KEYS = frozenset({"L2PF", "HEADS", "HSTAGES", "PFHEADS", "SPLIT", "SPLIT_HEADS", "STREAM", "PROGS",
                       "FLUSH_W", "PDL", "EARLY", "KSPLIT", "PDL_TILE", "TMA_STORE", "TILE_LDG"})
#: most rows a STREAM launch ranks (its rank vector lives in registers: BLOCK_ROWS / 128 per thread)
_STREAM_ROWS = 1024
#: fewest registers a capped TMA launch may take when it holds a sequence tile over 32 rows (see replay_verify)
_LONG_RING_MIN_REGS = 128
#: TMA keys that choose the launch shape: a config naming one gets none of the heuristic's shape keys
_SHAPE_KEYS = frozenset({"HEADS", "HSTAGES", "SPLIT", "STREAM"})
_CONFIG_KEYS = _LDG_KEYS | _TMA_KEYS | {"KERNEL", "BLOCK_P", "FOLD_N", "num_warps", "num_stages", "maxnreg"}


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
    cfg = verify_config(rows, H, P, N, R, 1, dev, kernel="ldg")
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
