"""Triton backend on the GPU at Nemotron-H geometry, against the PyTorch reference; CUDA-graph decode step.

H=128, P=64, N=128, G=8, bf16 inputs, fp32 state (plus head_dim 80 and a bf16
state). Skipped as a whole without CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    from ssmstate.ops import triton as trk
    tcv = trk

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
from ssmstate.layout import conv_spec
from ssmstate.ops import reference as ref
from tests.test_triton_common import POISON, compare_verify, make_case, other_cursors, rel, run_verify, verify_args

DEV = "cuda"
NEMO = dict(H=128, G=8, P=64, N=128)


def run_launch(case: dict, launch: dict | None = None, **kw):
    """:func:`run_verify` of the Triton verify under the launch override ``launch`` (None: the heuristic's)."""
    with trk.override(**(launch or {})):
        return run_verify(trk.replay_verify, case, **kw)


def launch_id(c) -> str:
    return "heuristic" if c is None else "-".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("T,W,route,rows,n_pad", [
    (4, 16, "mixed", 12, 3), (4, 16, "flush", 5, 1), (4, 16, "nonflush", 5, 1),
    (2, 16, "mixed", 9, 2), (8, 32, "mixed", 9, 2), (8, 16, "flush", 4, 0), (1, 16, "mixed", 6, 1),
])
def test_verify_nemotron(T, W, route, rows, n_pad):
    gen = torch.Generator().manual_seed(T * 100 + W + rows)
    case = make_case(gen, DEV, pages=rows + 3, W=W, T=T, rows=rows, n_pad=n_pad, route=route,
                     state_dtype=torch.float32, act_dtype=torch.bfloat16, **NEMO)
    got = run_verify(trk.replay_verify, case)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


#: every named launch shape at batch 8 (where the heuristic takes one_head), with a few fields changed: P tiles, fold
#: chunks, heads per pipelined program, register caps, TMA stores, outputs 8 tokens wide
SHAPES = [dict(shape="base"), dict(shape="base", maxnreg=96), dict(shape="latency"),
          dict(shape="latency", BLOCK_P=32), dict(shape="latency", FOLD_N=128, TMA_STORE=1), dict(shape="one_head"),
          dict(shape="one_head", maxnreg=128), dict(shape="one_head", KSPLIT=1),
          dict(shape="one_head_long_ring"), dict(shape="pipelined"),
          dict(shape="pipelined", HEADS=4), dict(shape="pipelined", HEADS=8),
          dict(shape="pipelined", TMA_STORE=1), dict(shape="split"), dict(shape="split", TMA_STORE=1),
          dict(shape="split", PROGS=4, maxnreg=128), dict(shape="split", PROGS=2, maxnreg=0), dict(shape="ldg"),
          dict(shape="ldg", BLOCK_P=16), dict(shape="ldg", BLOCK_P=64, FOLD_N=64), dict(shape="ldg_stream"),
          dict(shape="ldg_stream", NC=64, maxnreg=80), dict(shape="latency", BLOCK_S=8),
          dict(shape="one_head", BLOCK_S=8), dict(shape="split", BLOCK_S=8, PROGS=4, maxnreg=128),
          dict(shape="ldg", BLOCK_S=8)]


@pytest.mark.parametrize("cfg", SHAPES, ids=launch_id)
def test_verify_configs(cfg):
    gen = torch.Generator().manual_seed(7)
    case = make_case(gen, DEV, pages=10, W=16, T=4, rows=8, n_pad=1, act_dtype=torch.bfloat16, **NEMO)
    got = run_launch(case, cfg)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("route", ["mixed", "nonflush"])
@pytest.mark.parametrize("cfg", [dict(shape="split"), dict(shape="split", TMA_STORE=1),
                                 dict(shape="split", PROGS=2, maxnreg=0),
                                 dict(shape="split", FOLD_N=128)], ids=launch_id)
def test_verify_split_batch64(cfg, route):
    """The split launches at batch 64: every one of the non-flush launch's 396 programs' shares spans rows and groups
    (20-21 heads each); on the GPU the flush launch is a programmatic dependent of the first."""
    gen = torch.Generator().manual_seed(64)
    case = make_case(gen, DEV, pages=70, W=16, T=4, rows=64, n_pad=2, route=route, act_dtype=torch.bfloat16,
                     **NEMO)
    got = run_launch(case, cfg)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("pdl", [False, True])
def test_verify_pdl_in_graph_then_consumer(pdl):
    """The split launches: the flush launch overlaps the non-flush one; captured in a CUDA graph with copies of the
    output and the checkpoint right after, which must see both launches' writes (the flush launch ends only after
    the first); with ``pdl=True`` the first also waits for the kernel before."""
    gen = torch.Generator().manual_seed(3)
    case = make_case(gen, DEV, pages=70, W=16, T=4, rows=64, n_pad=2, route="mixed", act_dtype=torch.bfloat16,
                     **NEMO)
    want = run_verify(ref.replay_verify, case)
    st = {k: v.clone() for k, v in case["state"].items()}
    out = torch.empty_like(case["x"])
    out_seen, ck_seen = torch.empty_like(out), torch.empty_like(st["checkpoint"])
    args = verify_args(case, st)
    with trk.override(shape="split"):
        trk.replay_verify(*args, out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], pdl=pdl)  # compile
        torch.cuda.synchronize()
        fresh = {k: v.clone() for k, v in case["state"].items()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            trk.replay_verify(*args, out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], pdl=pdl)
            out_seen.copy_(out)
            ck_seen.copy_(st["checkpoint"])
    for _ in range(3):  # each replay from the same starting state
        for k in st:
            st[k].copy_(fresh[k])
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        got_state = dict(st, checkpoint=ck_seen)
        compare_verify(case, (got_state, out_seen), want, out_tol=1e-2, state_tol=1e-5)


