"""Triton backend against the PyTorch reference on CPU, under the Triton interpreter.

Kernel level: random pools and cursors (both routes, padding rows, acceptance 0
and q, non-power-of-two P and N, W up to 32, T up to 8, fp32/bf16 state,
fp32/bf16/fp16 inputs) — outputs, checkpoint, rings, conv window and cursors
compared. Manager level: a reference and a triton StateManager driven in
lockstep through random schedules. Also: no host sync inside verify/commit,
and check() errors.

TRITON_INTERPRET=1 must be set before Triton's kernels are decorated; the
module sets it, or skips when a compiled-mode import already happened (or a
GPU is present without the variable: tests/gpu/test_triton_gpu.py covers it).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the Triton backend is tested compiled in tests/gpu/", allow_module_level=True)
if "ssmstate.ops.triton.verify" in sys.modules and not sys.modules["ssmstate.ops.triton.verify"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ssmstate import (  # noqa: E402
    BackendUnavailableError, Mamba2Geometry, PageLayout, SpecConfig, StateManager,
)
from ssmstate.errors import ConfigError  # noqa: E402
from ssmstate.ops import reference as ref  # noqa: E402
from ssmstate.ops.triton import conv as tcv  # noqa: E402
from ssmstate.ops.triton import verify as trk  # noqa: E402
from tests.test_triton_common import (  # noqa: E402
    compare_verify, make_case, other_cursors, rel, run_verify, verify_args,
)

# No shrinking: the interpreter is slow and a failing example is reported as drawn.
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                phases=[Phase.explicit, Phase.reuse, Phase.generate])
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 4e-3}


@st.composite
def verify_cases(draw):
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    T = draw(st.integers(1, 8))
    W = draw(st.integers(T, 32))
    rows = draw(st.integers(1, 3))
    return dict(
        H=H, G=G, P=draw(st.sampled_from([16, 8, 24])), N=draw(st.sampled_from([16, 32, 24])), W=W, T=T,
        rows=rows + 1, n_pad=draw(st.integers(0, 1)) if rows > 1 else 1,
        route=draw(st.sampled_from(["mixed", "flush", "nonflush"])),
        state_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16])),
        act_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16])),
        extras=draw(st.booleans()),
        config=draw(st.sampled_from([None, {"BLOCK_P": 16, "FOLD_N": 16}, {"HPP": 1, "FOLD_N": 8},
                                     {"HPP": 1, "NC": 8}, {"HPP": 1, "NC": 16, "FUSE": True}])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40, **SETTINGS)
@given(verify_cases())
@example(dict(H=2, G=1, P=16, N=16, W=32, T=8, rows=3, n_pad=1, route="flush", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=True, config={"BLOCK_P": 16, "FOLD_N": 16}, seed=1))
@example(dict(H=2, G=2, P=24, N=24, W=32, T=8, rows=2, n_pad=0, route="nonflush", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=True, config=None, seed=2))
@example(dict(H=4, G=2, P=16, N=32, W=4, T=4, rows=3, n_pad=1, route="mixed", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=False, config=None, seed=3))
def test_verify_matches_reference(c):
    gen = torch.Generator().manual_seed(c["seed"])
    case = make_case(gen, "cpu", pages=c["rows"] + 2, H=c["H"], G=c["G"], P=c["P"], N=c["N"], W=c["W"], T=c["T"],
                     rows=c["rows"], n_pad=c["n_pad"], state_dtype=c["state_dtype"], act_dtype=c["act_dtype"],
                     extras=c["extras"], route=c["route"])
    got = run_verify(trk.replay_verify, case, config=c["config"])
    want = run_verify(ref.replay_verify, case)
    state_tol = TOL[torch.float32] if c["state_dtype"] == torch.float32 else TOL[c["state_dtype"]]
    compare_verify(case, got, want, out_tol=TOL[c["act_dtype"]], state_tol=state_tol)


#: launches: heads per program (HPP divides the 4 heads per group below), P and N tiles
GROUP_CONFIGS = [{"HPP": 1}, {"HPP": 2, "BLOCK_P": 16, "FOLD_N": 16}, {"HPP": 1, "BLOCK_P": 8, "FOLD_N": 8},
                 {"HPP": 2, "PREFETCH": 0, "FOLD_N": 32}, {"HPP": 4, "PREFETCH": 2}, {"HPP": 1, "NC": 16},
                 {"HPP": 2, "NC": 16, "PREFETCH": 2}, {"HPP": 1, "NC": 8, "FUSE": True},
                 {"HPP": 2, "NC": 16, "FUSE": True, "PREFETCH": 0}]


@pytest.mark.parametrize("cfg", GROUP_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("route,state_dtype,act_dtype,P,N", [
    ("flush", torch.float32, torch.float32, 24, 24), ("mixed", torch.bfloat16, torch.bfloat16, 16, 32),
    ("mixed", torch.float32, torch.float16, 16, 32),
])
def test_verify_group_configs(cfg, route, state_dtype, act_dtype, P, N):
    """Launch shapes against the reference: head chunks, P tiles, streamed / whole-tile readout, fold chunks."""
    gen = torch.Generator().manual_seed(P + N)
    case = make_case(gen, "cpu", pages=7, H=8, G=2, P=P, N=N, W=12, T=3, rows=5, n_pad=1, route=route,
                     state_dtype=state_dtype, act_dtype=act_dtype)
    got = run_verify(trk.replay_verify, case, config=cfg)
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act_dtype],
                   state_tol=TOL[torch.float32] if state_dtype == torch.float32 else TOL[state_dtype])


def assert_configs_refused(case, refusals, err=ConfigError):
    """Each ``(config, match)`` in ``refusals`` makes ``replay_verify`` raise ``err`` matching ``match``, and none of
    them changes the case's state or the output buffer."""
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    for cfg, match in refusals:
        with pytest.raises(err, match=match):
            trk.replay_verify(*verify_args(case), out, config=cfg)
    assert all(torch.equal(before[k], case["state"][k]) for k in before) and bool((out == 7.0).all())


