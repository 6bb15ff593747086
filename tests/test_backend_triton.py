"""The "triton" backend under the manager, on CPU under the Triton interpreter: a reference and a triton
StateManager driven in lockstep through random schedules (every verb, both routes, rollback, materialize), with
and without ``pdl``; what ``check()`` refuses; backend option errors.

TRITON_INTERPRET=1 must be set before Triton's kernels are decorated; the module sets it, or skips when a
compiled-mode import already happened (tests/gpu/ covers the GPU).
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

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ssmstate import (  # noqa: E402
    BackendUnavailableError, Mamba2Geometry, PageLayout, SpecConfig, StateManager,
)
from ssmstate.errors import ConfigError  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402
from tests.test_triton_common import make_case, rel, verify_args  # noqa: E402

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                phases=[Phase.explicit, Phase.reuse, Phase.generate])


# -- manager level --------------------------------------------------------------------------


def _lockstep(geom, spec, ops, seed, backend_options=None):
    layout = PageLayout.replay(geom, spec)
    mt = StateManager(layout, 6, backend="triton", max_batch=4, backend_options=backend_options)
    mr = StateManager(layout, 6, backend="reference", max_batch=4)
    H, P, N, G = geom.heads_per_rank, geom.head_dim, geom.state_size, geom.groups_per_rank
    Dc, k = geom.conv_dim_per_rank, geom.conv_kernel
    gen = torch.Generator().manual_seed(seed)
    params = [dict(A=-(torch.rand(H, generator=gen) + 0.3), D=torch.randn(H, generator=gen),
                   dt_bias=torch.randn(H, generator=gen) * 0.3, w=torch.randn(Dc, k, generator=gen) * 0.5,
                   b=torch.randn(Dc, generator=gen) * 0.1) for _ in range(geom.num_layers)]
    ids = []
    for i in range(3):
        rid = f"r{i}"
        ids.append(rid)
        for m in (mt, mr):
            m.admit(rid)
        for layer in range(geom.num_layers):
            S = torch.randn(H, P, N, generator=gen) * 0.5
            conv = torch.randn(Dc, k - 1, generator=gen)
            mt.write_state(rid, layer, S, conv)
            mr.write_state(rid, layer, S, conv)
    T = spec.num_tokens
    for op, sub_n, pad, q_seed in ops:
        sub = ids[:sub_n]
        if op == "materialize":
            mt.materialize(sub)
            mr.materialize(sub)
        else:
            g2 = torch.Generator().manual_seed(q_seed)
            qs = torch.randint(1, T + 1, (sub_n,), generator=g2).tolist()
            acc = [int(torch.randint(0, q + 1, (1,), generator=g2)) for q in qs]
            acc[0] = qs[0] if q_seed % 2 else 0
            plans = [m.begin_step(sub, qs, pad_to=sub_n + pad) for m in (mt, mr)]
            L = plans[0].total_tokens
            for layer, prm in enumerate(params):
                xBC = torch.randn(L, Dc, generator=gen)
                dt = torch.randn(L, H, generator=gen) * 0.5 - 0.5
                z = torch.randn(L, H, P, generator=gen)
                outs = []
                for m, plan in zip((mt, mr), plans):
                    xbc = m.conv(layer, plan, xBC, prm["w"], prm["b"])
                    x = xbc[:, : H * P].reshape(L, H, P)
                    B = xbc[:, H * P: H * P + G * N].reshape(L, G, N)
                    C = xbc[:, H * P + G * N:].reshape(L, G, N)
                    outs.append((xbc, m.verify(layer, plan, x, dt, B, C, prm["A"], D=prm["D"],
                                                dt_bias=prm["dt_bias"], z=z)))
                assert rel(outs[0][0], outs[1][0]) < 1e-5, "conv output"
                assert rel(outs[0][1], outs[1][1]) < 5e-5, "verify output"
            if op == "rollback":
                mt.rollback(plans[0])
                mr.rollback(plans[1])
            else:
                mt.commit(plans[0], torch.tensor(acc, dtype=torch.int32) if op == "commit_tensor" else acc)
                mr.commit(plans[1], acc)
        assert torch.equal(mt.cache.cursors, mr.cache.cursors)
        for layer in range(geom.num_layers):
            for name in ("checkpoint", "x_ring", "B_ring", "dt_ring", "conv"):
                a, b = mt.cache.layers[layer][name], mr.cache.layers[layer][name]
                assert rel(a, b) < 5e-5, f"{name} differs"
            for rid in ids:
                assert rel(mt.read_state(rid, layer), mr.read_state(rid, layer)) < 5e-5
    mt.raise_device_errors()


@settings(max_examples=8, **SETTINGS)
@given(st.integers(0, 2**16), st.sampled_from([(1, 4), (3, 8), (7, 8)]), st.sampled_from([1, 2]),
       st.lists(st.tuples(st.sampled_from(["commit", "commit", "commit_tensor", "rollback", "materialize"]),
                          st.integers(1, 3), st.integers(0, 1), st.integers(0, 2**16)), min_size=3, max_size=6))
def test_manager_lockstep(seed, KW, layers, ops):
    K, W = KW
    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=layers,
                          state_dtype=torch.float32, act_dtype=torch.float32)
    _lockstep(geom, SpecConfig(K, window=W), ops, seed)




def _geom(**kw):
    base = dict(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1)
    base.update(kw)
    return Mamba2Geometry(**base)


def test_check_rejects_what_it_cannot_serve():
    from ssmstate.backends.triton import TritonBackend

    be = TritonBackend()
    be.check(PageLayout.replay(_geom(), SpecConfig(3)), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="replay layout only"):
        be.check(PageLayout.native(_geom(), SpecConfig(3)), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="head_dim"):
        be.check(PageLayout.replay(_geom(head_dim=512), SpecConfig(3)), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="T = 1 \\+ K"):
        be.check(PageLayout.replay(_geom(), SpecConfig(16, window=20)), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="ring length"):
        be.check(PageLayout.replay(_geom(), SpecConfig(3, window=130)), torch.device("cpu"))
    with pytest.raises(BackendUnavailableError):
        StateManager(PageLayout.native(_geom(), SpecConfig(1)), 4, backend="triton")


def test_check_cpu_needs_the_interpreter(monkeypatch):
    from ssmstate.backends.triton import TritonBackend

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1"):
        TritonBackend().check(PageLayout.replay(_geom(), SpecConfig(3)), torch.device("cpu"))


def test_cuda_graph_helper_refuses_cpu_managers():
    from ssmstate.cuda_graph import DecodeStepGraph

    m = StateManager(PageLayout.replay(_geom(), SpecConfig(3)), 4, backend="triton", max_batch=2)
    with pytest.raises(BackendUnavailableError, match="CUDA device"):
        DecodeStepGraph(m, 2, 4, lambda plan: None, torch.zeros(2, dtype=torch.int32))


# -- programmatic dependent launch (pdl) ------------------------------------------------------------


def test_pdl_manager_lockstep():
    """``backend_options={"pdl": True}`` through a schedule on the manager: the interpreter runs the plain launch
    (PDL is GPU-only; tests/gpu/ checks the compiled launch bit for bit), so this checks the option's plumbing into
    every conv and verify against the reference."""
    ops = [("commit", 3, 1, 1), ("commit_tensor", 2, 0, 2), ("rollback", 3, 1, 3), ("materialize", 2, 0, 4),
           ("commit", 3, 0, 5)]
    geom = _geom(num_layers=2, state_dtype=torch.float32, act_dtype=torch.float32)
    _lockstep(geom, SpecConfig(2, window=4), ops, seed=7, backend_options={"pdl": True})


def test_pdl_refusals():
    """A non-bool ``pdl`` is a ConfigError before anything is written (verify and conv); backend options a backend
    does not take are ConfigErrors too."""
    from ssmstate.backends import get_backend
    from ssmstate.backends.triton import TritonBackend
    case = make_case(torch.Generator().manual_seed(4), "cpu", pages=4, H=2, G=1, P=16, N=16, W=8, T=2, rows=2,
                     n_pad=0)
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="pdl must be a bool"):
            ot.replay_verify(*verify_args(case), out, pdl=bad)
    assert all(torch.equal(before[k], case["state"][k]) for k in before)
    assert bool((out == 7.0).all())
    win = torch.randn(3, 8, 5)
    win0 = win.clone()
    o = torch.full((2, 8), 7.0)
    with pytest.raises(ConfigError, match="pdl must be a bool"):
        ot.conv_update(win, torch.zeros(3, dtype=torch.int32), torch.randn(2, 8), torch.randn(8, 4), None,
                        torch.tensor([1], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32), o, pdl=1)
    assert torch.equal(win, win0) and bool((o == 7.0).all())
    with pytest.raises(ConfigError, match="pdl must be a bool"):
        TritonBackend(pdl="on")
    with pytest.raises(ConfigError, match="takes no options"):
        get_backend("reference", {"pdl": True})
    layout = PageLayout.replay(_geom(), SpecConfig(1, window=4))
    with pytest.raises(ConfigError, match="bad options"):
        StateManager(layout, 4, backend="triton", backend_options={"pdl": True, "stream": 2})
    assert StateManager(layout, 4, backend="triton", backend_options={"pdl": True}).backend.pdl


def _record_pdl(monkeypatch, names: tuple[str, ...]) -> list[tuple[str, bool]]:
    """Wrap these ``ssmstate.ops.triton`` launchers so each call appends ``(name, its pdl argument)`` to the list
    returned, then runs."""
    import ssmstate.ops.triton as ops

    seen: list[tuple[str, bool]] = []
    for name in names:
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name,
                            lambda *a, _real=real, _n=name, **k: seen.append((_n, k["pdl"])) or _real(*a, **k))
    return seen


@pytest.mark.parametrize("option,state_dtype,rows,want", [
    (False, torch.float32, 2, True),  # a small step: the table's pair_pdl.max_rows
    (False, torch.float32, 6, False),  # past it
    (False, torch.int8, 2, False),  # an 8-bit checkpoint: the plain pair
    (True, torch.float32, 6, True),  # the backend option: always
])
def test_conv_verify_pair_pdl_rule(monkeypatch, option, state_dtype, rows, want):
    """``conv_verify``'s conv + verify pair launches both kernels as programmatic dependents exactly where the launch
    table's ``pair_pdl.max_rows`` (or the backend's ``pdl``) says; ``conv`` and ``verify`` alone keep the option."""
    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1,
                          state_dtype=state_dtype)
    m = StateManager(PageLayout.replay(geom, SpecConfig(1, window=4)), 8, backend="triton", max_batch=8,
                     backend_options={"pdl": option})
    seen = _record_pdl(monkeypatch, ("conv_update", "replay_verify"))
    ids = [f"r{i}" for i in range(rows)]
    for r in ids:
        m.admit(r)
    plan = m.begin_step(ids, [2] * rows)
    H, P, Dc = geom.heads_per_rank, geom.head_dim, geom.conv_dim_per_rank
    L, act = plan.total_tokens, geom.act_dtype
    xbc = torch.randn(L, Dc).to(act)
    m.conv_verify(0, plan, xbc, torch.randn(L, H), -torch.ones(H), torch.randn(Dc, 4), None)
    assert seen == [("conv_update", want), ("replay_verify", want)]
    m.rollback(plan)
    plan = m.begin_step(ids, [2] * rows)
    seen.clear()
    m.conv(0, plan, xbc, torch.randn(Dc, 4), None)
    assert seen == [("conv_update", option)]
    m.rollback(plan)


@pytest.mark.parametrize("rows", [1, 6])
def test_conv_verify_fused_layer_always_pdl(monkeypatch, rows):
    """Where ``conv_verify`` takes the fused kernel it launches it as a programmatic dependent at every step size
    (past ``pair_pdl.max_rows`` too): the fused kernel reads the step's inputs only after its wait."""
    import ssmstate.ops.triton as ops

    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1)
    m = StateManager(PageLayout.replay(geom, SpecConfig(1, window=4)), 8, backend="triton", max_batch=8)
    seen = _record_pdl(monkeypatch, ("conv_update", "replay_verify", "replay_conv_verify"))
    ids = [f"r{i}" for i in range(rows)]
    for r in ids:
        m.admit(r)
    plan = m.begin_step(ids, [2] * rows)
    L, H, Dc = plan.total_tokens, geom.heads_per_rank, geom.conv_dim_per_rank
    with ops.override(fused={"MAX_ROWS": 8}):
        m.conv_verify(0, plan, torch.randn(L, Dc).to(geom.act_dtype), torch.randn(L, H), -torch.ones(H),
                      torch.randn(Dc, 4), None)
    assert seen == [("replay_conv_verify", True)]


def test_check_names_what_a_gpu_before_hopper_cannot_run():
    """The kernels' 16-bit tensor-core products need compute capability 8.0, e4m3 checkpoints the fp8 conversions of
    8.9; before 9.0 everything else runs, on the portable kernels (tests/test_launch_config.py)."""
    from ssmstate.backends.triton import arch_problems

    fp32 = PageLayout.replay(_geom(), SpecConfig(3))
    fp8 = PageLayout.replay(_geom(state_dtype="fp8"), SpecConfig(3))
    int8 = PageLayout.replay(_geom(state_dtype="int8"), SpecConfig(3))
    assert arch_problems(fp32, (7, 5)) == arch_problems(fp8, (7, 5)) != []
    assert "8.0" in arch_problems(fp32, (7, 5))[0]
    for cap in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0)):
        assert arch_problems(fp32, cap) == arch_problems(int8, cap) == []
    for cap in ((8, 0), (8, 6)):
        (why,) = arch_problems(fp8, cap)
        assert "float8_e4m3fn" in why and "8.9" in why and f"{cap[0]}.{cap[1]}" in why
    assert arch_problems(fp8, (8, 9)) == arch_problems(fp8, (9, 0)) == []
