"""The Triton quantization helpers (ssmstate/ops/triton/quant.py) against the reference (ssmstate/ops/quant.py), in
the Triton interpreter: the same tiles in, the same bytes and scales out, bit for bit, for round-to-nearest and
stochastic rounding into int8, fp8_e4m3fn, bf16 and fp16, on random rows of every magnitude and on the edge rows
(all zero, all NaN, a NaN, an inf, fp32 subnormals, exact ties, values past the saturation bound).

The kernels' own use of them (verify, materialize) is tests/test_ops_quant_triton.py.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the Triton kernels are tested compiled in tests/gpu/", allow_module_level=True)
if "ssmstate.ops.triton.common" in sys.modules and not sys.modules["ssmstate.ops.triton.common"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from ssmstate.ops import quant  # noqa: E402
from ssmstate.ops.triton import quant as tq  # noqa: E402

QMODES = {torch.int8: 1, torch.float8_e4m3fn: 2}


@triton.jit
def _encode_kernel(S_ptr, q_ptr, sc_ptr, seed_ptr, pages_ptr, layer, H, P: tl.constexpr, N: tl.constexpr,
                   QMODE: tl.constexpr, SR: tl.constexpr, ST: tl.constexpr):
    """One (row b, head h) tile of a (B, H, P, N) fp32 state: its stored values (and scales) as a checkpoint write
    stores them; QMODE 0 with ST the unquantized checkpoint's dtype."""
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    offs_p = tl.arange(0, P)
    oc = tl.arange(0, N)
    tile = (tl.program_id(0) * P + offs_p[:, None]) * N + oc[None, :]
    S = tl.load(S_ptr + tile)
    if SR:
        key_h = tq.sr_head_key(tq.sr_page_key(seed_ptr, layer, tl.load(pages_ptr + b).to(tl.int64)), h)
    else:
        key_h = 0
    if QMODE > 0:
        enc, scale = tq.encode_scales(tq.chunk_amax(S, tl.zeros((P,), dtype=tl.float32)), QMODE)
        tl.store(q_ptr + tile, tq.encode_tile(S, enc, key_h, offs_p, oc, QMODE, SR))
        tl.store(sc_ptr + tl.program_id(0) * P + offs_p, scale)
    else:
        tl.store(q_ptr + tile, tq.round_store_value(S, tq.sr_bits(key_h, offs_p, oc), ST, SR))


@triton.jit
def _decode_kernel(raw_ptr, out_ptr, QMODE: tl.constexpr):
    o = tl.arange(0, 256)
    tl.store(out_ptr + o, tq.codes(tl.load(raw_ptr + o), QMODE))


def edge_state(seed: int, B: int = 2, H: int = 2, P: int = 16, N: int = 32) -> torch.Tensor:
    """(B, H, P, N) fp32 rows of random magnitudes 1e-40 .. 1e30 and the edge rows."""
    g = torch.Generator().manual_seed(seed)
    S = torch.randn(B, H, P, N, generator=g)
    S *= 10.0 ** torch.randint(-40, 31, (B, H, P, 1), generator=g).float()
    rows = S.view(-1, N)
    rows[0] = 0.0
    rows[1] = float("nan")
    rows[2, 3] = float("nan")
    rows[3, 5] = float("inf")
    rows[4, 7] = -float("inf")
    rows[5] = torch.randn(N, generator=g) * 1e-40  # fp32 subnormals
    rows[6] = torch.arange(N).float() - N // 2  # exact integers, ties after the scale
    rows[6, 0] = 127.0
    rows[7] = (torch.arange(N).float() - N // 2) / 2 + 0.25
    rows[7, 0] = 448.0
    rows[8] = torch.randn(N, generator=g) * 2.0 ** -20  # near fp16's and fp8's subnormal range
    rows[9] = torch.randn(N, generator=g) * 7e4  # past fp16's largest finite
    return S


def run_encode(S: torch.Tensor, dtype: torch.dtype, seed: torch.Tensor | None, layer: int,
               pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, H, P, N = S.shape
    qmode = QMODES.get(dtype, 0)
    store = {torch.float8_e4m3fn: torch.uint8}.get(dtype, dtype)
    q = torch.zeros(S.shape, dtype=store)
    sc = torch.zeros(B, H, P)
    st = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(dtype, tl.float32)
    _encode_kernel[(B * H,)](S, q, sc, seed if seed is not None else pages, pages, layer, H, P=P, N=N, QMODE=qmode,
                             SR=seed is not None, ST=st)
    return (q.view(dtype) if dtype == torch.float8_e4m3fn else q), (sc if qmode else None)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits; an fp32 NaN's payload and sign are not part of the definition (an 8- or 16-bit
    NaN is: always 0x7F in e4m3, 0x7FFF in bf16 and fp16)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    same = a.view(width) == b.view(width)
    if a.element_size() < 4:
        return same
    return same | (a.float().isnan() & b.float().isnan())


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sr", [False, True])
def test_encode_matches_reference_bit_for_bit(dtype, sr):
    S = edge_state(seed=hash((str(dtype), sr)) % 1000)
    pages = torch.tensor([5, 2], dtype=torch.int64)
    seed = torch.tensor([0x0123456789ABCDEF if sr else 0], dtype=torch.int64) if sr else None
    got, got_scale = run_encode(S, dtype, seed, 3, pages)
    want, want_scale = quant.quantize(S, dtype, seed=seed, layer=3, pages=pages)
    ok = same_bytes(got, want)
    assert bool(ok.all()), f"{int((~ok).sum())} elements differ, first at {(~ok).nonzero()[0].tolist()}"
    if want_scale is not None:
        assert torch.equal(got_scale.view(torch.int32), want_scale.view(torch.int32))


def test_sr_bits_depend_on_every_counter_word():
    """Another seed, layer or page gives other bits (a stuck counter word would repeat the rounding)."""
    S = torch.randn(2, 2, 16, 32, generator=torch.Generator().manual_seed(0)) * 100
    pages = torch.tensor([5, 2], dtype=torch.int64)
    seed = torch.tensor([7], dtype=torch.int64)
    base, _ = run_encode(S, torch.int8, seed, 3, pages)
    for other in ((torch.tensor([8], dtype=torch.int64), 3, pages), (seed, 4, pages),
                  (seed, 3, torch.tensor([6, 2], dtype=torch.int64))):
        got, _ = run_encode(S, torch.int8, *other)
        assert not torch.equal(got, base)
        want, _ = quant.quantize(S, torch.int8, seed=other[0], layer=other[1], pages=other[2])
        assert torch.equal(got, want)


def test_fp8_decode_every_byte():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.zeros(256)
    _decode_kernel[(1,)](raw, out, QMODE=2)
    want = raw.view(torch.float8_e4m3fn).float()
    assert bool(same_bytes(out, want).all())
    assert int(out.isnan().sum()) == 2  # 0x7F and 0xFF
    raw8 = torch.arange(-128, 128, dtype=torch.int32).to(torch.int8)
    _decode_kernel[(1,)](raw8, out, QMODE=1)
    assert torch.equal(out, raw8.float())
