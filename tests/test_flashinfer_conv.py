"""The FlashInfer backend's conv on CPU: vLLM's real Triton ``causal_conv1d_update`` (interpreted) on the replay
window, against the reference conv on the same windows, through schedules with rollbacks (0 accepted included).

The reference backend's conv and the FlashInfer backend's run in lockstep on two identical caches, committed by the
reference commit rule with random accepted counts: conv outputs are compared to rounding (vLLM's kernel multiplies
in the weight's dtype), windows and cursors bit for bit, after every step.

TRITON_INTERPRET=1 must be set before vLLM's kernel is decorated; the module sets it, or skips. An installed vLLM
switches Triton off on a machine without a GPU driver, so its kernel files are loaded as the GPU machine loads
them (tests/gpu/vllm_kernel_shim.py, from a copy of the installed vLLM's sources), with the real vLLM's modules
set aside for the duration and put back after.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the conv is exercised compiled by the GPU benchmarks", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ssmstate import BackendUnavailableError, Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.backends import flashinfer as fb  # noqa: E402
from ssmstate.backends import flashinfer_tune as ft  # noqa: E402
from ssmstate.backends.reference import ReferenceBackend  # noqa: E402
from ssmstate.cache import StateCache  # noqa: E402
from ssmstate.ops import reference as ref  # noqa: E402
from ssmstate.backends.flashinfer_conv import VLLM_CONV, import_vllm_conv  # noqa: E402
from tests.gpu import copy_vllm_kernels, vllm_kernel_shim  # noqa: E402
from tests.test_flashinfer_adapter import FakeMamba, _fake_flashinfer, nemotron_layout  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def vllm_kernels(tmp_path_factory):
    """vLLM's kernel modules from the installed vLLM's source files, behind the shim, for this module only."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    src = os.path.join(os.path.dirname(spec.origin), "model_executor", "layers", "mamba", "ops")
    dest = tmp_path_factory.mktemp("vllm_kernels")
    for name in copy_vllm_kernels.FILES:
        shutil.copy2(os.path.join(src, name), dest / name)
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for k in saved:
        del sys.modules[k]
    try:
        vllm_kernel_shim.load(dest)
        import_vllm_conv()
        yield
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / (b.float().norm() + 1e-12))


def conv_lockstep(device: str, ragged: bool, wdtype: torch.dtype, tol: float, steps: int = 8, seed: int = 0) -> None:
    """The reference backend and the FlashInfer backend's conv on two identical caches, committed alike (reference
    commit rule, random accepted counts with 0 and q frequent), compared after every step; the first steps
    reject every token, so rows roll back over a full window (``conv_shift = T``)."""
    g = Mamba2Geometry(num_heads=2, head_dim=32, state_size=64, n_groups=1, conv_kernel=4, num_layers=2,
                       act_dtype="bf16", state_dtype="fp32")
    layout = PageLayout.replay(g, SpecConfig(3, window=8))
    T, W, R = layout.spec.num_tokens, layout.spec.window, layout.spec.ring_len
    Dc, k, pages = g.conv_dim_per_rank, g.conv_kernel, 10
    caches = [StateCache(layout, pages, device) for _ in range(2)]
    gen = torch.Generator().manual_seed(seed)
    for lay in range(g.num_layers):  # distinct finite windows to roll back into
        w0 = torch.randn(pages, Dc, k - 1 + T, generator=gen).to(device)
        for c in caches:
            c.layers[lay]["conv"].copy_(w0)
    backends = [ReferenceBackend(), fb.FlashInferBackend(conv="vllm")]
    assert backends[1].conv_impl == "vllm-triton"
    weights = [(torch.randn(Dc, k, generator=gen).to(device, wdtype), torch.randn(Dc, generator=gen).to(device, wdtype))
               for _ in range(g.num_layers)]
    rng = random.Random(seed)
    for step in range(steps):
        rows = sorted(rng.sample(range(1, pages), rng.randint(1, 4)))
        qs = [rng.randint(1, T) for _ in rows] if ragged and step >= 2 else [T] * len(rows)
        pad = [0] * rng.randint(0, 1)  # a padding row (page 0) with T tokens where the step is uniform
        pids = torch.tensor(rows + pad, dtype=torch.int32, device=device)
        lens = qs + ([T] * len(pad) if not ragged or step < 2 else [0] * len(pad))
        plan = ft.plan_for(pids, lens)
        L = plan.total_tokens
        acc = [0] * len(rows) if step < 2 else [rng.choice([0, q, rng.randint(0, q)]) for q in qs]
        for lay in range(g.num_layers):
            xBC = torch.randn(L, Dc, generator=gen).to(device, torch.bfloat16)
            outs = []
            for be, c in zip(backends, caches):
                o = torch.full((L, Dc), 7.0, dtype=torch.bfloat16, device=device)
                outs.append(be.conv(c, lay, plan, xBC, *weights[lay], "silu", o))
            live = torch.cat([torch.arange(int(plan.cu_seqlens_host[r]), int(plan.cu_seqlens_host[r + 1]))
                              for r in range(len(rows))])
            assert rel(outs[1][live], outs[0][live]) < tol, (step, lay, qs)
            assert torch.equal(outs[1][L - (lens[-1] if pad else 0):], outs[0][L - (lens[-1] if pad else 0):])
        for c in caches:
            c.pending[pids[: len(rows)].long()] = torch.tensor(qs, dtype=torch.int32, device=device)
            err = torch.zeros(1, dtype=torch.int32, device=device)
            a = torch.tensor(acc + [0] * len(pad), dtype=torch.int32, device=device)
            ref.replay_commit(c.ring_start, c.num_committed, c.pending, c.conv_shift, pids, a, W, R, True, err)
            assert int(err) == 0
        assert torch.equal(caches[0].cursors, caches[1].cursors)
        for a_, b_ in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a_["conv"], b_["conv"]), (step, rows, qs, acc)


