"""The Triton side of the checkpoint quantization that :mod:`ssmstate.ops.quant` defines: device helpers the
verify and materialize kernels share.

``QMODE`` (a constexpr the kernels derive from the checkpoint pointer's element type): 0 an unquantized
checkpoint (fp32/bf16/fp16), 1 int8, 2 fp8_e4m3fn. An fp8 checkpoint reaches the kernels as its bytes (a uint8
view): Triton's interpreter converts fp32 to and from e4m3 inexactly (no round-to-nearest-even, no NaN, no
saturation), so there the codes are formed and read from their bits (``CODES_FROM_BITS``); on the GPU the
conversion unit forms them (``cvt.rn.satfinite``: round to nearest even, saturated, as the reference) and reads
them (exact, NaN included).

Encode of one (page, h, p) row over its N values (all fp32): ``amax = max |S|`` (NaN entries ignored), floored at
``QMAX 2^-117`` when positive; ``enc = 1`` if ``amax == 0`` else ``QMAX / amax``; ``scale = 1 / enc`` (both
IEEE divisions, :func:`tl.math.div_rn`); ``q = rne(S enc)`` saturated (int8: ±127, NaN → 0; e4m3: ±448, NaN →
NaN). Decode: ``fp32(q) · scale``. A row holds the whole of N, so a kernel that folds a tile in N chunks finds
every chunk's amax before it stores any byte (:func:`chunk_amax` then :func:`store_codes`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops.triton.common import INTERPRETED, chunk, fold_chunk_value, load_raw

Tensor = torch.Tensor

#: round-to-nearest-even of |v| < 2^22: ``(v + RNE_MAGIC) - RNE_MAGIC`` in fp32 (1.5 * 2^23)
RNE_MAGIC = tl.constexpr(12582912.0)
#: the floor of a positive amax, ``QMAX 2^-117`` (int8, e4m3): the encode factor stays finite
AMAX_FLOOR_INT8 = tl.constexpr(127.0 * 2.0**-117)
AMAX_FLOOR_FP8 = tl.constexpr(448.0 * 2.0**-117)


#: e4m3 codes are built and read from their bits where the kernels run in the interpreter (it has no fp8 type)
CODES_FROM_BITS = tl.constexpr(INTERPRETED)


@triton.jit
def qmax(QMODE: tl.constexpr):
    """The largest code magnitude: 127 (int8) or 448 (e4m3)."""
    if QMODE == 1:
        return 127.0
    else:
        return 448.0


@triton.jit
def amax_floor(QMODE: tl.constexpr):
    if QMODE == 1:
        return AMAX_FLOOR_INT8
    else:
        return AMAX_FLOOR_FP8


@triton.jit
def fp8_decode_bits(raw):
    """e4m3fn bytes (any integer type) as fp32 from their bits: exact, 0x7F/0xFF NaN, ±0 kept."""
    b = raw.to(tl.int32) & 0xFF
    e = (b >> 3) & 15
    m = b & 7
    normal = ((e + 120) << 23) | (m << 20)
    sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m 2^-9, exact
    mag = tl.where(e == 0, sub, normal)
    mag = tl.where((e == 15) & (m == 7), 0x7FC00000, mag)
    return (mag | ((b >> 7) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def codes(raw, QMODE: tl.constexpr):
    """The stored codes ``q`` of an int8 / e4m3 (bytes) tile as fp32, unscaled."""
    if QMODE == 1:
        return raw.to(tl.float32)
    elif CODES_FROM_BITS:
        return fp8_decode_bits(raw)
    else:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def e4m3_as_bf16(raw):
    """e4m3 bytes as bf16, exactly, without the conversion unit's bf16 path (a quarter-rate F2F per value on
    sm_90): e4m3 to f16 (packed), f16 to f32 (exact), then the f32's upper half, which holds every bit of a value
    with 3 mantissa bits (NaN stays NaN)."""
    f = raw.to(tl.float8e4nv, bitcast=True).to(tl.float16).to(tl.float32)
    return (f.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def codes_as(raw, DT: tl.constexpr, QMODE: tl.constexpr):
    """The codes in the 16-bit dtype ``DT`` of the readout's other operand (every int8 / e4m3 value is exact in
    bf16 and fp16), or fp32 where ``DT`` is fp32 (exact in tf32 too)."""
    if DT == tl.float32 or CODES_FROM_BITS:
        return codes(raw, QMODE)
    elif QMODE == 1:
        return raw.to(DT)
    elif DT == tl.bfloat16:
        return e4m3_as_bf16(raw)
    else:
        return raw.to(tl.float8e4nv, bitcast=True).to(DT)


@triton.jit
def dequant(raw, scale, QMODE: tl.constexpr):
    """A (rows, cols) tile as fp32: ``fp32(q) * scale[row]`` (``scale``: (rows,) fp32)."""
    return codes(raw, QMODE) * scale[:, None]


@triton.jit
def chunk_amax(S, amax):
    """``max(amax, max_n |S[:, n]|)`` per row, NaN entries ignored (fmaxf semantics on every backend)."""
    a = tl.where(S == S, tl.abs(S), 0.0)
    return tl.maximum(amax, tl.max(a, axis=1))


@triton.jit
def encode_scales(amax, QMODE: tl.constexpr):
    """(encode factor, decode scale) of rows with these amaxes: ``enc = QMAX / amax`` (1 for an all-zero row,
    0 for a row holding an inf) and ``scale = 1 / enc`` (inf for such a row: it decodes to NaN, never silently
    finite)."""
    QM: tl.constexpr = qmax(QMODE)
    a = tl.where(amax > 0.0, tl.maximum(amax, amax_floor(QMODE)), amax)
    enc = tl.where(a == 0.0, 1.0, tl.math.div_rn(tl.full(a.shape, QM, tl.float32), tl.where(a == 0.0, 1.0, a)))
    inf = tl.full(a.shape, 0x7F800000, tl.int32).to(tl.float32, bitcast=True)
    scale = tl.where(enc == 0.0, inf, tl.math.div_rn(tl.full(a.shape, 1.0, tl.float32), tl.where(enc == 0.0, 1.0, enc)))
    return enc, scale


@triton.jit
def int8_code(v):
    """``v`` (already ``S * enc``) rounded to nearest even, saturated to [-127, 127], NaN → 0, as int8."""
    v = tl.where(v == v, v, 0.0)
    v = tl.minimum(tl.maximum(v, -127.0), 127.0)  # no add follows a multiply: nothing to contract into an fma
    return ((v + RNE_MAGIC) - RNE_MAGIC).to(tl.int8)


@triton.jit
def fp8_code(v):
    """``v`` (already ``S * enc``) as e4m3fn bytes (uint8): clamped to [-448, 448], round to nearest even, NaN →
    0x7F (the canonical NaN, either sign). On the GPU the conversion unit's ``cvt.rn.satfinite.e4m3x2.f32``, one
    instruction per two codes; in the interpreter, which has no fp8 type, from the fp32 bits."""
    if CODES_FROM_BITS:
        return fp8_code_bits(v)
    code = tl.minimum(tl.maximum(v, -448.0), 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return tl.where(v == v, code, 0x7F).to(tl.uint8)


@triton.jit
def fp8_code_bits(v):
    """:func:`fp8_code` from the fp32 bits, in integer operations."""
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF
    nan = a > 0x7F800000
    a = tl.minimum(a, 0x43E00000)  # |v| <= 448 (ordered as integers: non-negative floats)
    r = a + 0x7FFFF + ((a >> 20) & 1)  # round the mantissa to 3 bits, ties to even
    normal = (r >> 20) - (120 << 3)
    f = a.to(tl.float32, bitcast=True) * 512.0  # below 2^-6: m 2^-9, m = rne(|v| 2^9) in [0, 8]
    sub = ((f + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a >= 0x3C800000, normal, sub) | (sign << 7)
    return tl.where(nan, 0x7F, code).to(tl.uint8)


@triton.jit
def quantize(S, enc, QMODE: tl.constexpr):
    """The codes of a (rows, cols) fp32 tile for the rows' encode factors ``enc`` (rows,), in the stored type (int8,
    or uint8 bytes of e4m3)."""
    v = S * enc[:, None]
    if QMODE == 1:
        return int8_code(v)
    else:
        return fp8_code(v)


@triton.jit
def quantize_tile(S, QMODE: tl.constexpr):
    """Codes and decode scales of a whole-row tile ``S`` (rows, N): ``(codes, scale (rows,))``."""
    amax = chunk_amax(S, tl.zeros((S.shape[0],), dtype=tl.float32))
    enc, scale = encode_scales(amax, QMODE)
    return quantize(S, enc, QMODE), scale


# -- stochastic rounding (ssmstate.ops.quant: the same hash and bit tricks, bit for bit) --------------------


@triton.jit
def mix32(x):
    """lowbias32 on uint32."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def sr_page_key(seed_ptr, layer, page):
    """The hash state after ``seed_lo, seed_hi, layer, page`` (uint32 scalar); ``seed_ptr``: int64 (1,)."""
    s = tl.load(seed_ptr).to(tl.int64)
    acc = mix32((s & 0xFFFFFFFF).to(tl.uint32))
    acc = mix32(acc ^ ((s >> 32) & 0xFFFFFFFF).to(tl.uint32))
    acc = mix32(acc ^ layer.to(tl.uint32))
    return mix32(acc ^ (page & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def sr_head_key(key_page, h):
    """The hash state after head ``h`` too."""
    return mix32(key_page ^ h.to(tl.uint32))


@triton.jit
def sr_bits(key_h, offs_p, oc):
    """32 random bits (uint32) of each element (p, n) of a tile: the hash folded over ``p`` then ``n``."""
    rowk = mix32(key_h ^ offs_p.to(tl.uint32))
    return mix32(rowk[:, None] ^ oc.to(tl.uint32)[None, :])


@triton.jit
def uniform24(bits):
    """u in [0, 1) from the top 24 bits, exact in fp32."""
    return (bits >> 8).to(tl.float32) * 5.960464477539063e-08  # 2^-24


@triton.jit
def sr_int8(v, bits):
    """int8 codes ``clamp(floor(v + u), -127, 127)``, NaN → 0 (``v``: ``S * enc``)."""
    v = tl.where(v == v, v, 0.0)  # NaN → floor(u) = 0; the select also keeps the add out of an fma with the product
    q = tl.floor(v + uniform24(bits))
    return tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8)


@triton.jit
def sr_float(x, bits, DROP: tl.constexpr, MIN_NORMAL: tl.constexpr, K: tl.constexpr, FP8: tl.constexpr):
    """fp32 ``x`` stochastically rounded onto the grid of a float type dropping ``DROP`` mantissa bits (16 bf16, 13
    fp16, 20 e4m3), as fp32 (exact in that type): the low bits of ``bits`` added to the magnitude bits and cleared;
    below ``MIN_NORMAL`` (0: none), ``floor(|x| 2^K + u) 2^-K``; e4m3 clamped to ±448 before and after."""
    if FP8:
        x = tl.where(x == x, tl.minimum(tl.maximum(x, -448.0), 448.0), x)
    raw = x.to(tl.uint32, bitcast=True)
    sign = raw & 0x80000000
    mag = raw & 0x7FFFFFFF
    LOW: tl.constexpr = (1 << DROP) - 1
    HIGH: tl.constexpr = 0xFFFFFFFF - LOW
    up = ((mag + (bits & LOW)) & HIGH) | sign
    out = tl.where(mag < 0x7F800000, up.to(tl.float32, bitcast=True), x)
    if MIN_NORMAL > 0.0:
        ax = tl.abs(x)
        sub = tl.floor(ax * (2.0 ** K) + uniform24(bits)) * (2.0 ** -K)
        out = tl.where(ax < MIN_NORMAL, (sub.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True), out)
    if FP8:
        out = tl.where(out == out, tl.minimum(tl.maximum(out, -448.0), 448.0), out)
    return out


@triton.jit
def quantize_sr(S, enc, bits, QMODE: tl.constexpr):
    """:func:`quantize` with stochastic rounding (``bits``: uint32 per element)."""
    v = S * enc[:, None]
    if QMODE == 1:
        return sr_int8(v, bits)
    else:
        return fp8_code(sr_float(v, bits, 20, 0.015625, 9, True))


@triton.jit
def round_store_value(S, bits, ST: tl.constexpr, SR: tl.constexpr):
    """An unquantized checkpoint's stored values of the fp32 tile ``S``: cast to ``ST``, or (``SR``, bf16/fp16)
    stochastically rounded first (then the cast is exact); a bf16 / fp16 NaN stored as 0x7FFF (the GPU's cast
    writes it; the bf16 bit path and the interpreter's cast would keep a payload)."""
    if SR:
        if ST == tl.bfloat16:  # the top half of the fp32 bits (exact; the interpreter's cast flushes subnormals)
            top = (sr_float(S, bits, 16, 0.0, 0, False).to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
        else:  # fp16: min normal 2^-14
            top = sr_float(S, bits, 13, 6.103515625e-05, 24, False).to(ST).to(tl.uint16, bitcast=True)
        return tl.where(S == S, top, 0x7FFF).to(tl.uint16).to(ST, bitcast=True)
    elif ST == tl.bfloat16:  # round to nearest even on the bits (the interpreter's cast does not)
        b = S.to(tl.uint32, bitcast=True)
        top = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).to(tl.uint16)
        return tl.where(S == S, top, 0x7FFF).to(tl.uint16).to(ST, bitcast=True)
    elif ST == tl.float16:
        return tl.where(S == S, S.to(ST).to(tl.uint16, bitcast=True), 0x7FFF).to(tl.uint16).to(ST, bitcast=True)
    else:
        return S.to(ST)


@triton.jit
def load_scale(cks_row, mp, EVEN: tl.constexpr):
    """A tile's decode scales (BLOCK_P,) fp32 from their row pointers (1 past P: never read there)."""
    if EVEN:
        return tl.load(cks_row)
    else:
        return tl.load(cks_row, mask=mp, other=1.0)


@triton.jit
def fold_store_quant(ck_page, cks_row, h, s_ck_h, mp, offs_p, N_, b_hist, is_hist, XTw, hi, lo, carry, sc_old,
                     key_h, S_CK_P: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                     FOLD_N: tl.constexpr, EVEN: tl.constexpr, FOLD_SPLIT: tl.constexpr, FOLD_PREC: tl.constexpr,
                     QMODE: tl.constexpr, SR: tl.constexpr, IDX64: tl.constexpr):
    """A flush row's fold of head ``h``'s quantized tile, stored as codes and new decode scales.

    ``S1 = e^{AΛ_h} dequant(S0) + (X_h w)ᵀ B_h`` (``sc_old``: the tile's decode scales, loaded before any is
    rewritten). In FOLD_N-column chunks the fold runs twice: the first pass finds each row's amax over the whole of
    N, the second recomputes the same chunks (the same operations, so the same values) and stores their codes; the
    codes of a chunk are written only once every chunk's amax is known. A whole-tile fold runs once. ``SR``: the
    codes stochastically rounded with the bits of ``key_h`` (:func:`sr_head_key`; else unused)."""
    if FOLD_N >= BLOCK_N:
        oc, ck, mc = chunk(ck_page, h, s_ck_h, 0, mp, N_, S_CK_P, BLOCK_P, BLOCK_N, IDX64)
        S1 = fold_chunk_value(dequant(load_raw(ck, mc, EVEN), sc_old, QMODE) * carry, oc, b_hist, is_hist,
                              N_, XTw, hi, lo, FOLD_SPLIT, FOLD_PREC)
        enc, scale = encode_scales(chunk_amax(S1, tl.zeros((BLOCK_P,), dtype=tl.float32)), QMODE)
        store_codes(ck, mc, encode_tile(S1, enc, key_h, offs_p, oc, QMODE, SR), EVEN)
    else:
        amax = tl.zeros((BLOCK_P,), dtype=tl.float32)
        for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
            oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
            S1 = fold_chunk_value(dequant(load_raw(ck, mc, EVEN), sc_old, QMODE) * carry, oc, b_hist,
                                  is_hist, N_, XTw, hi, lo, FOLD_SPLIT, FOLD_PREC)
            amax = chunk_amax(S1, amax)
        enc, scale = encode_scales(amax, QMODE)
        for n0 in tl.static_range(0, BLOCK_N, FOLD_N):
            oc, ck, mc = chunk(ck_page, h, s_ck_h, n0, mp, N_, S_CK_P, BLOCK_P, FOLD_N, IDX64)
            S1 = fold_chunk_value(dequant(load_raw(ck, mc, EVEN), sc_old, QMODE) * carry, oc, b_hist,
                                  is_hist, N_, XTw, hi, lo, FOLD_SPLIT, FOLD_PREC)
            store_codes(ck, mc, encode_tile(S1, enc, key_h, offs_p, oc, QMODE, SR), EVEN)
    if EVEN:
        tl.store(cks_row, scale)
    else:
        tl.store(cks_row, scale, mask=mp)


@triton.jit
def encode_tile(S, enc, key_h, offs_p, oc, QMODE: tl.constexpr, SR: tl.constexpr):
    """The codes of tile ``S`` (rows ``offs_p``, columns ``oc``), rounded to nearest or (``SR``) stochastically."""
    if SR:
        return quantize_sr(S, enc, sr_bits(key_h, offs_p, oc), QMODE)
    else:
        return quantize(S, enc, QMODE)


@triton.jit
def store_codes(ck, mc, q, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ck, q)
    else:
        tl.store(ck, q, mask=mc)


# -- host ------------------------------------------------------------------------------------------

#: checkpoint dtypes stored as codes with per-row decode scales
QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn)


