"""The fused conv + verify compiled on the GPU at Nemotron-H-8B geometry (H=128, P=64, N=128, G=8, conv kernel 4),
against the reference (conv update then verify): batch 1..256, flush, non-flush and mixed rows, the TMA verify
kernel with its conv in every launch shape (and under PDL), the per-warp kernel with its conv (both Nemotron
geometries), the portable fused kernel in every P tile the launch table may choose; repeated launches on the same
inputs (the counters' last-arrival protocol under real concurrency); a manager schedule and a CUDA-graph step with
``conv_verify``. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    from ssmstate.ops import triton as trk

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
from ssmstate.ops import reference as ref
from tests.conv_verify_cases import compare_conv_verify, make_conv_case, run_conv_verify
from tests.test_triton_common import rel

DEV = "cuda"


@pytest.fixture(autouse=True)
def fused_at_every_batch():
    """The manager's triton ``conv_verify`` takes the fused kernel here whatever the table's
    ``fused.max_programs_per_sm``."""
    with trk.override(fused={"MAX_ROWS": 1 << 20, "TMA": 1}):
        yield
NEMO = dict(H=128, G=8, P=64, N=128)
NANO = dict(H=64, G=8, P=64, N=128)


@pytest.mark.parametrize("rows", [1, 8, 33, 256])
@pytest.mark.parametrize("route", ["mixed", "flush", "nonflush"])
def test_conv_verify_nemotron(rows, route):
    gen = torch.Generator().manual_seed(rows * 10 + len(route))
    case = make_conv_case(gen, DEV, W=16, T=4, rows=rows, n_pad=min(2, rows - 1), route=route,
                          act_dtype=torch.bfloat16, empty_row=rows > 4, **NEMO)
    got = run_conv_verify(trk.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


def _kernels(case: dict, **kw) -> list[str]:
    """The kernels ``replay_conv_verify`` launches for ``case`` (nothing runs)."""
    st = case["state"]
    counters = torch.zeros(st["checkpoint"].shape[0], st["B_ring"].shape[1], dtype=torch.int32, device=DEV)
    launches = trk.conv_verify.conv_verify_launches(
        st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
        case["conv"], case["conv_shift"], case["xBC"], case["dt"], case["A"], case["weight"], case["bias"],
        case["page_ids"], case["cu_seqlens"], case["W"], torch.empty_like(case["x"]), counters=counters, **kw)
    return [launch.kernel.fn.__name__ for launch in launches]


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("shape,rows", [
    ("latency", 1), ("latency", 2), ("one_head_wide", 2), ("one_head_wide", 8), ("one_head", 40), ("split", 40),
    ("split", 300), ("pipelined", 40), ("base", 3),
])
def test_conv_verify_tma_shapes(shape, rows, pdl):
    """The TMA verify kernel with its conv in each launch shape, alone and as a programmatic dependent."""
    gen = torch.Generator().manual_seed(rows * 7 + len(shape))
    case = make_conv_case(gen, DEV, W=16, T=4, rows=rows, n_pad=min(1, rows - 1), route="mixed",
                          act_dtype=torch.bfloat16, empty_row=rows > 4, **NEMO)
    row_shift = case["conv_shift"][case["page_ids"].long()].clone()
    with trk.override(shape=shape, fused={"TMA": 1}):
        assert set(_kernels(case)) == {"verify_tma_kernel"}
        got = run_conv_verify(trk.replay_conv_verify, case, pdl=pdl, row_shift=row_shift)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("shape,rows", [("latency", 1), ("latency", 2), ("one_head", 40)])
def test_conv_verify_conv_placement_by_gather_or_selects(shape, rows):
    """The fused layer on the TMA kernel with its conv outputs put into the sequence rows by ``tl.gather`` and by
    selects (``GATHER`` 1 / 0, the launch's choice by Triton version) as programmatic dependents: bit for bit the
    same outputs and state, and the reference's."""
    gen = torch.Generator().manual_seed(rows * 13 + len(shape))
    case = make_conv_case(gen, DEV, W=16, T=4, rows=rows, n_pad=min(1, rows - 1), route="mixed",
                          act_dtype=torch.bfloat16, empty_row=rows > 4, **NEMO)
    got = []
    for gather in (1, 0):
        with trk.override(shape=shape, fused={"TMA": 1, "GATHER": gather}):
            assert set(_kernels(case)) == {"verify_tma_kernel"}
            got.append(run_conv_verify(trk.replay_conv_verify, case, pdl=True))
    (s1, o1), (s0, o0) = got
    assert torch.equal(o1, o0)
    for name in s1:
        assert torch.equal(s1[name], s0[name]), name
    compare_conv_verify(case, got[1], run_conv_verify(ref.replay_conv_verify, case), out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("geom", ["nemo", "nano"])
@pytest.mark.parametrize("T,W,route,rows,n_pad,pdl", [
    (4, 16, "mixed", 12, 2, True), (4, 16, "mixed", 12, 2, False), (4, 16, "flush", 5, 1, True),
    (4, 16, "nonflush", 5, 1, True), (1, 16, "mixed", 6, 1, True), (8, 16, "mixed", 9, 1, True),
    (8, 24, "mixed", 9, 1, True), (3, 5, "mixed", 7, 1, True), (4, 16, "mixed", 64, 0, True),
])
def test_conv_verify_per_warp(T, W, route, rows, n_pad, pdl, geom):
    """The fused layer on the per-warp kernel (``override(shape="warp")``): both routes, T 1-8, W 5-24, both
    Nemotron geometries, a row of 0 tokens, padding rows, the step's gathered conv shifts (with PDL, as the
    backend launches the fused layer) or each page's (without)."""
    gen = torch.Generator().manual_seed(rows * 13 + T * 5 + W + len(route) + len(geom))
    case = make_conv_case(gen, DEV, W=W, T=T, rows=rows, n_pad=n_pad, route=route, act_dtype=torch.bfloat16,
                          empty_row=rows > 4, **(NEMO if geom == "nemo" else NANO))
    row_shift = case["conv_shift"][case["page_ids"].long()].clone()
    with trk.override(shape="warp"):
        assert set(_kernels(case)) == {"verify_warp_kernel"}
        got = run_conv_verify(trk.replay_conv_verify, case, pdl=pdl, row_shift=row_shift if pdl else None)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


def test_conv_verify_per_warp_n256_without_bias_or_activation():
    """The per-warp fused layer at N = 256 (a group's B and C are 512 channels), no conv bias, no activation, no
    D, dt_bias or z."""
    gen = torch.Generator().manual_seed(21)
    case = make_conv_case(gen, DEV, W=16, T=4, rows=6, n_pad=1, route="mixed", act_dtype=torch.bfloat16,
                          bias=False, activation=None, extras=False, H=32, G=2, P=64, N=256)
    with trk.override(shape="warp"):
        got = run_conv_verify(trk.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("cfg,T,W", [
    (dict(TMA=1), 2, 8), (dict(TMA=1), 8, 32), (dict(TMA=0), 4, 16), (dict(TMA=0, BLOCK_P=16), 4, 16),
    (dict(TMA=0, BLOCK_P=32, num_warps=4, maxnreg=0), 4, 16), (dict(TMA=0, FOLD_N=128, maxnreg=0), 4, 16),
])
def test_conv_verify_launches(cfg, T, W):
    gen = torch.Generator().manual_seed(T * 31 + W)
    case = make_conv_case(gen, DEV, W=W, T=T, rows=9, n_pad=1, route="mixed", act_dtype=torch.bfloat16, **NEMO)
    with trk.override(fused=cfg or {}):
        got = run_conv_verify(trk.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16])
def test_conv_verify_half_states(state_dtype):
    gen = torch.Generator().manual_seed(3)
    case = make_conv_case(gen, DEV, W=16, T=4, rows=12, n_pad=2, route="mixed", state_dtype=state_dtype,
                          act_dtype=torch.bfloat16, **NEMO)
    got = run_conv_verify(trk.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=1e-2, state_tol=1e-2)


@pytest.mark.parametrize("cfg", [{"fused": {"TMA": 1}}, {"shape": "split", "fused": {"TMA": 1}},
                                 {"shape": "latency", "fused": {"TMA": 1}}, {"fused": {"TMA": 0}},
                                 {"shape": "warp"}])
def test_conv_verify_repeated_launches_agree(cfg):
    """The same launch 50 times on copies of one case: every result bit-identical (the B/C window is written by the
    group's last program to arrive, whichever it is) and equal to the reference's window."""
    gen = torch.Generator().manual_seed(11)
    case = make_conv_case(gen, DEV, W=16, T=4, rows=64, n_pad=0, route="mixed", act_dtype=torch.bfloat16, **NEMO)
    want = run_conv_verify(ref.replay_conv_verify, case)
    with trk.override(**cfg):
        first = run_conv_verify(trk.replay_conv_verify, case)
    compare_conv_verify(case, first, want, out_tol=1e-2, state_tol=1e-5)
    for _ in range(50):
        with trk.override(**cfg):
            st, out = run_conv_verify(trk.replay_conv_verify, case)
        assert torch.equal(out, first[1])
        for name, t in st.items():
            assert torch.equal(t, first[0][name]), name


def _geom(layers=2):
    return Mamba2Geometry(num_heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4,
                          num_layers=layers, state_dtype=torch.float32, act_dtype=torch.bfloat16)


def _setup(layers, W, T, pages, rows, seed, backends=("triton", "reference")):
    g = _geom(layers)
    layout = PageLayout.replay(g, SpecConfig(T - 1, window=W))
    ms = [StateManager(layout, pages, device=DEV, backend=b, max_batch=rows) for b in backends]
    gen = torch.Generator().manual_seed(seed)
    H, P, N, Dc, k = g.heads_per_rank, g.head_dim, g.state_size, g.conv_dim_per_rank, g.conv_kernel
    params = [dict(A=-(torch.rand(H, generator=gen) + 0.3).cuda(), D=torch.randn(H, generator=gen).cuda(),
                   dt_bias=(torch.randn(H, generator=gen) * 0.3).cuda(),
                   w=(torch.randn(Dc, k, generator=gen) * 0.5).cuda(),
                   b=(torch.randn(Dc, generator=gen) * 0.1).cuda()) for _ in range(layers)]
    ids = [f"r{i}" for i in range(pages - 2)]
    for rid in ids:
        for layer in range(layers):
            S = torch.randn(H, P, N, generator=gen).cuda() * 0.3
            conv = torch.randn(Dc, k - 1, generator=gen).cuda()
            for m in ms:
                if layer == 0:
                    m.admit(rid)
                m.write_state(rid, layer, S, conv)
    return g, ms, params, ids


def _compare(g, ms, ids, tol=2e-2):
    mt, mr = ms
    assert torch.equal(mt.cache.cursors, mr.cache.cursors)
    for rid in ids:
        for layer in range(g.num_layers):
            assert rel(mt.read_state(rid, layer), mr.read_state(rid, layer)) < tol
            assert torch.equal(mt.read_conv(rid, layer), mr.read_conv(rid, layer))


@pytest.mark.parametrize("shape", [None, "warp"])
def test_manager_schedule_conv_verify(shape):
    """Lockstep with ``conv_verify``: ragged steps, device counts, rollbacks, materialize (``shape``: the verify
    kernel's launch, "warp" the per-warp kernel)."""
    with trk.override(**({"shape": shape} if shape else {})):
        _manager_schedule()


def _manager_schedule():
    W, T, rows = 16, 4, 6
    g, ms, params, ids = _setup(2, W, T, 8, rows, 1)
    rng = torch.Generator().manual_seed(9)
    H, P, Dc = g.heads_per_rank, g.head_dim, g.conv_dim_per_rank
    for step in range(10):
        sub = ids[: 1 + step % len(ids)]
        qs = torch.randint(1, T + 1, (len(sub),), generator=rng).tolist()
        acc = [int(torch.randint(0, q + 1, (1,), generator=rng)) for q in qs]
        plans = [m.begin_step(sub, qs, pad_to=rows) for m in ms]
        L = plans[0].total_tokens
        for layer, prm in enumerate(params):
            xBC = torch.randn(L, Dc, generator=rng).to(DEV, torch.bfloat16)
            dt = (torch.randn(L, H, generator=rng) * 0.5 - 0.5).to(DEV)
            z = torch.randn(L, H, P, generator=rng).to(DEV, torch.bfloat16)
            ys = [m.conv_verify(layer, plan, xBC, dt, prm["A"], prm["w"], prm["b"], D=prm["D"],
                                dt_bias=prm["dt_bias"], z=z) for m, plan in zip(ms, plans)]
            assert rel(ys[0], ys[1]) < 2e-2
        if step % 4 == 3:
            for m, plan in zip(ms, plans):
                m.rollback(plan)
        else:
            ms[0].commit(plans[0], torch.tensor(acc, dtype=torch.int32, device=DEV))
            ms[1].commit(plans[1], acc)
        if step == 6:
            for m in ms:
                m.materialize(ids[:3])
        _compare(g, ms, ids)
    ms[0].raise_device_errors()


@pytest.mark.parametrize("pdl,shape", [(False, None), (True, None), (True, "warp")])
def test_cuda_graph_conv_verify(pdl, shape):
    """A captured decode step of ``conv_verify`` per layer + commit, replayed over steps, against the reference
    (``shape``: the verify kernel's launch while the graph is captured)."""
    with trk.override(**({"shape": shape} if shape else {})):
        _cuda_graph_steps(pdl)


def _cuda_graph_steps(pdl):
    from ssmstate.cuda_graph import DecodeStepGraph

    W, T, rows, layers = 16, 4, 8, 3
    g, ms, params, ids = _setup(layers, W, T, rows + 2, rows, 4)
    mt, mr = ms
    if pdl:
        mt.backend.pdl = True
    H, P, Dc = g.heads_per_rank, g.head_dim, g.conv_dim_per_rank
    L = rows * T
    xBC = torch.zeros(layers, L, Dc, dtype=torch.bfloat16, device=DEV)
    dt = torch.zeros(layers, L, H, device=DEV)
    y = torch.zeros(layers, L, H, P, dtype=torch.bfloat16, device=DEV)

    def body(m, out):
        def run(plan):
            n = plan.total_tokens
            for layer, prm in enumerate(params):
                m.conv_verify(layer, plan, xBC[layer, :n], dt[layer, :n], prm["A"], prm["w"], prm["b"], D=prm["D"],
                              dt_bias=prm["dt_bias"], out=out[layer, :n])
        return run

    acc_buf = torch.zeros(rows, dtype=torch.int32, device=DEV)
    graph = DecodeStepGraph(mt, rows, T, body(mt, y), acc_buf)
    y_ref = torch.zeros_like(y)
    rng = torch.Generator().manual_seed(8)
    for step in range(8):
        acc = torch.randint(0, T + 1, (len(ids),), generator=rng).tolist()
        acc_buf.zero_()
        acc_buf[: len(ids)] = torch.tensor(acc, dtype=torch.int32)
        xBC.copy_(torch.randn(xBC.shape, generator=rng))
        dt.copy_(torch.randn(dt.shape, generator=rng) * 0.5 - 0.5)
        plan_r = mr.begin_step(ids, T, pad_to=rows)
        body(mr, y_ref)(plan_r)
        mr.commit(plan_r, acc)
        plan_t = graph.capture(ids) if step == 0 else graph.step(ids)
        assert plan_t.committed
        n = len(ids) * T
        assert rel(y[:, :n], y_ref[:, :n]) < 2e-2
        _compare(g, ms, ids)
    mt.raise_device_errors()