def test_verify_launch_over_shared_memory_is_a_config_error():
    """A launch whose pipeline stages overflow shared memory (3 stages of 512 x 64 fp32 chunks: 401,408 bytes in the
    sm_90a build): ConfigError before anything is written."""
    from ssmstate.errors import ConfigError
    gen = torch.Generator().manual_seed(5)
    case = make_case(gen, DEV, pages=6, W=16, T=4, rows=4, n_pad=0, act_dtype=torch.bfloat16, **NEMO)
    st = case["state"]
    before = {k: v.clone() for k, v in st.items()}
    out = torch.zeros_like(case["x"])
    with pytest.raises(ConfigError, match="does not fit"), trk.override(shape="ldg_stream", BLOCK_P=512, NC=64):
        trk.replay_verify(*verify_args(case), out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"])
    assert all(torch.equal(before[k], st[k]) for k in before) and not out.any()


def _sweep_configs() -> list[dict]:
    from benchmarks.bench_verify import SWEEP
    return SWEEP


@pytest.mark.parametrize("cfg,T,W", [(c, 4, 16) for c in _sweep_configs()] + [(c, 8, 32) for c in _sweep_configs()
                                                                     if c["shape"] not in ("one_head", "pipelined")],
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) if isinstance(c, dict) else str(c))
def test_verify_sweep_configs(cfg, T, W):
    """Every launch the benchmark sweeps, mixed routes with padding, against the reference (at W=32 those the
    heuristic takes on a 40-row ring: not the 96-register one-head launch, which the cap rule refuses there, nor the
    pipelined one)."""
    gen = torch.Generator().manual_seed(T * 10 + W)
    case = make_case(gen, DEV, pages=15, W=W, T=T, rows=12, n_pad=3, route="mixed", act_dtype=torch.bfloat16, **NEMO)
    got = run_launch(case, cfg)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("rows", [1, 40, 160, 256])
@pytest.mark.parametrize("route,state_dtype", [("flush", torch.float32), ("nonflush", torch.float32),
                                               ("mixed", torch.bfloat16)])