def kernel_checkpoint(checkpoint: Tensor, checkpoint_scale: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The checkpoint as the kernels take it (an e4m3 one as its bytes, a uint8 view) and its decode scales,
    checked: an int8 / e4m3 checkpoint (pages, H, P, N) needs ``checkpoint_scale`` (pages, H, P) fp32 on its device,
    contiguous in P; any other takes none."""
    if checkpoint.dtype not in QUANT_DTYPES:
        if checkpoint_scale is not None:
            raise ShapeError(f"checkpoint_scale is only for int8/fp8 checkpoints, got a {checkpoint.dtype} one")
        return checkpoint, None
    if checkpoint_scale is None:
        raise ShapeError(f"a {checkpoint.dtype} checkpoint needs its checkpoint_scale (pages, H, P) fp32")
    want = tuple(checkpoint.shape[:3])
    if (tuple(checkpoint_scale.shape) != want or checkpoint_scale.dtype != torch.float32
            or checkpoint_scale.device != checkpoint.device):
        raise ShapeError(f"checkpoint_scale must be {want} float32 on {checkpoint.device}, got "
                         f"{tuple(checkpoint_scale.shape)} {checkpoint_scale.dtype} on {checkpoint_scale.device}")
    if checkpoint_scale.stride(-1) != 1 and want[-1] > 1:
        raise ShapeError(f"checkpoint_scale must be contiguous in P (stride {checkpoint_scale.stride(-1)})")
    if checkpoint.dtype == torch.float8_e4m3fn:
        return checkpoint.view(torch.uint8), checkpoint_scale
    return checkpoint, checkpoint_scale


def scale_strides(checkpoint_scale: Tensor | None) -> tuple[int, int]:
    """(page, head) strides of the decode scales; (0, 0) without."""
    return tuple(checkpoint_scale.stride()[:2]) if checkpoint_scale is not None else (0, 0)


def check_sr_seed(checkpoint: Tensor, sr_seed: Tensor | None, layer: int) -> None:
    """Stochastic rounding needs a bf16/fp16/int8/fp8 checkpoint (as the kernels take it) and an int64 (1,) seed on
    its device; ``layer`` an int in [0, 2^31)."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2**31:
        raise ConfigError(f"layer must be an int in [0, 2**31), got {layer!r}")
    if sr_seed is None:
        return
    if checkpoint.dtype not in (torch.bfloat16, torch.float16, torch.int8, torch.uint8):
        raise ConfigError(f"stochastic rounding needs a bf16, fp16, int8 or fp8 checkpoint, got {checkpoint.dtype}")
    if sr_seed.dtype != torch.int64 or sr_seed.numel() != 1 or sr_seed.device != checkpoint.device:
        raise ShapeError(f"sr_seed must be one int64 on {checkpoint.device}, got {tuple(sr_seed.shape)} "
                         f"{sr_seed.dtype} on {sr_seed.device}")