def test_verify_rejects_bad_config():
    case = make_case(torch.Generator().manual_seed(0), "cpu", pages=4, H=2, G=1, P=16, N=16, W=8, T=2, rows=2, n_pad=0)
    assert_configs_refused(case, (({"READOUT": "dot"}, "unknown config keys"), ({"NC": 12}, "power of two"),
                       ({"HPP": 3}, "HPP must divide"), ({"HPP": 0}, "HPP must divide"),
                       ({"L2PF": 3}, "L2PF must be 0, 1 or 2"), ({"HEADS": 3}, "HEADS must divide"),
                       ({"HEADS": 0}, "HEADS must divide"), ({"HSTAGES": 0}, "HSTAGES must be >= 1"),
                       ({"HEADS": 2.5}, "HEADS must be an int"), ({"FOLD_N": 0}, "FOLD_N must be a power of two"),
                       ({"FOLD_N": 12}, "FOLD_N must be a power of two"),
                       ({"HEADS": 2, "PFHEADS": -1}, "PFHEADS must be >= 0"), ({"PFHEADS": 1}, "needs HEADS > 1"),
                       ({"KERNEL": "ldg", "PFHEADS": 1}, "TMA kernel only"), ({"SPLIT": 2}, "SPLIT must be 0 or 1"),
                       ({"SPLIT": 1, "SPLIT_HEADS": 3}, "SPLIT_HEADS must divide"),
                       ({"STREAM": 2}, "STREAM must be 0, 1 or 2"), ({"STREAM": 3, "SPLIT": 1}, "STREAM must be"),
                       ({"STREAM": 1, "PROGS": 0}, "PROGS must be >= 1"), ({"STREAM": 1, "FLUSH_W": 0}, "FLUSH_W"),
                       ({"PDL": 1}, "PDL must be 0 or 1"), ({"SPLIT": 1, "PDL": 2}, "PDL must be"),
                       ({"EARLY": 4}, "EARLY must be"), ({"HEADS": 2, "EARLY": 3}, "EARLY must be"),
                       ({"SPLIT": 1, "STREAM": 1, "EARLY": 3}, "EARLY must be"), ({"KSPLIT": 2}, "KSPLIT must be")))


@pytest.mark.parametrize("route", ["flush", "nonflush"])
def test_verify_each_route_and_full_rows(route):
    """Every row of one route, every row of length T (acceptance of the whole window follows)."""
    gen = torch.Generator().manual_seed(7)
    T = 4
    case = make_case(gen, "cpu", pages=6, H=2, G=1, P=16, N=16, W=8, T=T, rows=4, n_pad=1, route=route,
                     qs=[T] * 4)
    flushed = [int(case["num_committed"][p]) + T > 8 for p in case["page_ids"].tolist() if p]
    assert all(flushed) if route == "flush" else not any(flushed)
    compare_verify(case, run_verify(trk.replay_verify, case), run_verify(ref.replay_verify, case),
                   out_tol=2e-5, state_tol=2e-5)


@settings(max_examples=40, **SETTINGS)
@given(st.integers(0, 2**16), st.integers(1, 8), st.integers(0, 24), st.booleans(), st.booleans(), st.booleans())
def test_commit_matches_reference(seed, T, extra_w, bad, short_counts, update_conv):
    gen = torch.Generator().manual_seed(seed)
    W = T + extra_w
    R, pages, rows = W + T, 12, 6
    cur = torch.stack([
        torch.randint(0, R, (pages,), generator=gen), torch.randint(0, W + 1, (pages,), generator=gen),
        torch.randint(1, T + 1, (pages,), generator=gen), torch.randint(0, T + 1, (pages,), generator=gen),
    ]).to(torch.int32)
    ids = (torch.randperm(pages - 1, generator=gen)[:rows] + 1).to(torch.int32)
    ids[-1] = 0
    q = cur[2][ids.long()]
    acc = (torch.rand(rows, generator=gen) * (q + 1).float()).floor().to(torch.int32)
    acc[0] = 0
    acc[1] = q[1]  # acceptance 0 and q
    if bad:
        acc[2] = q[2] + 1 if seed % 2 else -1
    n_acc = rows - 1 if short_counts else rows  # the last row is padding: the counts may stop before it
    c1, c2 = cur.clone(), cur.clone()
    e1, e2 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    ref.replay_commit(c1[0], c1[1], c1[2], c1[3], ids, acc[:n_acc].clone(), W, R, update_conv, e1)
    trk.replay_commit(c2[0], c2[1], c2[2], c2[3], ids, acc[:n_acc].clone(), W, R, update_conv, e2)
    assert torch.equal(c1, c2)
    assert int(e1) == int(e2) == int(bad)
    assert torch.equal(c2[:, 0], cur[:, 0]), "page 0 cursors were written"


@pytest.mark.parametrize("bad", [False, True])
def test_commit_batch_wider_than_one_block(bad):
    """More rows than one commit block (1024): the chunked path checks the whole batch before moving cursors."""
    gen = torch.Generator().manual_seed(1)
    pages, rows, W, T = 1300, 1100, 16, 4
    R = W + T
    cur = torch.stack([
        torch.randint(0, R, (pages,), generator=gen), torch.randint(0, W + 1, (pages,), generator=gen),
        torch.randint(1, T + 1, (pages,), generator=gen), torch.randint(0, T + 1, (pages,), generator=gen),
    ]).to(torch.int32)
    ids = (torch.randperm(pages - 1, generator=gen)[:rows] + 1).to(torch.int32)
    ids[-3:] = 0
    q = cur[2][ids.long()]
    acc = (torch.rand(rows, generator=gen) * (q + 1).float()).floor().to(torch.int32)
    if bad:
        acc[1050] = q[1050] + 1  # in the second block: the first block must not commit either
    c1, c2 = cur.clone(), cur.clone()
    e1, e2 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    ref._replay_commit_torch(c1[0], c1[1], c1[2], c1[3], ids, acc, W, R, True, e1)
    trk.replay_commit(c2[0], c2[1], c2[2], c2[3], ids, acc, W, R, True, e2)
    assert torch.equal(c1, c2) and int(e1) == int(e2) == int(bad)