def test_verify_heuristic_routes(rows, route, state_dtype):
    """The default launch at batch sizes on both sides of the heuristic's switches, one route at a time."""
    gen = torch.Generator().manual_seed(rows * 3 + len(route))
    case = make_case(gen, DEV, pages=rows + 3, W=16, T=4, rows=rows, n_pad=1 if rows > 1 else 0, route=route,
                     state_dtype=state_dtype, act_dtype=torch.bfloat16, **NEMO)
    got = run_verify(trk.replay_verify, case)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5 if state_dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("rows", [1, 8, 40, 160])
def test_verify_row_cursors(rows):
    """The default launch with ``row_cursors`` (the manager's StepPlan.row_cursors) reads each row's cursors there:
    they hold a state the pages do not (every row's route flipped), and the result is the reference's on pages
    holding it. Batch 1-40 run the one-head launch, 160 the streamed ones with their route ranking."""
    gen = torch.Generator().manual_seed(rows + 77)
    case = make_case(gen, DEV, pages=rows + 3, W=16, T=4, rows=rows, n_pad=1 if rows > 1 else 0, route="mixed",
                     state_dtype=torch.float32, act_dtype=torch.bfloat16, **NEMO)
    other, rc = other_cursors(case, rows)
    got = run_verify(trk.replay_verify, case, row_cursors=rc)
    compare_verify(other, got, run_verify(ref.replay_verify, other), out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("rows", [8, 40, 160])
@pytest.mark.parametrize("cfg", [dict(shape="one_head_long_ring"), dict(shape="latency"), dict(shape="split"),
                                 dict(shape="split", maxnreg=96)], ids=launch_id)
def test_verify_ksplit_w32(cfg, rows):
    """W=32 (a 36-row ring, a 64-row sequence tile) on the TMA kernel: non-flush rows take a 32-row tile
    (``KSPLIT``), in one launch or in the split non-flush launch; a mixed batch with padding and row cursors."""
    gen = torch.Generator().manual_seed(rows + 32)
    case = make_case(gen, DEV, pages=rows + 3, W=32, T=4, rows=rows, n_pad=1, route="mixed",
                     state_dtype=torch.float32, act_dtype=torch.bfloat16, **NEMO)
    p = case["page_ids"].long()
    rc = torch.stack((case["ring_start"][p], case["num_committed"][p]))
    got = run_launch(case, cfg, row_cursors=rc)
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("P,state_dtype,act_dtype", [
    (80, torch.float32, torch.bfloat16), (64, torch.bfloat16, torch.bfloat16), (64, torch.float32, torch.float16),
    (64, torch.float16, torch.float16),
])
def test_verify_dtypes_and_head_dim(P, state_dtype, act_dtype):
    gen = torch.Generator().manual_seed(P)
    case = make_case(gen, DEV, pages=9, H=128, G=8, P=P, N=128, W=16, T=4, rows=7, n_pad=1,
                     state_dtype=state_dtype, act_dtype=act_dtype)
    got = run_verify(trk.replay_verify, case)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1.5e-2, state_tol=1e-5 if state_dtype == torch.float32 else 1e-2)


def test_materialize_nemotron():
    gen = torch.Generator().manual_seed(3)
    case = make_case(gen, DEV, pages=9, W=16, T=4, rows=7, n_pad=2, act_dtype=torch.bfloat16, **NEMO)
    a = {k: v.clone() for k, v in case["state"].items()}
    b = {k: v.clone() for k, v in case["state"].items()}
    args = (case["ring_start"], case["num_committed"], case["A"], case["page_ids"])
    ref.replay_materialize(a["checkpoint"], a["x_ring"], a["B_ring"], a["dt_ring"], *args)
    trk.replay_materialize(b["checkpoint"], b["x_ring"], b["B_ring"], b["dt_ring"], *args)
    assert rel(b["checkpoint"], a["checkpoint"]) < 1e-5
    assert torch.equal(b["checkpoint"][0], case["state"]["checkpoint"][0])


