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
from ssmstate.backends.flashinfer_conv import VLLM_CONV, import_vllm_conv  # noqa: E402
from ssmstate.cache import StateCache  # noqa: E402
from ssmstate.layout import conv_spec  # noqa: E402
from tests.conv_lockstep import conv_lockstep  # noqa: E402
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
        _skip_unless_interpretable(import_vllm_conv())
        yield
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _skip_unless_interpretable(conv) -> None:
    """Skip where this Triton's interpreter cannot run vLLM's kernel at all: from Triton 3.9 on it refuses a load
    whose mask is not bool, and vLLM's ``_causal_conv1d_update_kernel`` builds one (the compiled kernel is checked
    by tests/gpu/test_flashinfer_tune_gpu.py). A tiny call of vLLM's own function decides; nothing of ours runs."""
    from triton.runtime.errors import InterpreterError

    x, state = torch.zeros(1, 8), torch.zeros(2, 8, 3)
    try:
        conv(x, state, torch.zeros(8, 4), None, "silu", conv_state_indices=torch.tensor([1], dtype=torch.int32))
    except InterpreterError as exc:
        if "mask has unsupported dtype" not in str(exc):
            raise
        pytest.skip(f"this Triton's interpreter cannot run vLLM's causal_conv1d_update ({exc})")


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


def test_line_view_covers_every_row_start():
    """vLLM skips a line at or past the view's line count; every (page, first column) a row can start at must be
    below it, the last page included (a varlen row of q < T starts T - q columns into its window)."""
    from ssmstate.backends.flashinfer_conv import line_view

    layout = nemotron_small()
    T, KW = layout.spec.num_tokens, layout.geometry.conv_kernel - 1
    cache = StateCache(layout, 6, "cpu")
    spec = conv_spec(64, KW + T, torch.float32)
    engine = spec.view(torch.zeros(6, spec.nbytes + 96, dtype=torch.int8)[:, 32: 32 + spec.nbytes])  # engine pages
    for win in (cache.layers[0]["conv"], engine, torch.zeros(6, 2 * 64 + 5, KW + T)[:, 3:3 + 64]):  # + row-major
        view = line_view(win)
        assert view.data_ptr() == win.data_ptr() and view.stride(0) == 1
        last = (win.shape[0] - 1) * win.stride(0) + (win.shape[2] - KW - 1) * win.stride(2)  # base = T - 1 (q = 1)
        assert last < view.shape[0]
