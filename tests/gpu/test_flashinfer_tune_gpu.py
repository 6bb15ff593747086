"""FlashInfer backend at its best, on the GPU: tune() lands where served calls look, and vLLM's conv, compiled.

* After ``tune()``, a served dense verify (the vLLM plugin's argument forms: D and dt_bias present) finds its
  tactic in FlashInfer's autotuner cache (the tuner's own lookup, watched), and every (form, batch) got a choice.
* The backend's conv (vLLM's Triton ``causal_conv1d_update`` on the replay window, ragged steps in vLLM's varlen
  form, bf16 weights) against the reference conv through rollbacks, as tests/test_flashinfer_conv.py does
  interpreted on CPU.

Needs CUDA, flashinfer-python and vLLM's kernel sources (``SSMSTATE_VLLM_KERNELS``, tests/gpu/copy_vllm_kernels.py);
loaded behind tests/gpu/vllm_kernel_shim.py before anything imports vLLM.

    source tools/fi_env.sh && SSMSTATE_VLLM_KERNELS=.device/vllm_kernels \\
        python -m pytest -q -s tests/gpu/test_flashinfer_tune_gpu.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch

KERNELS = os.environ.get("SSMSTATE_VLLM_KERNELS")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None or not KERNELS,
    reason="needs CUDA, flashinfer-python and SSMSTATE_VLLM_KERNELS",
)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

if KERNELS and torch.cuda.is_available() and "vllm" not in sys.modules:
    import vllm_kernel_shim

    vllm_kernel_shim.load(KERNELS)

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402


def layout(H: int = 128) -> PageLayout:
    g = Mamba2Geometry(num_heads=H, head_dim=64, state_size=128, n_groups=8, conv_kernel=4, num_layers=1,
                       state_dtype=torch.float32, act_dtype=torch.bfloat16)
    return PageLayout.replay(g, SpecConfig(3, window=16))


def test_served_dense_call_hits_the_tuned_entry():
    from flashinfer.autotuner import AutoTuner

    lay = layout()
    sizes = [1, 8, 64]
    m = StateManager(lay, 80, device="cuda", backend="flashinfer", max_batch=64)
    t0 = time.time()
    report = m.backend.tune(lay, "cuda", sizes, reps=5)
    print(f"\ntune({sizes}) took {time.time() - t0:.1f} s")
    for r in report:
        print(f"  {r['form']:>6} batch {r['batch']:>3}: " +
              " ".join(f"{a} {us:7.2f} us" for a, us in r["us"].items()) + f" -> {r['chosen']}"
              + (f" (auto runs: {r['auto_runs']})" if "auto_runs" in r else "")
              + (f"\n    tuner miss: {r['tuner_miss']}; warnings: {r.get('tuner_warnings')}"
                 if "tuner_miss" in r else ""))
    assert {(r["form"], r["batch"]) for r in report} == {(f, b) for f in ("dense", "varlen") for b in sizes}
    assert all("heuristic" not in r["auto_runs"] for r in report if r["form"] == "dense")  # tuned tactics found
    tuner = AutoTuner.get()
    hits: list[bool] = []
    search = tuner.search_cache

    def watched(*a, **k):
        res = search(*a, **k)
        hits.append(bool(res[0]))
        return res

    tuner.search_cache = watched
    try:
        g = lay.geometry
        H, P, N, G, Dc = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank
        D = torch.ones(H, device="cuda", dtype=g.act_dtype)
        dtb = torch.zeros(H, device="cuda", dtype=g.act_dtype)
        A = -torch.ones(H, device="cuda")
        for b in sizes:
            ids = [f"r{b}-{i}" for i in range(b)]
            for r in ids:
                m.admit(r)
            m.backend.chosen[("dense", b)] = "auto"  # make the served call ask FlashInfer's tuner
            plan = m.begin_step(ids, 4)
            L = plan.total_tokens
            co = torch.randn(L, Dc, device="cuda", dtype=g.act_dtype)
            x, B, C = torch.split(co, [H * P, G * N, G * N], dim=-1)
            dt = torch.randn(L, H, device="cuda", dtype=g.act_dtype)
            m.verify(0, plan, x.reshape(L, H, P), dt, B.reshape(L, G, N), C.reshape(L, G, N), A, D=D, dt_bias=dtb)
            m.commit(plan, [1] * b)
            for r in ids:
                m.release(r)
        torch.cuda.synchronize()
    finally:
        tuner.search_cache = search
    print(f"served dense calls, tuner cache hits: {hits}")
    assert hits and all(hits)


@pytest.mark.parametrize("wdtype,tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-2)])
def test_vllm_conv_compiled_matches_reference(wdtype, tol):
    from tests.conv_lockstep import conv_lockstep

    conv_lockstep("cuda", ragged=True, wdtype=wdtype, tol=tol, steps=12)
