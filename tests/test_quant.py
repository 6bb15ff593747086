"""The reference checkpoint quantization (ssmstate.ops.quant): hand-checked encodes, edge rows, SR."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from ssmstate.dtypes import is_quantized, quant_max, to_dtype
from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops import quant

FP8 = torch.float8_e4m3fn
I8 = torch.int8


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_dtype_names():
    assert to_dtype("int8") is I8 and to_dtype("fp8") is FP8 and to_dtype("float8_e4m3fn") is FP8
    assert is_quantized(I8) and is_quantized(FP8) and not is_quantized(torch.bfloat16)
    assert quant_max(I8) == 127.0 and quant_max(FP8) == 448.0
    with pytest.raises(ConfigError):
        quant_max(torch.float32)


def test_int8_hand_checked_row():
    row = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    q, scale = quant.encode(row, I8)
    enc = _f32(127.0 / 2.0)
    assert scale.item() == _f32(1.0 / enc)
    # 2 -> 127, -1 -> -63.5 -> -64 (half to even), 0.5 -> 31.75 -> 32
    assert q.tolist() == [[127, -64, 32, 0]]
    assert torch.equal(quant.decode(q, scale), q.float() * scale.unsqueeze(-1))


def test_int8_round_half_to_even():
    # amax 127 -> enc exactly 1, so v equals the input.
    row = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999998]])
    q, scale = quant.encode(row, I8)
    assert scale.item() == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3]]


def test_fp8_hand_checked_row():
    row = torch.tensor([[448.0, 1.0, 17.0, 19.0, -0.001]])
    q, scale = quant.encode(row, FP8)
    assert scale.item() == 1.0
    # e4m3 at 16..32 has step 2: 17 -> 16 (tie, even mantissa), 19 -> 20 (tie, even); 0.001 -> 2**-9 subnormal
    assert q.float().tolist() == [[448.0, 1.0, 16.0, 20.0, -2.0 ** -9]]


def test_zero_row_and_all_nan_row():
    for dt in (I8, FP8):
        q, scale = quant.encode(torch.zeros(2, 3, 8), dt)
        assert torch.all(scale == 1.0) and torch.all(q.float() == 0)
        q, scale = quant.encode(torch.full((1, 4), float("nan")), dt)
        assert scale.item() == 1.0


def test_nan_entries_are_ignored_by_amax():
    row = torch.tensor([[float("nan"), 1.0, -0.5]])
    q, scale = quant.encode(row, I8)
    assert q.tolist() == [[0, 127, -64]] and scale.item() == _f32(1.0 / _f32(127.0))
    q, _ = quant.encode(row, FP8)
    assert math.isnan(q.float()[0, 0].item()) and q.float()[0, 1].item() == 448.0
    # a NaN of either sign is stored as the canonical e4m3fn NaN byte 0x7F
    q, _ = quant.encode(torch.tensor([[float("nan"), -float("nan"), 1.0]]), FP8)
    assert q.view(torch.uint8).tolist() == [[0x7F, 0x7F, 0x7E]]
    bits = _const_bits((2,), 0xFFFFFFFF)
    out = quant.sr_round_float(torch.tensor([float("nan"), -float("nan")]), FP8, bits)
    assert out.view(torch.uint8).tolist() == [0x7F, 0x7F]


def test_inf_poisons_the_row():
    for dt in (I8, FP8):
        row = torch.tensor([[float("inf"), 1.0], [1.0, 2.0]])
        q, scale = quant.encode(row, dt)
        assert scale[0].item() == float("inf")
        assert torch.isnan(quant.decode(q, scale)[0]).all()
        assert torch.isfinite(quant.decode(q, scale)[1]).all()


def test_saturation_and_amax_floor():
    # The largest magnitude encodes to exactly QMAX; nothing exceeds it.
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0)) * torch.logspace(-30, 30, 64).unsqueeze(-1)
    for dt in (I8, FP8):
        q, scale = quant.encode(x, dt)
        qf = q.float()
        assert qf.abs().amax(-1).eq(quant_max(dt)).all()
    tiny = torch.tensor([[1e-44, -1e-45]])  # subnormal amax: floored, encode factor finite
    q, scale = quant.encode(tiny, I8)
    assert math.isfinite(scale.item()) and scale.item() > 0
    assert scale.item() == _f32(1.0 / _f32(127.0 / _f32(127.0 * 2.0 ** -117)))


@pytest.mark.parametrize("seed", range(4))
def test_decode_error_within_half_step(seed):
    """Decode error <= half a code step, plus the fp32 rounding of enc, v and 1/enc (a few ulps of the row max)."""
    x = torch.randn(4, 8, 16, 64, generator=torch.Generator().manual_seed(seed))
    for dt in (I8, FP8):
        q, scale = quant.encode(x, dt)
        err = (quant.decode(q, scale) - x).abs()
        s = scale.unsqueeze(-1)
        slack = quant_max(dt) * s * 2.0 ** -21  # 4 ulps of the row max
        if dt == I8:
            assert torch.all(err <= 0.5 * s + slack)
        else:  # e4m3: half an ulp of the code, 2**-4 relative for normals, 2**-10 absolute in code units below
            code = (x / s).abs()
            bound = torch.maximum(code * 2.0 ** -4, torch.full_like(code, 2.0 ** -10)) * s
            assert torch.all(err <= bound + slack)


def test_decode_shape_checked():
    with pytest.raises(ShapeError):
        quant.decode(torch.zeros(2, 3, 4, dtype=I8), torch.ones(2, 4))


# -- hash ------------------------------------------------------------------------------
def _lowbias32(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _bits_py(seed: int, layer: int, page: int, h: int, p: int, n: int) -> int:
    acc = _lowbias32(seed & 0xFFFFFFFF)
    for w in ((seed >> 32) & 0xFFFFFFFF, layer, page, h, p, n):
        acc = _lowbias32(acc ^ (w & 0xFFFFFFFF))
    return acc


def test_mix32_matches_python_integers():
    xs = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x12345678, 0xDEADBEEF]
    got = quant.mix32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_lowbias32(x) for x in xs]
    assert _lowbias32(0) == 0 and _lowbias32(1) != 1


def test_sr_bits_match_the_documented_fold():
    seed = torch.tensor([(-5) & 0x7FFFFFFFFFFFFFFF], dtype=torch.int64)
    pages = torch.tensor([3, 7])
    bits = quant.sr_bits(seed, 2, pages, (2, 2, 3, 4))
    s = int(seed.item())
    for b in range(2):
        for h in range(2):
            for p in range(3):
                for n in range(4):
                    assert bits[b, h, p, n].item() == _bits_py(s, 2, int(pages[b]), h, p, n)
    # Different layers and seeds decorrelate.
    assert not torch.equal(bits, quant.sr_bits(seed, 3, pages, (2, 2, 3, 4)))
    assert not torch.equal(bits, quant.sr_bits(seed + 1, 2, pages, (2, 2, 3, 4)))


def test_sr_bits_are_uniform():
    bits = quant.sr_bits(torch.tensor([12345]), 0, torch.arange(1, 9), (8, 4, 16, 64)).flatten()
    # Each of the 32 bit positions is set about half the time (n = 32768; 6 sigma = 0.0166).
    for k in range(32):
        frac = ((bits >> k) & 1).float().mean().item()
        assert abs(frac - 0.5) < 0.0166, (k, frac)


# -- stochastic rounding ------------------------------------------------------------------
def _const_bits(shape, value: int) -> torch.Tensor:
    return torch.full(shape, value, dtype=torch.int64)


def test_sr_bit_patterns_float():
    x = torch.tensor([1.0 + 2.0 ** -10])  # bf16 step at 1 is 2**-7: fraction of the gap 1/8
    lo, hi = 1.0, 1.0 + 2.0 ** -7
    assert quant.sr_round_float(x, torch.bfloat16, _const_bits((1,), 0)).item() == lo
    # adding 0xFFFF carries exactly when the dropped part (0x2000) + r >= 0x10000
    assert quant.sr_round_float(x, torch.bfloat16, _const_bits((1,), 0xE000 - 1)).item() == lo
    assert quant.sr_round_float(x, torch.bfloat16, _const_bits((1,), 0xE000)).item() == hi
    # negative values round in magnitude (toward -inf with the same probability)
    assert quant.sr_round_float(-x, torch.bfloat16, _const_bits((1,), 0xE000)).item() == -hi
    # a carry through the mantissa moves to the next binade
    y = torch.tensor([2.0 - 2.0 ** -12])
    assert quant.sr_round_float(y, torch.bfloat16, _const_bits((1,), 0xFFFF)).item() == 2.0
    # fp16 keeps 13 fewer bits; fp8 20
    assert quant.sr_round_float(x, torch.float16, _const_bits((1,), 0)).item() == lo + 2.0 ** -10
    assert quant.sr_round_float(x, FP8, _const_bits((1,), 0xFFFFF)).item() == 1.125
    # inf and NaN pass through; fp8 saturates at 448 instead of rounding up into NaN
    z = torch.tensor([float("inf"), float("nan"), 447.0, 1e9])
    out = quant.sr_round_float(z, torch.bfloat16, _const_bits((4,), 0xFFFFFFFF)).float()
    assert out[0].item() == float("inf") and math.isnan(out[1].item())
    out8 = quant.sr_round_float(z, FP8, _const_bits((4,), 0xFFFFFFFF)).float()
    assert out8[0].item() == 448.0 and math.isnan(out8[1].item()) and out8[2].item() == 448.0
    assert out8[3].item() == 448.0


def test_sr_subnormal_grid():
    # fp8 subnormal step 2**-9: 0.25 of a step rounds up when u >= 0.75
    x = torch.tensor([2.0 ** -11, -(2.0 ** -11)])
    u_lo = (int(0.74 * 2 ** 24) << 8)
    u_hi = (int(0.75 * 2 ** 24) << 8)
    assert quant.sr_round_float(x, FP8, _const_bits((2,), u_lo)).float().tolist() == [0.0, 0.0]
    assert quant.sr_round_float(x, FP8, _const_bits((2,), u_hi)).float().tolist() == [2.0 ** -9, -(2.0 ** -9)]
    y = torch.tensor([2.0 ** -26])  # fp16 step 2**-24
    assert quant.sr_round_float(y, torch.float16, _const_bits((1,), u_hi)).item() == 2.0 ** -24


def test_sr_int8_rule():
    v = torch.tensor([0.25, -0.25, 126.9, -127.0, float("nan")])
    u_hi = (int(0.8 * 2 ** 24) << 8)
    assert quant.sr_round_int8(v, _const_bits((5,), 0)).tolist() == [0, -1, 126, -127, 0]
    assert quant.sr_round_int8(v, _const_bits((5,), u_hi)).tolist() == [1, 0, 127, -127, 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, I8, FP8])
def test_sr_is_unbiased(dtype):
    """The mean over many seeds of an SR write equals the value; RN is visibly biased on the same values."""
    g = torch.Generator().manual_seed(0)
    state = torch.randn(1, 2, 4, 16, generator=g)
    pages = torch.tensor([5])
    trials = 400  # 128 elements x 400 seeds per dtype
    acc = torch.zeros_like(state, dtype=torch.float64)
    for s in range(trials):
        stored, scale = quant.quantize(state, dtype, seed=torch.tensor([s]), layer=1, pages=pages)
        acc += quant.dequantize(stored, scale).double()
    mean = acc / trials
    rn = quant.dequantize(*quant.quantize(state, dtype)).double()
    gap = _grid_gap(state, dtype)
    x = state.double()
    # Per element the SR outcome is Bernoulli on the grid gap g: its mean has std <= g / (2 sqrt(trials)).
    z = (mean - x).abs() / (gap / (2 * math.sqrt(trials)))
    assert z.max().item() < 6.0
    # Summed over the 128 elements the normalized errors are close to normal with std <= sqrt(128 / 4 / trials);
    # a bias of a few percent of a step in either direction (signed, or toward zero) fails these 5-sigma bounds.
    sigma = math.sqrt(x.numel() / 4 / trials)
    assert abs(((mean - x) / gap).sum().item()) < 5 * sigma
    assert abs((torch.sign(x) * (mean - x) / gap).sum().item()) < 5 * sigma
    # SR averages closer to the value than RN does, summed over the tensor
    assert (mean - state.double()).abs().sum() < (rn - state.double()).abs().sum() * 0.5


def _grid_gap(state: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of the target grid around each value (fp64), normal range."""
    x = state.double()
    if dtype in (torch.bfloat16, torch.float16):
        mbits, emin = (7, -126) if dtype == torch.bfloat16 else (10, -14)
        _, e = torch.frexp(x)
        return torch.pow(2.0, torch.clamp(e - 1, min=emin) - mbits).double()
    enc, scale = quant.row_scales(state, dtype)
    if dtype == I8:
        return scale.double().unsqueeze(-1).expand_as(x)
    _, e = torch.frexp(x * enc.double().unsqueeze(-1))
    return torch.pow(2.0, torch.clamp(e - 1, min=-6) - 3).double() * scale.double().unsqueeze(-1)