def test_commit_gpu():
    gen = torch.Generator().manual_seed(5)
    pages, W, T = 300, 16, 4
    R = W + T
    for bad in (False, True):
        cur = torch.randint(0, 5, (4, pages), generator=gen, dtype=torch.int32)
        cur[1] = torch.randint(0, W + 1, (pages,), generator=gen, dtype=torch.int32)
        cur[2] = torch.randint(1, T + 1, (pages,), generator=gen, dtype=torch.int32)
        cur[0] = torch.randint(0, R, (pages,), generator=gen, dtype=torch.int32)
        ids = (torch.randperm(pages - 1, generator=gen)[:256] + 1).to(torch.int32)
        ids[-5:] = 0
        acc = torch.minimum(torch.randint(0, T + 1, (256,), generator=gen, dtype=torch.int32), cur[2][ids.long()])
        if bad:
            acc[17] = cur[2][ids[17].long()] + 1
        c1, c2 = cur.cuda(), cur.clone().cuda()
        e1, e2 = torch.zeros(1, dtype=torch.int32, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV)
        ref.replay_commit(c1[0], c1[1], c1[2], c1[3], ids.cuda(), acc.cuda(), W, R, True, e1)
        trk.replay_commit(c2[0], c2[1], c2[2], c2[3], ids.cuda(), acc.cuda(), W, R, True, e2)
        assert torch.equal(c1, c2)
        assert int(e1) == int(e2) == int(bad)


def test_conv_gpu():
    gen = torch.Generator().manual_seed(11)
    pages, Dc, k, T, rows = 10, 128 * 64 + 2 * 8 * 128, 4, 4, 8
    width = k - 1 + T
    win = conv_spec(Dc, width, torch.bfloat16).zeros(pages, "cuda").copy_(torch.randn(pages, Dc, width, generator=gen))
    shift = torch.randint(0, T + 1, (pages,), generator=gen, dtype=torch.int32).cuda()
    qs = torch.randint(1, T + 1, (rows,), generator=gen).tolist()
    cu = torch.tensor([0] + torch.tensor(qs).cumsum(0).tolist(), dtype=torch.int32).cuda()
    ids = torch.tensor([3, 1, 0, 5, 7, 2, 9, 0], dtype=torch.int32).cuda()
    L = sum(qs)
    xbc = torch.randn(L, Dc, generator=gen).to(torch.bfloat16).cuda()
    w = torch.randn(Dc, k, generator=gen).cuda()
    b = torch.randn(Dc, generator=gen).cuda()
    w1, w2 = win.clone(), win.clone()
    o1 = torch.full((L, Dc), 7.0, dtype=torch.bfloat16, device=DEV)
    o2 = o1.clone()
    ref.conv_update(w1, shift, xbc, w, b, ids, cu, o1)
    tcv.conv_update(w2, shift, xbc, w, b, ids, cu, o2)
    assert torch.equal(w1, w2)
    assert rel(o2, o1) < 5e-3


# -- manager level and CUDA graphs ----------------------------------------------------------


def _geom(layers=2):
    return Mamba2Geometry(num_heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4,
                          num_layers=layers, state_dtype=torch.float32, act_dtype=torch.bfloat16)


