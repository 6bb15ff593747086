"""Checkpoint quantization: the reference every backend stores bit-for-bit.

A checkpoint of dtype fp32, bf16 or fp16 is the state cast to that dtype. An
8-bit checkpoint (int8, QMAX = 127, or float8_e4m3fn, QMAX = 448) stores codes
``q`` of shape (..., P, N) plus an fp32 decode scale of shape (..., P), one per
(page, head, head-dim row) over its N values: FlashInfer's ``state_scale``
layout, and the state decodes as ``fp32(q) * scale``.

Encode of one row ``S[0..N)`` (all fp32, IEEE round-to-nearest):

* ``amax = max_n |S[n]|`` ignoring NaN (``fmaxf``); 0 for an all-zero or all-NaN row.
* ``amax > 0`` is floored at ``QMAX * 2**-117`` so the encode factor stays finite.
* ``enc = 1 if amax == 0 else QMAX / amax``; ``scale = 1 / enc`` (stored).
* ``v = S[n] * enc``; int8: round half to even, saturate to [-127, 127], NaN -> 0;
  fp8: clamp to [-448, 448], round to nearest even into e4m3fn, NaN -> NaN (always the byte 0x7F).

So an all-zero row stores scale 1 and zeros; an inf in a row gives ``enc = 0``,
``scale = inf`` and the whole row decodes to NaN (poisoned, never silently finite).

Compared with FlashInfer 0.7.2's ``checkpointing_ssu`` int8/fp8 encode
(kernel_checkpointing_ssu_8bit.cuh: fmaxf amax over fp32, ``enc = amax == 0 ?
1 : QMAX / amax``, stored ``1 / enc``, ``cvt.rni.sat.s8`` / ``cvt.rn.satfinite.e4m3``):
the same arithmetic, except the amax floor, which FlashInfer does not apply (a row
with ``0 < amax < QMAX * 2**-128`` gets an infinite encode factor there; such rows
are below 1e-36 and do not occur in practice), and its stochastic rounding draws
its bits from Philox, so stochastically rounded bytes agree with FlashInfer's in
distribution only.

Stochastic rounding (SR), optional, for bf16, fp16, int8 and fp8 checkpoints.
Each element draws 32 random bits from a counter-based hash of
``(seed, layer, page, h, p, n)`` (:func:`sr_bits`): ``seed`` is an int64 the
state manager keeps on the device and advances once per step (so a captured
CUDA graph replays with fresh bits), ``layer`` decorrelates layers. The hash is
lowbias32 (``x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B;
x ^= x >> 16`` on uint32) folded over the words ``seed_lo, seed_hi, layer,
page, h, p, n``: ``acc = mix(seed_lo); acc = mix(acc ^ w)`` for each later word
(every word taken mod 2**32). Torch computes it in int64 with 32-bit masks and
split multiplies; a kernel computes it in uint32 (constants typed uint32, logical
shifts), reading the seed from ``cache.checkpoint_seed`` (int64 (1,), on the
device: low and high words) and the layer from the verb; both give the same bits.

Rounding with the bits ``r`` of an element:

* int8: ``q = floor(v + u)`` with ``u = (r >> 8) * 2**-24`` (fp32 add), saturated
  to [-127, 127], NaN -> 0 (FlashInfer's int8 SR rule).
* bf16 / fp16 / fp8, finite ``x`` whose rounded value is a normal number of the
  target: add the low ``d`` bits of ``r`` to the magnitude bits of fp32 ``x`` and
  clear them (``d`` = 16 for bf16, 13 for fp16, 20 for fp8), then cast. The cleared
  value is representable, so the cast is exact and the result is exact SR: it
  rounds up with probability equal to the fraction of the gap, and a carry into
  the exponent moves to the next binade correctly. Inf and NaN pass through.
* Target subnormals (``|x|`` below the target's smallest normal: 2**-14 for fp16,
  2**-6 for fp8; bf16 shares fp32's exponent range, so the bit trick is exact for
  all its finite values and bf16 has no separate case): ``sign * floor(|x| * 2**k + u) * 2**-k`` on the uniform
  subnormal grid ``2**-k`` (k = 24 for fp16, 9 for fp8). Unbiased up to the fp32
  rounding of the add (below 2**-23 of a grid step).
* fp8 clamps to [-448, 448] before and after rounding (e4m3fn has no inf; 480
  would be NaN), so SR saturates like the round-to-nearest path.

A NaN is stored as one canonical pattern per type, whatever its sign or payload:
0x7F in e4m3fn and 0x7FFF in bf16 and fp16 (what the GPU's conversions write;
CPU torch writes 0x7E00 or 0xFFFF depending on its code path), so the reference
gives the same bytes on every device and every backend stores them.
"""

from __future__ import annotations

import torch

from ssmstate.dtypes import QUANT_DTYPES, SR_DTYPES, dtype_name, is_quantized, quant_max
from ssmstate.errors import ConfigError, ShapeError