def test_conv_matches_reference_through_rollbacks():
    """Uniform steps, fp32 weights: what the Triton interpreter runs (its bf16 products are not IEEE bf16, and it
    cannot run vLLM's varlen form); bf16 weights and ragged steps run compiled in tests/gpu/."""
    conv_lockstep("cpu", ragged=False, wdtype=torch.float32, tol=1e-2)  # bf16 outputs: rounding


def test_padding_rows_and_other_pages_are_untouched(monkeypatch):
    _fake_flashinfer(monkeypatch, FakeMamba())
    m = StateManager(nemotron_small(), 10, device="cpu", backend="reference", max_batch=5)
    m.backend = fb.FlashInferBackend(conv="vllm")
    Dc = m.geometry.conv_dim_per_rank
    for r in ("a", "b"):
        m.admit(r)
    m.cache.layers[0]["conv"].normal_()
    before = m.cache.layers[0]["conv"].clone()
    plan = m.begin_step(["a"], 4, pad_to=3)
    xBC = torch.randn(plan.total_tokens, Dc).to(torch.bfloat16)
    m.conv(0, plan, xBC, torch.randn(Dc, 4), None)
    after = m.cache.layers[0]["conv"]
    changed = [p for p in range(after.shape[0]) if not torch.equal(before[p], after[p])]
    assert changed == [m.page_of("a")]


def nemotron_small() -> PageLayout:
    g = Mamba2Geometry(num_heads=2, head_dim=32, state_size=64, n_groups=1, conv_kernel=4, num_layers=1,
                       act_dtype="bf16", state_dtype="fp32")
    return PageLayout.replay(g, SpecConfig(3, window=8))


def test_missing_vllm_kernel(monkeypatch):
    _fake_flashinfer(monkeypatch, FakeMamba())
    monkeypatch.setitem(sys.modules, VLLM_CONV, None)
    with pytest.raises(BackendUnavailableError, match="conv='vllm'"):
        fb.FlashInferBackend(conv="vllm").check(nemotron_layout(), torch.device("cuda"))
    be = fb.FlashInferBackend()
    assert be.conv_impl == "reference"
    m = StateManager(nemotron_small(), 10, device="cpu", backend="reference", max_batch=5)
    m.backend = be
    Dc = m.geometry.conv_dim_per_rank
    m.admit("a")
    plan = m.begin_step(["a"], 4)
    with pytest.warns(RuntimeWarning, match="reference conv"):
        m.conv(0, plan, torch.randn(4, Dc).to(torch.bfloat16), torch.randn(Dc, 4), None)