def test_quantize_checks():
    s = torch.randn(2, 2, 4, 8)
    with pytest.raises(ConfigError):
        quant.quantize(s, torch.float32, seed=torch.tensor([1]), pages=torch.tensor([1, 2]))
    with pytest.raises(ShapeError):
        quant.quantize(s, I8, seed=torch.tensor([1]))
    stored, scale = quant.quantize(s, torch.bfloat16)
    assert scale is None and stored.dtype == torch.bfloat16
    stored, scale = quant.quantize(s, I8)
    assert scale.shape == (2, 2, 4) and scale.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sr", [False, True])
def test_16bit_nan_is_canonical(dtype, sr):
    """Every NaN, of either sign and any payload, is stored as 0x7FFF (what the GPU's cast writes; CPU torch writes
    0x7E00 or 0xFFFF), and a 1-element tensor (CPU torch's scalar path) stores the same bytes as a long one."""
    nans = torch.tensor([0x7FC00000, -0x400000, 0x7F800001, 0x7FBFFFFF], dtype=torch.int32).view(torch.float32)
    S = torch.cat([nans, torch.tensor([1.0, -0.0, float("inf"), 1e-40])]).repeat(9).reshape(1, 1, 1, 72)
    kw = dict(seed=torch.tensor([3]), layer=1, pages=torch.tensor([2])) if sr else {}
    for x in (S, S[..., :1]):
        got = quant.quantize(x, dtype, **kw)[0].view(torch.int16).reshape(-1)
        isnan = x.reshape(-1).isnan()
        assert bool((got[isnan] == 0x7FFF).all()), got[isnan].tolist()
        if not sr:
            assert torch.equal(got[~isnan], x.reshape(-1)[~isnan].to(dtype).view(torch.int16))