#: amax of a nonzero row is floored at QMAX * 2**AMAX_FLOOR_EXP (keeps QMAX / amax finite).
AMAX_FLOOR_EXP = -117

MASK32 = 0xFFFFFFFF
HASH_MUL1 = 0x7FEB352D
HASH_MUL2 = 0x846CA68B

#: SR for float targets: low bits dropped from the fp32 pattern, smallest normal, subnormal grid exponent k.
_FLOAT_SR: dict[torch.dtype, tuple[int, float, int]] = {
    torch.bfloat16: (16, 0.0, 0),
    torch.float16: (13, 2.0 ** -14, 24),
    torch.float8_e4m3fn: (20, 2.0 ** -6, 9),
}
_FP8_MAX = 448.0
#: the canonical NaN of a 16-bit checkpoint (bf16 and fp16), as an int16 pattern
NAN16 = 0x7FFF


# -- deterministic encode / decode ------------------------------------------------
def row_scales(state: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (encode factor, decode scale), both fp32 of shape ``state.shape[:-1]``.

    Args:
        state: (..., N) float tensor, read as fp32; caller-owned, not modified.
        dtype: int8 or float8_e4m3fn.
    """
    qmax = quant_max(dtype)
    x = state.float()
    mag = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs())
    amax = mag.amax(dim=-1) if x.shape[-1] else torch.zeros(x.shape[:-1], device=x.device)
    amax = torch.where(amax > 0, amax.clamp_min(qmax * 2.0 ** AMAX_FLOOR_EXP), amax)
    enc = torch.where(amax == 0, torch.ones_like(amax), torch.full_like(amax, qmax) / amax)
    return enc, torch.ones_like(enc) / enc


def _round_int8(v: torch.Tensor) -> torch.Tensor:
    q = torch.round(v).clamp(-127.0, 127.0)
    return torch.where(torch.isnan(q), torch.zeros_like(q), q).to(torch.int8)


def _round_fp8(v: torch.Tensor) -> torch.Tensor:
    return _fp8_canonical_nan(v, v.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn))


def _fp8_canonical_nan(v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Every NaN of ``v`` stored as 0x7F, the canonical e4m3fn NaN (the sign of a NaN carries nothing, and the
    hardware conversion writes 0x7F), so every backend stores the same byte."""
    nan = torch.full_like(q.view(torch.uint8), 0x7F)
    return torch.where(torch.isnan(v), nan, q.view(torch.uint8)).view(torch.float8_e4m3fn)


def cast16(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``x`` cast to bf16 / fp16 (round to nearest even, subnormals kept), every NaN stored as 0x7FFF."""
    out = x.to(dtype).view(torch.int16)
    nan = torch.full_like(out, NAN16)
    return torch.where(torch.isnan(x), nan, out).view(dtype)


def encode(state: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows of ``state`` with round-to-nearest-even.

    Args:
        state: (..., P, N) float tensor (any float dtype, read as fp32); not modified.
        dtype: int8 or float8_e4m3fn.

    Returns:
        ``(q, scale)``: q (..., P, N) of ``dtype`` and the fp32 decode scale (..., P), new tensors.
    """
    enc, scale = row_scales(state, dtype)
    v = state.float() * enc.unsqueeze(-1)
    return (_round_int8(v) if dtype == torch.int8 else _round_fp8(v)), scale


def decode(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 state of codes ``q`` (..., P, N) and decode scales ``scale`` (..., P) fp32: ``fp32(q) * scale``."""
    if tuple(scale.shape) != tuple(q.shape[:-1]):
        raise ShapeError(f"scale shape {tuple(scale.shape)} does not match codes {tuple(q.shape)} (..., P, N)")
    return q.float() * scale.float().unsqueeze(-1)


# -- counter-based hash ------------------------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 ``x`` in [0, 2**32), without int64 overflow (split 16-bit multiply)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding uint32 values; a bijection of [0, 2**32)."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, HASH_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, HASH_MUL2)
    return x ^ (x >> 16)


def _word(v: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.int64, device=device) & MASK32


def seed_key(seed: torch.Tensor, layer: int) -> torch.Tensor:
    """Per-(seed, layer) hash state: ``mix(mix(mix(seed_lo) ^ seed_hi) ^ layer)``, an int64 scalar tensor.

    Args:
        seed: int64 tensor with one element (the manager's device seed); read, not modified.
        layer: Mamba layer index.
    """
    s = seed.reshape(()).to(torch.int64)
    acc = mix32(s & MASK32)
    acc = mix32(acc ^ ((s >> 32) & MASK32))
    return mix32(acc ^ _word(layer, s.device))


def sr_bits(seed: torch.Tensor, layer: int, pages: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """32 random bits (int64 in [0, 2**32)) per element of a (B, H, P, N) checkpoint write.

    Args:
        seed: int64 one-element tensor (manager-owned device seed).
        layer: Mamba layer index.
        pages: (B,) integer tensor, the page each batch row is written to.
        shape: (B, H, P, N).
    """
    B, H, P, N = shape
    dev = pages.device
    acc = seed_key(seed.to(dev), layer)
    acc = mix32(acc ^ (pages.to(torch.int64).reshape(B, 1, 1, 1) & MASK32))
    acc = mix32(acc ^ torch.arange(H, dtype=torch.int64, device=dev).reshape(1, H, 1, 1))
    acc = mix32(acc ^ torch.arange(P, dtype=torch.int64, device=dev).reshape(1, 1, P, 1))
    return mix32(acc ^ torch.arange(N, dtype=torch.int64, device=dev).reshape(1, 1, 1, N))


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 holding a uint32 pattern -> int32 with the same 32 bits."""
    return torch.where(x >= 2 ** 31, x - 2 ** 32, x).to(torch.int32)


def _uniform24(bits: torch.Tensor) -> torch.Tensor:
    """u in [0, 1) from the top 24 bits, exact in fp32."""
    return (bits >> 8).to(torch.float32) * 2.0 ** -24


# -- stochastic rounding -------------------------------------------------------------
def sr_round_int8(v: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """int8 codes ``clamp(floor(v + u), -127, 127)``, NaN -> 0; ``v`` fp32, ``bits`` int64 of the same shape."""
    q = torch.floor(v + _uniform24(bits)).clamp(-127.0, 127.0)
    return torch.where(torch.isnan(q), torch.zeros_like(q), q).to(torch.int8)


def sr_round_float(x: torch.Tensor, dtype: torch.dtype, bits: torch.Tensor) -> torch.Tensor:
    """Stochastically round fp32 ``x`` to bf16, fp16 or float8_e4m3fn (see the module docstring)."""
    drop, min_normal, k = _FLOAT_SR[dtype]
    x = x.float()
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-_FP8_MAX, _FP8_MAX)
    raw = x.view(torch.int32).to(torch.int64) & MASK32
    sign, mag = raw & 0x80000000, raw & 0x7FFFFFFF
    low = (1 << drop) - 1
    up = ((mag + (bits & low)) & ~low) | sign
    normal = _as_int32(up).view(torch.float32)
    normal = torch.where(torch.isfinite(x), normal, x)
    ax = x.abs()
    sub = torch.floor(ax * 2.0 ** k + _uniform24(bits)) * 2.0 ** -k
    out = torch.where(ax < min_normal, torch.copysign(sub, x), normal)
    if dtype == torch.float8_e4m3fn:
        return _fp8_canonical_nan(out, out.clamp(-_FP8_MAX, _FP8_MAX).to(dtype))
    return cast16(out, dtype)


def encode_sr(state: torch.Tensor, dtype: torch.dtype, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode` with stochastic rounding of ``v``; same scales, ``bits`` int64 shaped like ``state``."""
    enc, scale = row_scales(state, dtype)
    v = state.float() * enc.unsqueeze(-1)
    q = sr_round_int8(v, bits) if dtype == torch.int8 else sr_round_float(v, dtype, bits)
    return q, scale


# -- checkpoint write / read (all dtypes) ---------------------------------------------
def check_sr_dtype(dtype: torch.dtype) -> None:
    """Raise :class:`ConfigError` unless stochastic rounding applies to checkpoints of ``dtype``."""
    if dtype not in SR_DTYPES:
        raise ConfigError(
            f"stochastic rounding needs a bf16, fp16, int8 or fp8 checkpoint; {dtype_name(dtype)} stores the "
            f"state exactly"
        )


def quantize(state: torch.Tensor, dtype: torch.dtype, *, seed: torch.Tensor | None = None, layer: int = 0,
             pages: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a checkpoint write of ``state`` stores: ``(stored, scale)``.

    Args:
        state: (B, H, P, N) fp32 state being checkpointed (any float dtype; read only).
        dtype: checkpoint dtype (fp32, bf16, fp16, int8, float8_e4m3fn).
        seed: None for round-to-nearest; an int64 one-element device tensor for stochastic rounding.
        layer: Mamba layer index (mixed into the SR hash).
        pages: (B,) page index of each row (SR only; part of the hash counter).

    Returns:
        stored (B, H, P, N) of ``dtype``; scale (B, H, P) fp32 for 8-bit dtypes, else None.
    """
    if seed is None:
        if is_quantized(dtype):
            return encode(state, dtype)
        return (cast16(state.float(), dtype) if dtype in (torch.bfloat16, torch.float16) else state.to(dtype)), None
    check_sr_dtype(dtype)
    if pages is None or state.dim() != 4:
        raise ShapeError("stochastic rounding needs a (B, H, P, N) state and its (B,) pages")
    bits = sr_bits(seed, layer, pages, tuple(state.shape))
    if dtype in QUANT_DTYPES:
        return encode_sr(state, dtype, bits)
    return sr_round_float(state, dtype, bits), None


def dequantize(stored: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 state of a stored checkpoint (``scale`` None for fp32/bf16/fp16 checkpoints)."""
    return stored.float() if scale is None else decode(stored, scale)
