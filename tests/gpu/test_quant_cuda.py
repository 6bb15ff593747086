"""The reference quantization (ssmstate.ops.quant) gives the same bytes on the GPU as on the CPU.

Kernels are checked against the reference run on the GPU, so the reference itself must not depend on the
device: the encode (IEEE division, round-half-even, fp8 conversion), the hash and every stochastic rounding.
Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
from ssmstate.ops import quant

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = (torch.int8, torch.float8_e4m3fn, torch.bfloat16, torch.float16)


def _states() -> torch.Tensor:
    """(8, 16, 64, 128) fp32 rows over a wide dynamic range, with zero, NaN, inf and subnormal rows."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 64, 128, generator=g)
    x = x * torch.logspace(-38, 30, 64).view(1, 1, 64, 1)
    x[0, 0, 0] = 0.0
    x[0, 0, 1, 3] = float("nan")
    x[0, 0, 2, 5] = float("inf")
    x[0, 0, 3] = 1e-42
    x[0, 0, 4, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.0, 126.5, -126.5])
    return x


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16) if t.element_size() == 2 else t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sr", [False, True])
def test_quantize_same_bytes_on_cuda(dtype: torch.dtype, sr: bool) -> None:
    x = _states()
    pages = torch.arange(3, 11)
    kw = lambda dev: dict(seed=torch.tensor([123456789012345], device=dev), layer=5, pages=pages.to(dev)) \
        if sr else {}  # noqa: E731
    q_cpu, s_cpu = quant.quantize(x, dtype, **kw("cpu"))
    q_gpu, s_gpu = quant.quantize(x.cuda(), dtype, **kw("cuda"))
    assert torch.equal(_bytes(q_gpu), _bytes(q_cpu))
    if s_cpu is not None:
        assert torch.equal(s_gpu.cpu().view(torch.int32), s_cpu.view(torch.int32))


def test_hash_same_bits_on_cuda() -> None:
    seed = torch.tensor([-(2 ** 40) + 17])
    pages = torch.tensor([1, 2, 2 ** 31 - 1, 7])
    a = quant.sr_bits(seed, 3, pages, (4, 8, 16, 32))
    b = quant.sr_bits(seed.cuda(), 3, pages.cuda(), (4, 8, 16, 32))
    assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_manager_on_cuda_writes_what_quant_encodes(dtype: str) -> None:
    """write_state on a CUDA manager stores quant.encode of the given state, bit for bit, with SR too."""
    g = Mamba2Geometry(128, 64, 128, 8, 4, 2, state_dtype=dtype)
    m = StateManager(PageLayout.replay(g, SpecConfig(3, window=16)), 4, device="cuda", stochastic_rounding=True,
                     seed=9)
    page = m.admit("a")
    S = torch.randn(128, 64, 128, generator=torch.Generator().manual_seed(1)).cuda()
    seed = m.cache.checkpoint_seed.clone()
    m.write_state("a", 1, S)
    want, scale = quant.quantize(S.unsqueeze(0), g.state_dtype, seed=seed, layer=1,
                                 pages=torch.tensor([page], device="cuda"))
    t = m.cache.layers[1]
    assert torch.equal(_bytes(t["checkpoint"][page]), _bytes(want[0]))
    assert torch.equal(t["checkpoint_scale"][page], scale[0])
    assert torch.equal(m.read_state("a", 1), quant.decode(want[0], scale[0]))
