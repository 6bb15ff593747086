"""What the Triton kernels share: the interpreter switch, the device facts the launches depend on, and the
device helpers (softplus, decays, the fold of history rows into a checkpoint, the PDL wait).

Triton runs kernels on CPU tensors only through its interpreter, chosen when the kernels are decorated (module
import): :data:`INTERPRETED`. All kernel math is fp32 (loads are upcast first, which also keeps the interpreter
exact); on the GPU the small products use tensor cores (:func:`dot_precisions`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import attrs
import torch
import triton
import triton.language as tl

from ssmstate.errors import ShapeError

Tensor = torch.Tensor

#: the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when they were decorated)
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@attrs.frozen
class KernelLaunch:
    """One kernel launch as the launch builders return it (``verify_launches``, ``conv_launch``,
    ``conv_verify_launches``): ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    grid: tuple[int, int]
    args: tuple
    kwargs: dict[str, Any]

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


def compiled(device: torch.device) -> bool:
    """Kernels run compiled for a GPU (not in the interpreter)."""
    return not INTERPRETED and device.type == "cuda"


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The GPU's streaming multiprocessors (1 off the GPU)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def arch(device: torch.device) -> int:
    """The GPU's compute capability as major * 10 + minor (90: Hopper); 0 off the GPU."""
    if device.type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def dram_gbps_per_sm(device: torch.device) -> float:
    """Peak DRAM bandwidth per SM in GB/s, from the driver's memory clock and bus width; 0.0 where not reported."""
    if device.type != "cuda":
        return 0.0
    return dram_gbps_per_sm_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def dram_gbps_per_sm_of(index: int) -> float:
    """:func:`dram_gbps_per_sm` of CUDA device ``index``."""
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(index)
        return props["mem_clock_rate"] * props["mem_bus_width"] * 2 / 8e6 / props["multiprocessor_count"]
    except Exception:  # advisory only: a driver that cannot say gets the launches of a card with bandwidth to spare
        return 0.0


def rows_aligned(*tensors: torch.Tensor) -> bool:
    """Every row of these tensors (each index but the last) starts on a 16-byte boundary. The verify kernels pick
    each sequence position's row from a ring or from the step's inputs and load it in 16-byte vectors; the compiler
    cannot derive that alignment through the element-wise pick (Triton 3.8 and later keep none), so the kernels
    state it: the per-warp and TMA kernels take only calls where it holds, the portable kernel states it where it
    holds (its ``ALIGNED``)."""
    return all(t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
               for t in tensors)


def pow2(n: int, floor: int = 16) -> int:
    """The next power of two >= ``n``, at least ``floor`` (the smallest tile a ``tl.dot`` takes)."""
    return max(floor, triton.next_power_of_2(int(n)))


def dot_precisions(on_gpu: bool) -> tuple[str, str]:
    """(output terms, stored fold): tf32 / 3xTF32 compiled for the GPU; the interpreter computes fp32 anyway."""
    return ("tf32", "tf32x3") if on_gpu else ("ieee", "ieee")


def outer_strides(**named: Tensor) -> tuple[int, ...]:
    """Strides but the last of the one named tensor; the kernels read and write its last dimension contiguously."""
    (name, t), = named.items()
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ShapeError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    return t.stride()[:-1]


# -- device helpers ----------------------------------------------------------------------------


@triton.jit
def softplus(v):
    """softplus with threshold 20, as every Mamba2 kernel; exp(v) below -15 keeps precision."""
    return tl.where(v > 20.0, v, tl.where(v < -15.0, tl.exp(v), tl.log(1.0 + tl.exp(v))))


@triton.jit
def decay(A, lam):
    """``e^{A lam}``, clamped at 1 (A < 0, lam >= 0: only rounding can push the exponent above 0)."""
    return tl.exp(tl.minimum(A * lam, 0.0))


@triton.jit
def fold(S, XT, Bseq, dtp, is_hist, A, PREC: tl.constexpr):
    """``e^{AΛ} S + Σ_k dt_k e^{A(Λ - Λ_k)} x_k B_kᵀ`` over the rows where ``is_hist``."""
    dth = tl.where(is_hist, dtp, 0.0)
    lam = tl.cumsum(dth, axis=0)
    tot = tl.sum(dth, axis=0)
    w = tl.where(is_hist, dth * decay(A, tot - lam), 0.0)
    upd = tl.dot(XT * w[None, :], Bseq, input_precision=PREC)
    return S * decay(A, tot) + upd


