"""The "triton" backend on 8-bit and stochastically rounded checkpoints under the manager, on CPU under the Triton
interpreter: a triton and a reference manager run one schedule in lockstep (write_state, verify steps with flush
and non-flush rows, commits, a rollback, materialize, preempt and resume, read_state) and must agree: outputs to
fp32 rounding, cursors and seeds exactly, rings and conv windows to fp32 rounding, checkpoint bytes to one code
step (the kernels' fp32 fold differs from the reference's in its last bits; tests/test_ops_quant_triton.py has
the exact cases) and scales to 1e-6.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the Triton backend is tested compiled in tests/gpu/", allow_module_level=True)
if "ssmstate.ops.triton.common" in sys.modules and not sys.modules["ssmstate.ops.triton.common"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.layout import SCALE_NAME  # noqa: E402
from tests.quant_common import code_steps  # noqa: E402
from tests.test_triton_common import rel  # noqa: E402


def _compare(mt: StateManager, mr: StateManager, ids: list[str]) -> None:
    assert torch.equal(mt.cache.cursors, mr.cache.cursors)
    if mr.cache.checkpoint_seed is not None:
        assert torch.equal(mt.cache.checkpoint_seed, mr.cache.checkpoint_seed)
    for layer in range(mt.num_layers):
        a, b = mt.cache.layers[layer], mr.cache.layers[layer]
        for name in ("x_ring", "B_ring", "dt_ring", "conv"):  # the conv's fp32 sums differ in their last bits
            assert rel(a[name], b[name]) < 5e-5, f"{name} differs"
        assert int(code_steps(a["checkpoint"], b["checkpoint"]).max()) <= 1, "a checkpoint value moved > 1 step"
        if SCALE_NAME in b:
            assert float(((a[SCALE_NAME] - b[SCALE_NAME]).abs() / b[SCALE_NAME].abs()).max()) <= 1e-6
        for rid in ids:
            assert rel(mt.read_state(rid, layer), mr.read_state(rid, layer)) < 1e-3


@pytest.mark.parametrize("dtype,sr", [("int8", False), ("fp8", False), ("int8", True), ("fp8", True),
                                      ("bf16", True)])
def test_quantized_manager_lockstep(dtype, sr):
    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1,
                          state_dtype=dtype, act_dtype=torch.float32)
    spec = SpecConfig(3, window=6)
    layout = PageLayout.replay(geom, spec)
    mt = StateManager(layout, 6, backend="triton", max_batch=3, stochastic_rounding=sr, seed=5)
    mr = StateManager(layout, 6, backend="reference", max_batch=3, stochastic_rounding=sr, seed=5)
    H, P, N, G = 2, 16, 16, 1
    Dc, k = geom.conv_dim_per_rank, geom.conv_kernel
    gen = torch.Generator().manual_seed(3)
    A = -(torch.rand(H, generator=gen) + 0.3)
    w, bias = torch.randn(Dc, k, generator=gen) * 0.5, torch.randn(Dc, generator=gen) * 0.1
    ids = ["a", "b", "c"]
    for rid in ids:
        for m in (mt, mr):
            m.admit(rid)
        S = torch.randn(H, P, N, generator=gen) * 0.5
        conv = torch.randn(Dc, k - 1, generator=gen)
        for m in (mt, mr):
            m.write_state(rid, 0, S, conv)
            m.bind_layer(0, A)
    _compare(mt, mr, ids)
    schedule = [([4, 4, 3], [4, 2, 3]), ([4, 3, 4], [1, 3, 0]), ([2, 4, 4], None), ([4, 4, 4], [4, 4, 4]),
                ("materialize", ["a", "c"]), ([3, 4, 4], [2, 4, 1]), ("preempt", "b"), ([4, 4, 4], [3, 4, 4])]
    for qs, acc in schedule:
        if qs == "materialize":
            mt.materialize(acc)
            mr.materialize(acc)
            _compare(mt, mr, ids)
            continue
        if qs == "preempt":
            saved = mt.preempt(acc), mr.preempt(acc)
            mt.resume(acc, saved[0])
            mr.resume(acc, saved[1])
            _compare(mt, mr, ids)
            continue
        plans = [m.begin_step(ids, qs) for m in (mt, mr)]
        L = plans[0].total_tokens
        xBC = torch.randn(L, Dc, generator=gen)
        dt = torch.randn(L, H, generator=gen) * 0.5 - 0.5
        z = torch.randn(L, H, P, generator=gen)
        outs = []
        for m, plan in zip((mt, mr), plans):
            xbc = m.conv(0, plan, xBC, w, bias)
            x = xbc[:, : H * P].reshape(L, H, P)
            B = xbc[:, H * P: H * P + G * N].reshape(L, G, N)
            C = xbc[:, H * P + G * N:].reshape(L, G, N)
            outs.append(m.verify(0, plan, x, dt, B, C, A, D=None, dt_bias=None, z=z))
        assert rel(outs[0], outs[1]) < 1e-4, "verify output"
        if acc is None:
            mt.rollback(plans[0])
            mr.rollback(plans[1])
        else:
            mt.commit(plans[0], acc)
            mr.commit(plans[1], acc)
        _compare(mt, mr, ids)
    mt.raise_device_errors()