def test_fold_of_a_zero_state_is_plus_zero():
    """The reference fold stores +0 where S0 is -0 and the update is zero, for one history row as for several (a
    kernel's padded dot gives +0 there; einsum over a single row would keep the product's signed zero)."""
    from ssmstate.ops.reference import fold

    g = torch.Generator().manual_seed(0)
    for k in (1, 2, 5):
        S0 = torch.full((4, 8, 16), -0.0)
        x, B = torch.randn(k, 4, 8, generator=g), torch.randn(k, 2, 16, generator=g)
        S = fold(S0, x, B, torch.zeros(k, 4), -torch.rand(4, generator=g) - 0.3)
        assert not bool(torch.signbit(S).any()), f"k={k}: {int(torch.signbit(S).sum())} negative zeros"


@pytest.mark.parametrize("dtype", [I8, FP8], ids=str)
@pytest.mark.parametrize("fold_tol", [0.0, 1e-7, 1e-6, 1e-4])
def test_scale_moves_with_its_rows_fold(dtype, fold_tol):
    """The kernel tests' scale bound (tests.quant_common.scale_tol): rows whose values move by up to ``fold_tol`` of
    the row's largest value (a fold in another order) get scales within ``fold_tol`` plus the divisions' rounding,
    and no closer bound holds: the largest value moving by ``fold_tol`` moves the scale by as much."""
    from tests.quant_common import scale_tol

    gen = torch.Generator().manual_seed(int(fold_tol * 1e9) + 3)
    S = torch.randn(4096, 64, generator=gen) * 10.0 ** torch.randint(-3, 4, (4096, 1), generator=gen).float()
    amax = S.abs().amax(-1, keepdim=True)
    moved = S + fold_tol * amax * (torch.rand(S.shape, generator=gen) * 2 - 1)
    grown = torch.where(S.abs() == amax, S * (1 + fold_tol), S)  # the largest value moved by the whole tolerance
    _, s0 = quant.row_scales(S, dtype)
    for other in (moved, grown):
        err = ((quant.row_scales(other, dtype)[1] - s0).abs() / s0).double()
        assert float(err.max()) <= scale_tol(fold_tol)
    assert float(err.max()) >= 0.9 * fold_tol  # the grown rows reach the bound: it is not slack