@triton.jit
def tf32_split(v):
    """``v = hi + lo`` with ``hi`` exact in tf32 (10 mantissa bits): two tf32 products give ~fp32."""
    hi = (v.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, v - hi


@triton.jit
def safe_cursors(c, rs, window, R):
    """A page's ``num_committed`` clamped to ``[0, W]`` and ``ring_start`` to ``[0, R)``: four integer ops on
    cursors loaded once per program. Cursors the manager wrote pass unchanged; a corrupted one can never index a
    ring row outside the page (the reference reads them the same way: ``reference.clamp_ring_cursors``)."""
    return tl.minimum(tl.maximum(c, 0), window), tl.minimum(tl.maximum(rs, 0), R - 1)


@triton.jit
def wrap(i, R):
    """``i % R`` for ``0 <= i < 3R`` (ring rows): two selects instead of an integer division."""
    i = tl.where(i >= R, i - R, i)
    return tl.where(i >= R, i - R, i)


@triton.jit
def prefetch_l2(addr, nbytes):
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
def pdl_wait():
    """In a program launched as a programmatic dependent (``pdl=True``): wait for the kernel before to end (at once
    where the program has waited already), then let the next kernel launch. Always in that order: once every
    program has triggered or exited the next kernel may start, and it must never start while the kernel before
    this one runs, since its own early reads count on every kernel before it having ended. So a program that
    skipped its work (a padding row, the other route) calls this before it exits, too."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def fold_weights(XT, dth, A, FOLD_SPLIT: tl.constexpr):
    """The fold's factors: ``XTw = X_hᵀ diag(w)`` with ``w_k = dt_k e^{A(Λ - Λ_k)}``, its tf32 hi/lo
    split (FOLD_SPLIT; else both are ``XTw``), and the carry ``e^{AΛ}`` of the checkpoint."""
    tot = tl.sum(dth, axis=0)
    XTw = XT * (dth * decay(A, tot - tl.cumsum(dth, axis=0)))[None, :]
    if FOLD_SPLIT:
        hi, lo = tf32_split(XTw)
    else:
        hi, lo = XTw, XTw
    return XTw, hi, lo, decay(A, tot)


@triton.jit
def fold_tile(S0, XTw, hi, lo, carry, Bh, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr):
    """The whole tile's fold ``e^{AΛ} S0 + (X_h w)ᵀ B_h`` in fp32 from :func:`fold_weights`' factors (``Bh``: fp32,
    zero past the history)."""
    S1 = S0.to(tl.float32) * carry
    if FOLD_SPLIT:  # B_h exact in tf32 (16-bit ring): split only the x side, two tf32 dots
        S1 = tl.dot(hi, Bh, acc=S1, input_precision="tf32")
        S1 = tl.dot(lo, Bh, acc=S1, input_precision="tf32")
    else:
        S1 = tl.dot(XTw, Bh, acc=S1, input_precision=FOLD_PREC)
    return S1


@triton.jit
def fold_chunk_value(Sc, oc, b_hist, is_hist, N_, XTw, hi, lo, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr):
    """``Sc + (X_h w)ᵀ B_h[:, oc]`` (``Sc``: the chunk's carried checkpoint), fp32."""
    Bc = tl.load(b_hist[:, None] + oc[None, :], mask=is_hist[:, None] & (oc < N_)[None, :], other=0.0).to(tl.float32)
    if FOLD_SPLIT:  # B_h exact in tf32 (16-bit ring): split only the x side, two tf32 dots
        Sc = tl.dot(hi, Bc, acc=Sc, input_precision="tf32")
        Sc = tl.dot(lo, Bc, acc=Sc, input_precision="tf32")
    else:
        Sc = tl.dot(XTw, Bc, acc=Sc, input_precision=FOLD_PREC)
    return Sc


@triton.jit
def fold_chunk(Sc, ck, mc, oc, b_hist, is_hist, N_, XTw, hi, lo, ck_ptr, EVEN: tl.constexpr,
               FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr):
    """Store ``Sc + (X_h w)ᵀ B_h[:, oc]`` (``Sc``: the chunk's carried checkpoint) over the chunk ``ck``."""
    Sc = fold_chunk_value(Sc, oc, b_hist, is_hist, N_, XTw, hi, lo, FOLD_SPLIT, FOLD_PREC)
    if EVEN:
        tl.store(ck, Sc.to(ck_ptr.dtype.element_ty))
    else:
        tl.store(ck, Sc.to(ck_ptr.dtype.element_ty), mask=mc)


@triton.jit
def load_chunk(ck, mc, EVEN: tl.constexpr):
    """A chunk of the checkpoint as fp32 (no mask where P and N fill the blocks)."""
    return load_raw(ck, mc, EVEN).to(tl.float32)


@triton.jit
def load_raw(ck, mc, EVEN: tl.constexpr):
    """A chunk of the checkpoint in its stored type (no mask where P and N fill the blocks; zeros past them)."""
    if EVEN:
        return tl.load(ck)
    else:
        return tl.load(ck, mask=mc, other=0)


@triton.jit
def chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, NC: tl.constexpr,
          IDX64: tl.constexpr):
    """Columns ``n0 .. n0 + NC - 1`` of head ``h``'s tile: their indices, pointers and mask."""
    oc = n0 + tl.arange(0, NC)
    if IDX64:
        oc = oc.to(tl.int64)
    ck = ck_page + h * s_ck_h + (tl.arange(0, BLOCK_P)[:, None] * S_CK_P + oc[None, :])
    return oc, ck, mp[:, None] & (oc < N_)[None, :]


@triton.jit
def load_tile(ck_page, h, s_ck_h, mS, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN: tl.constexpr):
    """Head ``h``'s checkpoint tile (BLOCK_P, BLOCK_N), in the checkpoint's dtype (codes for an 8-bit one)."""
    # offsets from constants only (the row stride S_CK_P is a constexpr): one base address per head
    ck = ck_page + h * s_ck_h + (tl.arange(0, BLOCK_P)[:, None] * S_CK_P + tl.arange(0, BLOCK_N)[None, :])
    if EVEN:  # no masks where P and N fill the blocks: fewer instructions
        return tl.load(ck)
    else:
        return tl.load(ck, mask=mS, other=0)