@settings(max_examples=12, **SETTINGS)
@given(st.integers(0, 2**16), st.sampled_from([(16, 16), (24, 32), (8, 24)]), st.integers(1, 8))
def test_materialize_matches_reference(seed, PN, T):
    gen = torch.Generator().manual_seed(seed)
    P, N = PN
    case = make_case(gen, "cpu", pages=6, H=2, G=1, P=P, N=N, W=T + 8, T=T, rows=4, n_pad=1)
    check_materialize(case, 2e-5)


def check_materialize(case: dict, tol: float) -> None:
    """Materialize ``case``'s pages with both backends on copies of its state: the checkpoints agree within ``tol``
    in the state's dtype, the rings are left as they were, and padding page 0 stays zero."""
    a = {k: v.clone() for k, v in case["state"].items()}
    b = {k: v.clone() for k, v in case["state"].items()}
    args = (case["ring_start"], case["num_committed"], case["A"], case["page_ids"])
    ref.replay_materialize(a["checkpoint"], a["x_ring"], a["B_ring"], a["dt_ring"], *args)
    trk.replay_materialize(b["checkpoint"], b["x_ring"], b["B_ring"], b["dt_ring"], *args)
    assert b["checkpoint"].dtype == case["state"]["checkpoint"].dtype
    assert rel(b["checkpoint"], a["checkpoint"]) < tol
    for name in ("x_ring", "B_ring", "dt_ring"):
        assert torch.equal(b[name], case["state"][name])
    assert bool((b["checkpoint"][0] == 0).all())


def test_dram_bandwidth_unreported_off_the_gpu():
    """Off the GPU, or where the driver cannot say, the bandwidth reads 0.0: the heuristic's H200 launches."""
    assert trk._dram_gbps_per_sm(torch.device("cpu")) == 0.0
    if not torch.cuda.is_available():  # no active Triton driver: the lookup raises inside and falls back
        trk._dram_gbps_per_sm_of.cache_clear()
        assert trk._dram_gbps_per_sm_of(0) == 0.0


@pytest.mark.parametrize("kernel", ["tma", "ldg"])
@pytest.mark.parametrize("state_dtype", [torch.float16, torch.bfloat16])
def test_half_precision_states(kernel, state_dtype):
    """fp16 and bf16 checkpoints on both kernels: a mixed verify (both routes in one launch, the flush rows' folded
    checkpoint rounded to the state dtype) and a materialize, against the reference on the same pages."""
    gen = torch.Generator().manual_seed(2)  # two of the four rows flush
    case = make_case(gen, "cpu", pages=7, H=4, G=2, P=16, N=32, W=10, T=3, rows=5, n_pad=1, route="mixed",
                     state_dtype=state_dtype, act_dtype=torch.float16 if state_dtype == torch.float16 else
                     torch.bfloat16)
    flushes = [int(case["num_committed"][p]) + q > case["W"] for p, q in zip(case["page_ids"].tolist(), case["qs"]) if p]
    assert any(flushes) and not all(flushes), "the case must hold both routes"
    act = case["x"].dtype
    got = run_verify(trk.replay_verify, case, config={"KERNEL": kernel})
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act], state_tol=TOL[state_dtype])
    assert case["state"]["checkpoint"].dtype == state_dtype
    check_materialize(case, TOL[state_dtype])


@settings(max_examples=20, **SETTINGS)
@given(st.integers(0, 2**16), st.integers(2, 4), st.integers(1, 8), st.sampled_from([torch.float32, torch.bfloat16]),
       st.booleans(), st.sampled_from(["silu", None]))
def test_conv_matches_reference(seed, k, T, dtype, with_bias, activation):
    gen = torch.Generator().manual_seed(seed)
    pages, Dc, rows = 7, 40, 5
    width = k - 1 + T
    win = torch.randn(pages, Dc, width, generator=gen).to(dtype)
    win[0] = 0
    shift = torch.randint(0, T + 1, (pages,), generator=gen, dtype=torch.int32)
    qs = torch.randint(1, T + 1, (rows,), generator=gen).tolist()
    cu = torch.tensor([0] + torch.tensor(qs).cumsum(0).tolist(), dtype=torch.int32)
    ids = torch.tensor([3, 1, 0, 5, 6], dtype=torch.int32)
    L = sum(qs)
    xbc = torch.randn(L, Dc, generator=gen).to(dtype)
    w = torch.randn(Dc, k, generator=gen)
    bias = torch.randn(Dc, generator=gen) if with_bias else None
    w1, w2 = win.clone(), win.clone()
    o1 = torch.full((L, Dc), 7.0).to(dtype)
    o2 = o1.clone()
    ref.conv_update(w1, shift, xbc, w, bias, ids, cu, o1, activation=activation)
    tcv.conv_update(w2, shift, xbc, w, bias, ids, cu, o2, activation=activation, block_d=16)
    assert torch.equal(w1, w2)
    assert rel(o2, o1) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert bool((o2[cu[2]:cu[3]] == 7.0).all()), "a padding row's conv output was written"


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


# -- contract: no host sync, errors -----------------------------------------------------------