class _Model:
    """Static buffers and parameters of a toy hybrid step: conv, split into x/B/C, verify."""

    def __init__(self, g: Mamba2Geometry, rows: int, T: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        H, P, N, G, Dc, k = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank, g.conv_kernel
        L = rows * T
        self.g, self.L, self.gen = g, L, gen
        self.params = [dict(A=-(torch.rand(H, generator=gen) + 0.3).cuda(), D=torch.randn(H, generator=gen).cuda(),
                            dt_bias=(torch.randn(H, generator=gen) * 0.3).cuda(),
                            w=(torch.randn(Dc, k, generator=gen) * 0.5).cuda(),
                            b=(torch.randn(Dc, generator=gen) * 0.1).cuda()) for _ in range(g.num_layers)]
        self.xBC = torch.zeros(g.num_layers, L, Dc, dtype=torch.bfloat16, device=DEV)
        self.dt = torch.zeros(g.num_layers, L, H, device=DEV)
        self.z = torch.zeros(g.num_layers, L, H, P, dtype=torch.bfloat16, device=DEV)
        self.conv_out = torch.zeros(g.num_layers, L, Dc, dtype=torch.bfloat16, device=DEV)
        self.y = torch.zeros(g.num_layers, L, H, P, dtype=torch.bfloat16, device=DEV)

    def fill(self):
        g = self.gen
        self.xBC.copy_(torch.randn(self.xBC.shape, generator=g))
        self.dt.copy_(torch.randn(self.dt.shape, generator=g) * 0.5 - 0.5)
        self.z.copy_(torch.randn(self.z.shape, generator=g))

    def body(self, m: StateManager, poison: bool = False):
        """The step's layers through ``m``. ``poison``: each layer's conv output is set to NaN right before its
        conv, so a verify that read x, B or C before the conv ended (a misplaced ``griddepcontrol.wait`` under PDL)
        would output NaN or a stale value."""
        g = self.g
        H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank

        def run(plan):
            L = plan.total_tokens
            for layer, prm in enumerate(self.params):
                if poison:
                    self.conv_out[layer].fill_(float("nan"))  # the kernel right before the conv
                xbc = m.conv(layer, plan, self.xBC[layer, :L], prm["w"], prm["b"], out=self.conv_out[layer, :L])
                x = xbc[:, : H * P].view(L, H, P)
                B = xbc[:, H * P: H * P + G * N].view(L, G, N)
                C = xbc[:, H * P + G * N:].view(L, G, N)
                m.verify(layer, plan, x, self.dt[layer, :L], B, C, prm["A"], D=prm["D"], dt_bias=prm["dt_bias"],
                         z=self.z[layer, :L], out=self.y[layer, :L])
        return run


def _managers(layers, W, T, pages, rows):
    g = _geom(layers)
    layout = PageLayout.replay(g, SpecConfig(T - 1, window=W))
    mt = StateManager(layout, pages, device=DEV, backend="triton", max_batch=rows)
    mr = StateManager(layout, pages, device=DEV, backend="reference", max_batch=rows)
    return g, mt, mr


def _admit_all(g, mt, mr, n, gen):
    ids = [f"r{i}" for i in range(n)]
    for rid in ids:
        mt.admit(rid)
        mr.admit(rid)
        for layer in range(g.num_layers):
            S = torch.randn(g.heads_per_rank, g.head_dim, g.state_size, generator=gen).cuda() * 0.3
            conv = torch.randn(g.conv_dim_per_rank, g.conv_kernel - 1, generator=gen).cuda()
            mt.write_state(rid, layer, S, conv)
            mr.write_state(rid, layer, S, conv)
    return ids


def _compare_managers(g, mt, mr, ids, tol=2e-2):
    assert torch.equal(mt.cache.cursors, mr.cache.cursors)
    for rid in ids:
        for layer in range(g.num_layers):
            assert rel(mt.read_state(rid, layer), mr.read_state(rid, layer)) < tol
            assert rel(mt.read_conv(rid, layer), mr.read_conv(rid, layer)) < tol


def test_manager_schedule_gpu():
    """Lockstep: random uniform and ragged steps, device counts, rollback, materialize."""
    W, T, rows = 16, 4, 6
    g, mt, mr = _managers(2, W, T, 10, rows)
    gen = torch.Generator().manual_seed(1)
    ids = _admit_all(g, mt, mr, 5, gen)
    mod_t, mod_r = _Model(g, rows, T, 2), _Model(g, rows, T, 2)
    rng = torch.Generator().manual_seed(9)
    for step in range(10):
        sub = ids[: 1 + step % len(ids)]
        qs = torch.randint(1, T + 1, (len(sub),), generator=rng).tolist()
        acc = [int(torch.randint(0, q + 1, (1,), generator=rng)) for q in qs]
        plans = [m.begin_step(sub, qs, pad_to=rows) for m in (mt, mr)]
        L = plans[0].total_tokens
        for mod, m, plan in ((mod_t, mt, plans[0]), (mod_r, mr, plans[1])):
            mod.fill()
            mod.body(m)(plan)
        assert rel(mod_t.y[:, :L], mod_r.y[:, :L]) < 2e-2
        if step % 4 == 3:
            mt.rollback(plans[0]), mr.rollback(plans[1])
        else:
            mt.commit(plans[0], torch.tensor(acc, dtype=torch.int32, device=DEV))
            mr.commit(plans[1], acc)
        if step == 6:
            mt.materialize(ids[:3]), mr.materialize(ids[:3])
        _compare_managers(g, mt, mr, ids)
    mt.raise_device_errors()


def test_cuda_graph_decode_step():
    from ssmstate.cuda_graph import DecodeStepGraph

    W, T, rows, layers = 16, 4, 8, 2
    g, mt, mr = _managers(layers, W, T, 10, rows)
    gen = torch.Generator().manual_seed(4)
    ids = _admit_all(g, mt, mr, 5, gen)
    mod_t, mod_r = _Model(g, rows, T, 3), _Model(g, rows, T, 3)
    acc_buf = torch.zeros(rows, dtype=torch.int32, device=DEV)
    graph = DecodeStepGraph(mt, rows, T, mod_t.body(mt), acc_buf)
    rng = torch.Generator().manual_seed(8)
    for step in range(8):
        acc = torch.randint(0, T + 1, (len(ids),), generator=rng).tolist()
        acc_buf.zero_()
        acc_buf[: len(ids)] = torch.tensor(acc, dtype=torch.int32)
        mod_t.fill()
        mod_r.fill()
        plan_r = mr.begin_step(ids, T, pad_to=rows)
        mod_r.body(mr)(plan_r)
        mr.commit(plan_r, acc)
        plan_t = graph.capture(ids) if step == 0 else graph.step(ids)
        assert plan_t.committed
        assert rel(mod_t.y[:, : len(ids) * T], mod_r.y[:, : len(ids) * T]) < 2e-2
        _compare_managers(g, mt, mr, ids)
    mt.raise_device_errors()
    # a bad count rolls the whole step back on the device (as a commit of 0) and raises later
    acc_buf.zero_()
    acc_buf[0] = T + 1
    mod_t.fill()
    mod_r.fill()
    plan_r = mr.begin_step(ids, T, pad_to=rows)
    mod_r.body(mr)(plan_r)
    mr.commit(plan_r, 0)
    graph.step(ids)
    _compare_managers(g, mt, mr, ids)
    with pytest.raises(Exception, match="out of range"):
        mt.raise_device_errors()


# -- programmatic dependent launch (TritonBackend(pdl=True)) ---------------------------------


@pytest.mark.parametrize("rows", [1, 2, 40, 160])  # tile copies before the wait (1-2), one head, SPLIT's two
def test_cuda_graph_decode_step_pdl(rows):
    """A captured step whose convs and verifies launch as programmatic dependents (``backend_options={"pdl":
    True}``): outputs, states and cursors bit-identical to the same step without PDL, and close to the reference,
    over steps whose rows move through both routes; each conv's output is poisoned by the kernel right before it."""
    from ssmstate.cuda_graph import DecodeStepGraph

    W, T, layers = 16, 4, 3
    n = rows
    g = _geom(layers)
    layout = PageLayout.replay(g, SpecConfig(T - 1, window=W))
    mp = StateManager(layout, n + 2, device=DEV, backend="triton", max_batch=rows, backend_options={"pdl": True})
    mt = StateManager(layout, n + 2, device=DEV, backend="triton", max_batch=rows)
    mr = StateManager(layout, n + 2, device=DEV, backend="reference", max_batch=rows)
    assert mp.backend.pdl and not mt.backend.pdl
    gen = torch.Generator().manual_seed(rows)
    ids = _admit_all(g, mt, mr, n, gen)
    for rid in ids:
        mp.admit(rid)
        for layer in range(layers):
            mp.write_state(rid, layer, mt.read_state(rid, layer), mt.read_conv(rid, layer))
    mods = [_Model(g, rows, T, 5) for _ in range(3)]
    accs = [torch.zeros(rows, dtype=torch.int32, device=DEV) for _ in range(2)]
    graphs = [DecodeStepGraph(m, rows, T, mod.body(m, poison=True), acc)
              for m, mod, acc in ((mp, mods[0], accs[0]), (mt, mods[1], accs[1]))]
    rng = torch.Generator().manual_seed(rows + 1)
    routes = set()
    for step in range(10):
        acc = torch.randint(0, T + 1, (n,), generator=rng)
        for a in accs:
            a.copy_(acc.to(torch.int32))
        for mod in mods:
            mod.fill()
        plan_r = mr.begin_step(ids, T, pad_to=rows)
        routes.update((plan_r.row_cursors[1] + T > W).tolist())
        mods[2].body(mr, poison=True)(plan_r)
        mr.commit(plan_r, acc.tolist())
        for gr in graphs:
            gr.capture(ids) if step == 0 else gr.step(ids)
        torch.cuda.synchronize()
        L = n * T
        assert not torch.isnan(mods[0].y[:, :L].float()).any()
        assert torch.equal(mods[0].y[:, :L], mods[1].y[:, :L]), f"step {step}: PDL changed the outputs"
        assert rel(mods[0].y[:, :L], mods[2].y[:, :L]) < 2e-2
        assert torch.equal(mp.cache.cursors, mt.cache.cursors)
        for name in ("checkpoint", "x_ring", "B_ring", "dt_ring", "conv"):
            for layer in range(layers):
                assert torch.equal(mp.cache.layers[layer][name], mt.cache.layers[layer][name]), (step, name, layer)
        _compare_managers(g, mp, mr, ids)
    assert routes == {False, True}, "the schedule should take both routes"
    mp.raise_device_errors()


# -- the launches of a GPU before Hopper ---------------------------------------------------


@pytest.mark.parametrize("rows", [1, 40])
def test_cuda_graph_decode_step_as_before_hopper(rows):
    """The launches a GPU before compute capability 9.0 makes (``DeviceClass.arch`` 80: the portable verify, its
    rows' alignment stated, and no programmatic dependent launch although ``pdl`` asks for it), built for this GPU,
    captured and replayed: close to the reference over steps through both routes."""
    from ssmstate.cuda_graph import DecodeStepGraph
    from ssmstate.ops.triton.common import dram_gbps_per_sm, num_sms

    dev = torch.device(DEV)
    a100 = trk.DeviceClass(compiled=True, sms=num_sms(dev), gbps_per_sm=dram_gbps_per_sm(dev), arch=80)
    W, T, layers = 16, 4, 2
    g = _geom(layers)
    layout = PageLayout.replay(g, SpecConfig(T - 1, window=W))
    with trk.override(device=a100):
        mt = StateManager(layout, rows + 2, device=DEV, backend="triton", max_batch=rows, backend_options={"pdl": True})
        mr = StateManager(layout, rows + 2, device=DEV, backend="reference", max_batch=rows)
        ids = _admit_all(g, mt, mr, rows, torch.Generator().manual_seed(rows))
        mod_t, mod_r = _Model(g, rows, T, 6), _Model(g, rows, T, 6)
        acc_buf = torch.zeros(rows, dtype=torch.int32, device=DEV)
        graph = DecodeStepGraph(mt, rows, T, mod_t.body(mt, poison=True), acc_buf)
        rng = torch.Generator().manual_seed(rows + 2)
        routes = set()
        for step in range(10):
            acc = torch.randint(0, T + 1, (rows,), generator=rng)
            acc_buf.copy_(acc.to(torch.int32))
            mod_t.fill()
            mod_r.fill()
            plan_r = mr.begin_step(ids, T, pad_to=rows)
            routes.update((plan_r.row_cursors[1] + T > W).tolist())
            mod_r.body(mr, poison=True)(plan_r)
            mr.commit(plan_r, acc.tolist())
            graph.capture(ids) if step == 0 else graph.step(ids)
            torch.cuda.synchronize()
            assert rel(mod_t.y[:, : rows * T], mod_r.y[:, : rows * T]) < 2e-2
            _compare_managers(g, mt, mr, ids)
    assert routes == {False, True}, "the schedule should take both routes"
    mt.raise_device_errors()