def test_verify_and_commit_never_sync(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    case = make_case(gen, "cpu", pages=5, H=2, G=1, P=16, N=16, W=8, T=4, rows=3, n_pad=1)

    def boom(*a, **k):
        raise AssertionError("host sync inside a Triton wrapper")

    monkeypatch.setattr(torch.Tensor, "tolist", boom)
    monkeypatch.setattr(torch.Tensor, "item", boom)
    monkeypatch.setattr(torch.Tensor, "__bool__", boom)
    monkeypatch.setattr(torch.Tensor, "__int__", boom)
    st_ = {k: v.clone() for k, v in case["state"].items()}
    out = torch.zeros_like(case["x"])
    trk.replay_verify(st_["checkpoint"], st_["x_ring"], st_["B_ring"], st_["dt_ring"], case["ring_start"],
                      case["num_committed"], case["x"], case["dt"], case["A"], case["B"], case["C"],
                      case["page_ids"], case["cu_seqlens"], case["W"], out)
    cur = torch.zeros(4, 5, dtype=torch.int32)
    trk.replay_commit(cur[0], cur[1], cur[2], cur[3], case["page_ids"], torch.zeros(3, dtype=torch.int32),
                      8, 12, True, torch.zeros(1, dtype=torch.int32))


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


# -- the TMA kernel (runs in the interpreter through a host TensorDescriptor) ---------------------


def test_tma_kernel_chosen_where_the_geometry_allows():
    cpu = torch.device("cpu")
    assert trk.verify_config(4, 8, 32, 32, 20, 4, cpu, 2)["KERNEL"] == "tma"
    assert trk.verify_config(4, 8, 24, 32, 20, 4, cpu, 2)["KERNEL"] == "ldg"  # P not a multiple of 16
    assert trk.verify_config(4, 8, 32, 24, 20, 4, cpu, 2)["KERNEL"] == "ldg"  # N not a power of two
    assert trk.tma_block_p(64, 128, cpu) == 64 and trk.tma_block_p(48, 128, cpu) == 16
    assert trk.tma_block_p(64, 512, cpu) == 0  # the TMA box holds N whole: at most 256


def test_l2_prefetch_sizes(monkeypatch):
    """The TMA kernel's L2 prefetch spans (GPU only, so sized here with the GPU path forced): the first tile, the
    x and dt rings of all the program's heads, the group's B ring; a span or offset a bulk prefetch cannot take
    (not 16-byte aligned) is left out rather than faulting."""
    monkeypatch.setattr(trk, "_compiled", lambda device: True)
    cpu = torch.device("cpu")

    def rings(R, pages=3, H=32, G=2, P=64, N=128):
        return (torch.empty(pages, H, R, P, dtype=torch.bfloat16), torch.empty(pages, G, R, N, dtype=torch.bfloat16),
                torch.empty(pages, H, R))

    tile = 64 * 128 * 4  # an fp32 tile of 64 head-dim rows, N = 128
    xr, Br, dtr = rings(20)
    assert trk._l2_prefetch(0, tile, xr, Br, dtr, 16, cpu) == {"PF_CK": 0, "PF_X": 0, "PF_B": 0, "PF_DT": 0}
    assert trk._l2_prefetch(1, tile, xr, Br, dtr, 16, cpu) == {"PF_CK": 32768, "PF_X": 0, "PF_B": 0, "PF_DT": 0}
    assert trk._l2_prefetch(2, tile, xr, Br, dtr, 16, cpu) == {
        "PF_CK": 32768, "PF_X": 16 * 20 * 64 * 2, "PF_B": 20 * 128 * 2, "PF_DT": 16 * 20 * 4}
    assert trk._l2_prefetch(2, tile // 2, xr, Br, dtr, 1, cpu)["PF_DT"] == 20 * 4  # one head: 80 bytes, aligned
    xr, Br, dtr = rings(18)  # dt rows of 72 bytes: one head's start is not 16-byte aligned, 16 heads' is
    sizes = trk._l2_prefetch(2, tile, xr, Br, dtr, 1, cpu)
    assert sizes["PF_DT"] == 0 and sizes["PF_X"] == 18 * 64 * 2
    assert trk._l2_prefetch(2, tile, xr, Br, dtr, 16, cpu)["PF_DT"] == 16 * 18 * 4
    padded = torch.empty(3, 32, 20, 65, dtype=torch.bfloat16)[..., :64]  # a ring whose rows are 130 bytes apart
    assert trk._l2_prefetch(2, tile, padded, Br, dtr, 16, cpu)["PF_X"] == 0
    with pytest.raises(ConfigError, match="L2PF must be 0, 1 or 2"):
        trk._l2_prefetch(3, tile, xr, Br, dtr, 16, cpu)


def test_tma_launch_heuristic_on_the_gpu(monkeypatch):
    """As measured on the H200: batch 1 (at most one program per SM) runs uncapped with L2 prefetches, a flush row
    folding in 64-column chunks; grids of
    96 or more heads per SM up to 1,024 rows (batch 99-1,024 at H=128) take the route-split streamed launches;
    longer grids with at least 15 programs per SM when a program takes a group's 16 heads run those heads in a
    2-stage pipeline, uncapped, flush rows folded in one product; the grids between one head per program capped
    at 96 registers. The streamed launches give non-flush rows a sequence tile of pow2(W) rows (``KSPLIT``); rings
    over 32 rows (W=32: R=36) take the TMA kernel only that way (flush rows on a 64-row tile, in the same launch
    under a 128-register cap below the streamed launches; their streamed flush launch stores by TMA), and the LDG
    kernel once W itself is over 32."""
    monkeypatch.setattr(trk, "_compiled", lambda device: True)
    monkeypatch.setattr(trk, "_num_sms", lambda device: 132)
    monkeypatch.setattr(trk, "_dram_gbps_per_sm", lambda device: 36.4)  # the H200: 4,800 GB/s over 132 SMs
    cuda = torch.device("cuda")
    small = trk.verify_config(1, 128, 64, 128, 20, 4, cuda, 8)
    assert small["KERNEL"] == "tma" and small["L2PF"] == 2 and "maxnreg" not in small and "HEADS" not in small
    assert small["FOLD_N"] == 64  # uncapped: a flush row folds in two 64-column chunks
    for rows in (8, 32, 64, 98):  # 1,024 / 4,096 / 8,192 / 12,544 heads: under 96 per SM
        mid = trk.verify_config(rows, 128, 64, 128, 20, 4, cuda, 8)
        assert mid["KERNEL"] == "tma" and mid["maxnreg"] == 96 and "L2PF" not in mid and "HEADS" not in mid
        assert "SPLIT" not in mid and "STREAM" not in mid
    for rows in (99, 128, 256, 1024):
        split = trk.verify_config(rows, 128, 64, 128, 20, 4, cuda, 8)
        assert {k: split.get(k) for k in ("SPLIT", "STREAM", "PDL", "PROGS", "maxnreg", "PFHEADS", "KSPLIT")} == dict(
            SPLIT=1, STREAM=2, PDL=1, PROGS=3, maxnreg=168, PFHEADS=1, KSPLIT=1)
        assert "TMA_STORE" not in split  # W=16: the flush launch stores from registers
    assert "KSPLIT" not in small and "KSPLIT" not in trk.verify_config(32, 128, 64, 128, 20, 4, cuda, 8)
    large = trk.verify_config(1025, 128, 64, 128, 20, 4, cuda, 8)  # past the rows a stream ranks in registers
    assert large["KERNEL"] == "tma" and "maxnreg" not in large and "L2PF" not in large and "STREAM" not in large
    assert (large["HEADS"], large["HSTAGES"], large["FOLD_N"], large["PFHEADS"]) == (16, 2, 128, 1)
    # only the measured pipelined launch: 16 heads per program and 32 KB tiles (not 4 heads per group, 3 heads per
    # group, a bf16 checkpoint or N = 256)
    for args, kw in (((256, 128, 64, 128, 20, 4, cuda, 32), {}), ((256, 24, 64, 128, 20, 4, cuda, 8), {}),
                     ((256, 128, 64, 128, 20, 4, cuda, 8), {"state_size": 2}),
                     ((256, 128, 64, 256, 20, 4, cuda, 8), {})):
        assert not {"HEADS", "STREAM"} & set(trk.verify_config(*args, **kw))
    assert [trk.tma_heads(H, G) for H, G in ((128, 8), (128, 1), (24, 8), (48, 2), (8, 8))] == [16, 16, 1, 8, 1]
    for rows in (1, 32, 256, 2048):  # a caller's launch shape: the base launch, none of the heuristic's shape keys
        assert trk.verify_config(rows, 128, 64, 128, 20, 4, cuda, 8, shape=False) == {
            "KERNEL": "tma", "BLOCK_P": 64, "num_warps": 4, "num_stages": 1, "FOLD_N": 32}
    for T in (4, 8):  # W = 32
        w32 = [trk.verify_config(rows, 128, 64, 128, 32 + T, T, cuda, 8) for rows in (1, 32, 98, 256, 2048)]
        assert all(c["KERNEL"] == "tma" and c["KSPLIT"] == 1 for c in w32)
        assert w32[0]["L2PF"] == 2 and w32[3]["STREAM"] == 2 and w32[3]["TMA_STORE"] == 1
        assert all(c["maxnreg"] == 128 and c["EARLY"] == 3 and "HEADS" not in c for c in (w32[1], w32[2], w32[4]))
    assert trk.verify_config(1, 128, 64, 128, 52, 4, cuda, 8)["KERNEL"] == "ldg"  # W = 48


@pytest.mark.parametrize("gbps_per_sm", [25.4, 0.0])
def test_tma_launch_heuristic_by_bandwidth_per_sm(monkeypatch, gbps_per_sm):
    """As measured on the H100 80GB HBM3 (3,352 GB/s over 132 SMs: 25.4 per SM, under ``_LEAN_GBPS_PER_SM``): the
    streamed launches run 2 programs per SM uncapped, and from 15 group programs per SM (batch 248 at H=128) the
    pipelined launch takes over; batch 1-98 and W=32 as on the H200. A card that reports no bandwidth (0.0) gets
    the H200's launches."""
    monkeypatch.setattr(trk, "_compiled", lambda device: True)
    monkeypatch.setattr(trk, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")

    def shapes(W: int = 16) -> dict[int, dict]:
        return {rows: trk.verify_config(rows, 128, 64, 128, W + 4, 4, cuda, 8)
                for rows in (1, 8, 64, 98, 99, 128, 247, 248, 256, 1024, 1025)}

    monkeypatch.setattr(trk, "_dram_gbps_per_sm", lambda device: 36.4)
    h200, h200_w32 = shapes(), shapes(32)
    monkeypatch.setattr(trk, "_dram_gbps_per_sm", lambda device: gbps_per_sm)
    got, got_w32 = shapes(), shapes(32)
    assert got_w32 == h200_w32
    if gbps_per_sm == 0.0:
        assert got == h200
        return
    assert {rows: got[rows] for rows in (1, 8, 64, 98, 1025)} == {rows: h200[rows] for rows in (1, 8, 64, 98, 1025)}
    base = {"KERNEL": "tma", "BLOCK_P": 64, "num_warps": 4, "num_stages": 1}
    for rows in (99, 128, 247):
        assert got[rows] == dict(base, FOLD_N=32, SPLIT=1, STREAM=2, PDL=1, PROGS=2, PFHEADS=1, KSPLIT=1), rows
    for rows in (248, 256, 1024):
        assert got[rows] == dict(base, FOLD_N=128, HEADS=16, HSTAGES=2, PFHEADS=1) == got[1025], rows


def test_verify_config_with_a_launch_shape_drops_the_heuristic_shape(monkeypatch):
    """A config naming HEADS, HSTAGES, SPLIT or STREAM asks the heuristic for the base launch only (so, at batch
    256 on the GPU, ``{"HEADS": 8}`` is not streamed nor capped); other configs get the full heuristic."""
    seen = []
    real = trk.verify_config
    monkeypatch.setattr(trk, "verify_config", lambda *a, **kw: seen.append(kw["shape"]) or real(*a, **kw))
    gen = torch.Generator().manual_seed(2)
    case = make_case(gen, "cpu", pages=4, H=4, G=2, P=16, N=16, W=8, T=2, rows=2, n_pad=0)
    for cfg in ({"KERNEL": "tma", "HEADS": 2}, {"KERNEL": "tma", "HSTAGES": 2}, {"KERNEL": "tma", "SPLIT": 1},
                {"KERNEL": "tma", "STREAM": 1}, {"KERNEL": "tma"}, {"KERNEL": "tma", "FOLD_N": 8}, {}):
        run_verify(trk.replay_verify, case, config=cfg)
    assert seen == [False, False, False, False, True, True, True]


@pytest.mark.parametrize("cfg", [{"KERNEL": "tma"}, {"KERNEL": "tma", "BLOCK_P": 16}, {"KERNEL": "tma", "FOLD_N": 8},
                                 {"KERNEL": "tma", "BLOCK_P": 16, "FOLD_N": 16, "L2PF": 2},
                                 {"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2},
                                 {"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 2},
                                 {"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2, "FOLD_N": 8},
                                 {"KERNEL": "tma", "EARLY": 1}, {"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2, "EARLY": 2},
                                 {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3}, {"KERNEL": "tma", "KSPLIT": 1},
                                 {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3, "KSPLIT": 1, "FOLD_N": 8},
                                 {"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2, "KSPLIT": 1}])
@pytest.mark.parametrize("route,state_dtype,act_dtype,T,W", [
    ("flush", torch.float32, torch.float32, 4, 12), ("mixed", torch.float32, torch.bfloat16, 3, 9),
    ("nonflush", torch.bfloat16, torch.bfloat16, 8, 24), ("mixed", torch.float32, torch.float16, 1, 5),
])
def test_tma_kernel_configs(cfg, route, state_dtype, act_dtype, T, W):
    """The TMA kernel's launches against the reference: P tiles, fold chunks, both routes, dtypes, T and W."""
    gen = torch.Generator().manual_seed(T * 31 + W)
    case = make_case(gen, "cpu", pages=7, H=4, G=2, P=32, N=32, W=W, T=T, rows=5, n_pad=1, route=route,
                     state_dtype=state_dtype, act_dtype=act_dtype)
    got = run_verify(trk.replay_verify, case, config=cfg)
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act_dtype],
                   state_tol=TOL[torch.float32] if state_dtype == torch.float32 else TOL[state_dtype])


@pytest.mark.parametrize("W,T", [(16, 4), (14, 3), (32, 4)])
@pytest.mark.parametrize("route", ["mixed", "flush", "nonflush"])
def test_tma_ksplit(W, T, route):
    """``KSPLIT``: where the ring's sequence tile (``pow2(R)`` rows) is longer than a non-flush row can use
    (``pow2(W)``: ``c + q <= W``), non-flush rows take the short tile; in one launch by a branch on the route, in
    SPLIT's non-flush launch as its only build. Against the reference, on both routes, with and without row
    cursors."""
    gen = torch.Generator().manual_seed(W * 10 + T)
    case = make_case(gen, "cpu", pages=8, H=8, G=2, P=16, N=32, W=W, T=T, rows=5, n_pad=1, route=route,
                     act_dtype=torch.bfloat16)
    assert trk._pow2(W) < trk._pow2(case["R"])  # the short tile applies
    want = run_verify(ref.replay_verify, case)
    p = case["page_ids"].long()
    rc = torch.stack((case["ring_start"][p], case["num_committed"][p]))
    for cfg, cursors in (({"KERNEL": "tma", "EARLY": 3, "KSPLIT": 1}, None),
                         ({"KERNEL": "tma", "EARLY": 3, "KSPLIT": 1}, rc),
                         ({"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2, "KSPLIT": 1, "FOLD_N": 8}, None),
                         ({"KERNEL": "tma", "SPLIT": 1, "EARLY": 3, "KSPLIT": 1}, rc),
                         ({"KERNEL": "tma", "SPLIT": 1, "STREAM": 2, "PROGS": 3, "KSPLIT": 1}, rc),
                         ({"KERNEL": "tma", "STREAM": 1, "PROGS": 5, "KSPLIT": 1}, None)):
        got = run_verify(trk.replay_verify, case, config=cfg, row_cursors=cursors)
        compare_verify(case, got, want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


def test_tma_long_ring_register_cap():
    """A capped launch holding a sequence tile over 32 rows takes at least 128 registers (ptxas built a faulting
    kernel at 104, session 14): a lower cap is a ConfigError that changes nothing; 128, 0, a short ring and SPLIT's
    short-tile non-flush launch (KSPLIT) are accepted and agree with the reference."""
    gen = torch.Generator().manual_seed(32)
    case = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=32, T=4, rows=3, n_pad=1, route="mixed",
                     act_dtype=torch.bfloat16)
    assert_configs_refused(case, ((bad, "maxnreg .* is below 128 on a ring of 36 rows") for bad in (
        {"KERNEL": "tma", "maxnreg": 104}, {"KERNEL": "tma", "maxnreg": 96, "EARLY": 3, "KSPLIT": 1},
        {"KERNEL": "tma", "SPLIT": 1, "maxnreg": 120})))
    want = run_verify(ref.replay_verify, case)
    for ok in ({"KERNEL": "tma", "maxnreg": 128, "EARLY": 3, "KSPLIT": 1}, {"KERNEL": "tma", "maxnreg": 0},
               {"KERNEL": "tma", "SPLIT": 1, "KSPLIT": 1, "maxnreg": 96}):
        compare_verify(case, run_verify(trk.replay_verify, case, config=ok), want, out_tol=TOL[torch.bfloat16],
                       state_tol=TOL[torch.float32])
    short = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=16, T=4, rows=3, n_pad=1, route="mixed",
                      act_dtype=torch.bfloat16)
    compare_verify(short, run_verify(trk.replay_verify, short, config={"KERNEL": "tma", "maxnreg": 96}),
                   run_verify(ref.replay_verify, short), out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


def test_tma_pipelined_group_heads():
    """The GPU heuristic's long-grid launch (a group's 16 heads per program, 2 stages, flush rows folded in one
    product; FOLD_N 8: folded chunk by chunk) against the reference: flush, non-flush and padding rows in one
    launch, two programs per group, two P tiles per head."""
    gen = torch.Generator().manual_seed(9)
    case = make_case(gen, "cpu", pages=6, H=64, G=2, P=32, N=32, W=12, T=4, rows=4, n_pad=1, route="mixed",
                     act_dtype=torch.bfloat16)
    flush = [int(case["num_committed"][p]) + int(case["cu_seqlens"][i + 1] - case["cu_seqlens"][i]) > case["W"]
             for i, p in enumerate(case["page_ids"].tolist()) if p != 0]
    assert any(flush) and not all(flush)  # the case holds both routes
    want = run_verify(ref.replay_verify, case)
    for cfg in ({"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 16, "HSTAGES": 2, "FOLD_N": 32, "PFHEADS": 1},
                {"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 16, "HSTAGES": 2, "FOLD_N": 8}):
        compare_verify(case, run_verify(trk.replay_verify, case, config=cfg), want, out_tol=TOL[torch.bfloat16],
                       state_tol=TOL[torch.float32])


@pytest.mark.parametrize("route", ["mixed", "flush", "nonflush"])
def test_tma_split_launch(route):
    """``SPLIT``: non-flush rows in one launch, flush rows in a persistent launch that ranks them on the device and
    deals (row, head block) items round-robin (3 programs under the interpreter, more items than programs); with
    ``STREAM``, each program of a persistent launch takes an equal contiguous share of the (row, P tile, head) items
    instead (shares start and end mid-group and mid-row); ``STREAM`` without ``SPLIT`` streams both routes in one
    launch, a flush row's heads weighted ``FLUSH_W`` / 4. Padding rows and empty routes included. Against the
    reference, outputs and state."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, "cpu", pages=9, H=16, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route=route,
                     act_dtype=torch.bfloat16)
    want = run_verify(ref.replay_verify, case)
    for cfg in ({"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 4, "HSTAGES": 1, "FOLD_N": 32, "SPLIT": 1},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "SPLIT_HEADS": 1},
                {"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 8, "HSTAGES": 2, "SPLIT": 1, "SPLIT_HEADS": 2},
                {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 1, "PROGS": 5, "SPLIT_HEADS": 4},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "STREAM": 2, "PROGS": 3, "SPLIT_HEADS": 2, "PDL": 1},
                {"KERNEL": "tma", "BLOCK_P": 16, "STREAM": 1, "PROGS": 7, "FOLD_N": 8},
                {"KERNEL": "tma", "BLOCK_P": 32, "STREAM": 1, "PROGS": 4, "FLUSH_W": 3},
                {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 2, "PROGS": 5},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "STREAM": 1, "PROGS": 7},
                {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 2, "PROGS": 5, "EARLY": 1},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "STREAM": 1, "PROGS": 3, "EARLY": 2},
                {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 2, "PROGS": 5, "KSPLIT": 1},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "EARLY": 3, "KSPLIT": 1, "SPLIT_HEADS": 2},
                {"KERNEL": "tma", "BLOCK_P": 32, "SPLIT": 1, "EARLY": 3, "SPLIT_HEADS": 2},
                {"KERNEL": "tma", "BLOCK_P": 16, "STREAM": 1, "PROGS": 7, "KSPLIT": 1}):
        compare_verify(case, run_verify(trk.replay_verify, case, config=cfg), want, out_tol=TOL[torch.bfloat16],
                       state_tol=TOL[torch.float32])


def check_config_key(case, key, state_dtype, good, bad):
    """Each ``good`` config with ``key`` set to 1 matches the reference (outputs and state); each ``bad`` config
    is refused with a ConfigError naming ``key`` and leaves the state and the output buffer untouched."""
    want = run_verify(ref.replay_verify, case)
    for cfg in good:
        compare_verify(case, run_verify(trk.replay_verify, case, config={**cfg, key: 1}), want,
                       out_tol=TOL[torch.bfloat16], state_tol=TOL[state_dtype])
    assert_configs_refused(case, ((cfg, f"{key} must be") for cfg in bad))


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("route", ["mixed", "flush"])
def test_tma_store(route, state_dtype):
    """``TMA_STORE``: a flush row's new checkpoint leaves by a TMA bulk store from shared memory, in every launch
    that folds whole tiles (SPLIT's flush launch round-robin or streamed, the one-head and multi-head launches with
    ``FOLD_N`` >= N); outputs and state as the reference's. A launch folding in column chunks refuses the key, and
    so does any value but 0 or 1, changing nothing."""
    gen = torch.Generator().manual_seed(17)
    case = make_case(gen, "cpu", pages=9, H=8, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route=route,
                     state_dtype=state_dtype, act_dtype=torch.bfloat16)
    check_config_key(case, "TMA_STORE", state_dtype,
                     good=({"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "SPLIT_HEADS": 2},
                           {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 2, "PROGS": 3},
                           {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3, "FOLD_N": 32},
                           {"KERNEL": "tma", "BLOCK_P": 16, "HEADS": 4, "HSTAGES": 2, "FOLD_N": 32}),
                     bad=({"KERNEL": "tma", "FOLD_N": 16, "TMA_STORE": 1},
                          {"KERNEL": "tma", "SPLIT": 1, "TMA_STORE": 2}))


@pytest.mark.parametrize("route", ["mixed"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_tile_ldg(route, state_dtype):
    """``TILE_LDG``: the one-head program's tile (``EARLY`` 3) by plain loads into registers instead of a TMA copy,
    alone, in SPLIT's non-flush launch and whole-tile folds; outputs and state as the reference's. Without
    ``EARLY`` 3, or any value but 0 or 1, the key is refused and nothing changes."""
    gen = torch.Generator().manual_seed(23)
    case = make_case(gen, "cpu", pages=9, H=8, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route=route,
                     state_dtype=state_dtype, act_dtype=torch.bfloat16)
    check_config_key(case, "TILE_LDG", state_dtype,
                     good=({"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3},
                           {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3, "FOLD_N": 32, "KSPLIT": 1},
                           {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3, "SPLIT": 1, "KSPLIT": 1}),
                     bad=({"KERNEL": "tma", "EARLY": 2, "TILE_LDG": 1}, {"KERNEL": "tma", "EARLY": 3, "TILE_LDG": 2}))


@pytest.mark.parametrize("kernel", ["tma", "ldg", "tma-early"])
def test_verify_never_reads_stale_ring_rows(kernel):
    """Ring rows outside a row's history hold inf (x, B) and 1e30 (dt): no output or state may see them."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=8, T=3, rows=4, n_pad=1, route="mixed")
    st, R = case["state"], case["R"]
    for p in case["page_ids"].tolist():
        if p == 0:
            continue
        rs, c = int(case["ring_start"][p]), int(case["num_committed"][p])
        stale = [r for r in range(R) if (r - rs) % R >= c]
        st["x_ring"][p][:, stale] = float("inf")
        st["B_ring"][p][:, stale] = float("inf")
        st["dt_ring"][p][:, stale] = 1e30
    cfg = {"KERNEL": "tma", "EARLY": 3} if kernel == "tma-early" else {"KERNEL": kernel}
    got = run_verify(trk.replay_verify, case, config=cfg)
    assert bool(torch.isfinite(got[1]).all()) and bool(torch.isfinite(got[0]["checkpoint"]).all())
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[torch.float32],
                   state_tol=TOL[torch.float32])


def test_tma_kernel_rejects_what_it_cannot_run():
    """Clear errors, nothing touched: LDG-only keys with KERNEL='tma', an unsupported geometry, an unknown kernel."""
    case = make_case(torch.Generator().manual_seed(1), "cpu", pages=4, H=2, G=1, P=24, N=16, W=8, T=2, rows=2,
                     n_pad=0)
    assert_configs_refused(case, (({"KERNEL": "tma", "HPP": 1}, "LDG kernel only"),
                                  ({"KERNEL": "tma"}, "TMA verify kernel needs"),
                                  ({"KERNEL": "wgmma"}, "KERNEL must be"),
                                  ({"KERNEL": "ldg", "L2PF": 1}, "TMA kernel only"), ({"L2PF": 1}, "TMA kernel only")),
                           err=ValueError)


def test_verify_trace_needs_the_gpu_tma_kernel():
    """``trace`` (inline-PTX timer stamps) runs only in the GPU build of the TMA kernel: anywhere else a clear error
    before anything is written; so is a buffer of the wrong shape."""
    from ssmstate.errors import ShapeError
    case = make_case(torch.Generator().manual_seed(2), "cpu", pages=4, H=2, G=1, P=16, N=16, W=8, T=2, rows=2,
                     n_pad=0)
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    for trace, cfg, err, match in ((torch.zeros(2, 8, 32, 2, dtype=torch.int64), None, ShapeError, "on the GPU"),
                                   (torch.zeros(2, 8, 32, dtype=torch.int64), None, ShapeError, "int64 tensor"),
                                   (torch.zeros(2, 8, 32, 2, dtype=torch.int64), {"KERNEL": "ldg"}, ConfigError,
                                    "TMA kernel only")):
        with pytest.raises(err, match=match):
            trk.replay_verify(*verify_args(case), out, trace=trace, config=cfg)
    assert all(torch.equal(before[k], case["state"][k]) for k in before)
    assert bool((out == 7.0).all())


# -- row cursors (StepPlan.row_cursors) ---------------------------------------------------------


@pytest.mark.parametrize("cfg", [
    {"KERNEL": "tma"}, {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3}, {"KERNEL": "tma", "HEADS": 2, "HSTAGES": 2},
    {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "SPLIT_HEADS": 2},
    {"KERNEL": "tma", "BLOCK_P": 16, "STREAM": 1, "PROGS": 5},
    {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "STREAM": 2, "PROGS": 3, "EARLY": 1},
    {"KERNEL": "tma", "BLOCK_P": 16, "EARLY": 3, "KSPLIT": 1},
    {"KERNEL": "tma", "BLOCK_P": 16, "SPLIT": 1, "KSPLIT": 1},
    {"KERNEL": "ldg"},
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_verify_reads_row_cursors(cfg):
    """With ``row_cursors`` the TMA kernel takes each row's cursors (its route, its history, where it appends) from
    them, not from its page: here they hold a valid cursor state the pages do not, and the result must be the
    reference's on pages holding that state (one-head, pipelined, persistent flush launch, streamed launches with
    their route ranking). The LDG kernel reads the pages' cursors either way."""
    gen = torch.Generator().manual_seed(23)
    case = make_case(gen, "cpu", pages=9, H=8, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route="mixed",
                     act_dtype=torch.bfloat16)
    other, rc = other_cursors(case, 5)
    p = case["page_ids"].long()
    assert not torch.equal(rc[1], case["num_committed"][p])
    flush = (rc[1] + torch.tensor(case["qs"]) > case["W"]) & (p != 0)
    assert bool(flush.any()) and not bool(flush[p != 0].all())  # both routes under the row cursors
    got = run_verify(trk.replay_verify, case, config=cfg, row_cursors=rc)
    ref_case = case if cfg["KERNEL"] == "ldg" else other
    compare_verify(ref_case, got, run_verify(ref.replay_verify, ref_case), out_tol=TOL[torch.bfloat16],
                   state_tol=TOL[torch.float32])


def test_row_cursors_refusals():
    """A wrong ``row_cursors`` tensor is a ShapeError in both functions; a stale one (a page's cursor moved since the
    gather) is a LifecycleError in the reference, which checks them. Nothing is written either way."""
    from ssmstate.errors import LifecycleError, ShapeError
    case = make_case(torch.Generator().manual_seed(3), "cpu", pages=6, H=2, G=1, P=16, N=16, W=8, T=2, rows=3,
                     n_pad=1)
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    p = case["page_ids"].long()
    good = torch.stack((case["ring_start"][p], case["num_committed"][p]))
    for bad in (good[:, :2], good.t().contiguous(), good.long(), good[0], [[0, 0, 0], [0, 0, 0]]):
        for fn in (trk.replay_verify, ref.replay_verify):
            with pytest.raises(ShapeError, match="row_cursors must be"):
                fn(*verify_args(case), out, row_cursors=bad)
    stale = good.clone()
    stale[1, 1] += 1
    with pytest.raises(LifecycleError, match="row 1 .* stale|stale: row 1"):
        ref.replay_verify(*verify_args(case), out, row_cursors=stale)
    padded = good.clone()
    padded[:, 2] = 5  # a padding row's entry is never read
    ref.replay_verify(*verify_args(case, {k: v.clone() for k, v in before.items()}), torch.zeros_like(out),
                      row_cursors=padded)
    assert all(torch.equal(before[k], case["state"][k]) for k in before)
    assert bool((out == 7.0).all())


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
            trk.replay_verify(*verify_args(case), out, pdl=bad)
    assert all(torch.equal(before[k], case["state"][k]) for k in before)
    assert bool((out == 7.0).all())
    win = torch.randn(3, 8, 5)
    win0 = win.clone()
    o = torch.full((2, 8), 7.0)
    with pytest.raises(ConfigError, match="pdl must be a bool"):
        tcv.conv_update(win, torch.zeros(3, dtype=torch.int32), torch.randn(2, 8), torch.randn(8, 4), None,
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
