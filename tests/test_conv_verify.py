"""The fused conv + verify (``replay_conv_verify``, ``StateManager.conv_verify``) on CPU under the Triton
interpreter, against the reference (conv update then verify).

Kernel level: random pools, conv windows and shifts (both routes, padding rows, rows of 0..T tokens, every
shift 0..T), outputs, checkpoint, rings, conv window and the counters compared; checkpoint fp32/bf16/fp16.
Manager level: a reference and a triton manager driven in lockstep through random schedules (commits, rollbacks,
materialize) with ``conv_verify``, and against a triton manager running ``conv`` + ``verify``; bad calls refused
with nothing changed. The compiled kernel at Nemotron-H geometry is tests/gpu/test_conv_verify_gpu.py.
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
import triton.language as tl  # noqa: E402

from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.errors import ConfigError, LifecycleError, ShapeError, SSMStateError  # noqa: E402
from ssmstate.ops import reference as ref  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402
from ssmstate.ops.triton.conv import _rows_at  # noqa: E402
from tests.conv_verify_cases import compare_conv_verify, make_conv_case, run_conv_verify  # noqa: E402

@pytest.fixture(autouse=True)
def fused_at_every_batch():
    """The manager's triton ``conv_verify`` takes the fused kernel here at every batch, on the CPU too."""
    with ot.override(fused={"MAX_ROWS": 1 << 20, "TMA": 1}):
        yield


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                phases=[Phase.explicit, Phase.reuse, Phase.generate])
TOL = {torch.float32: 3e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@st.composite
def conv_cases(draw):
    G = draw(st.sampled_from([1, 2]))
    T = draw(st.integers(1, 6))
    rows = draw(st.integers(1, 3))
    return dict(
        H=G * draw(st.sampled_from([1, 2])), G=G, P=draw(st.sampled_from([16, 8, 24])),
        N=draw(st.sampled_from([16, 24])), W=draw(st.integers(T, 20)), T=T, k=draw(st.sampled_from([2, 4])),
        rows=rows + 1, n_pad=draw(st.integers(0, 1)) if rows > 1 else 1,
        route=draw(st.sampled_from(["mixed", "flush", "nonflush"])),
        state_dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])),
        act_dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        extras=draw(st.booleans()), bias=draw(st.booleans()), activation=draw(st.sampled_from(["silu", None])),
        empty_row=draw(st.booleans()),
        config=draw(st.sampled_from([{"TMA": 1}, {"TMA": 0}, {"TMA": 0, "BLOCK_P": 8, "FOLD_N": 8},
                                     {"TMA": 0, "HPP": 1}])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=25, **SETTINGS)
@given(conv_cases())
@example(dict(H=2, G=1, P=16, N=16, W=8, T=4, k=4, rows=4, n_pad=1, route="mixed", state_dtype=torch.float32,
              act_dtype=torch.bfloat16, extras=True, bias=True, activation="silu", empty_row=True, config={"TMA": 1},
              seed=1))
@example(dict(H=4, G=2, P=24, N=24, W=6, T=6, k=4, rows=3, n_pad=0, route="flush", state_dtype=torch.bfloat16,
              act_dtype=torch.float32, extras=False, bias=False, activation=None, empty_row=False,
              config={"TMA": 0, "BLOCK_P": 8, "FOLD_N": 8}, seed=2))
@example(dict(H=4, G=1, P=16, N=16, W=5, T=3, k=4, rows=3, n_pad=1, route="mixed", state_dtype=torch.float16,
              act_dtype=torch.bfloat16, extras=True, bias=True, activation="silu", empty_row=False,
              config={"TMA": 0, "HPP": 1, "BLOCK_P": 8}, seed=3))
@example(dict(H=4, G=2, P=16, N=16, W=5, T=3, k=2, rows=4, n_pad=1, route="mixed", state_dtype=torch.bfloat16,
              act_dtype=torch.bfloat16, extras=True, bias=False, activation=None, empty_row=True, config={"TMA": 1},
              seed=4))
def test_conv_verify_matches_reference(c):
    case = make_conv_case(torch.Generator().manual_seed(c["seed"]), "cpu", **{k: v for k, v in c.items()
                                                                             if k not in ("seed", "config")})
    with ot.override(fused=c["config"]):
        got = run_conv_verify(ot.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=TOL[c["act_dtype"]], state_tol=TOL[c["state_dtype"]])


def _kernels(case: dict, **kw) -> list[str]:
    """The kernels ``replay_conv_verify`` launches for ``case``."""
    st = {k: v.clone() for k, v in case["state"].items()}
    counters = torch.zeros(st["checkpoint"].shape[0], st["B_ring"].shape[1], dtype=torch.int32)
    launches = ot.conv_verify.conv_verify_launches(
        st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
        case["conv"].clone(), case["conv_shift"], case["xBC"], case["dt"], case["A"], case["weight"], case["bias"],
        case["page_ids"], case["cu_seqlens"], case["W"], torch.empty_like(case["x"]), counters=counters, **kw)
    return [launch.kernel.fn.__name__ for launch in launches]


@pytest.mark.parametrize("tma", [1, 0])
@pytest.mark.parametrize("shift", [0, 1, 3])
def test_every_conv_shift_and_full_rows(shift, tma):
    """Every row T tokens on one shift (a = 0 rollback: shift T; a = q: 0) and both routes in one batch, on both
    kernels (the TMA verify kernel with its conv, and the portable fused kernel)."""
    case = make_conv_case(torch.Generator().manual_seed(shift), "cpu", H=2, G=1, P=16, N=16, W=4, T=3, k=4,
                          rows=3, n_pad=0, route="mixed", qs=[3, 3, 3], shift=shift)
    with ot.override(fused={"TMA": tma}):
        assert _kernels(case) == ["verify_tma_kernel" if tma else "conv_verify_kernel"]
        got = run_conv_verify(ot.replay_conv_verify, case)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=TOL[torch.float32], state_tol=TOL[torch.float32])


def test_kernel_choice_and_row_shift():
    """The TMA kernel takes the geometries it serves (N a power of two, P a multiple of 16 here), the portable
    kernel the others; a row shift gathered with the step (``row_shift``) gives the same results as the pages'."""
    odd = make_conv_case(torch.Generator().manual_seed(8), "cpu", H=2, G=1, P=16, N=24, W=4, T=2, k=4, rows=2,
                         n_pad=0)
    assert _kernels(odd) == ["conv_verify_kernel"]
    case = make_conv_case(torch.Generator().manual_seed(9), "cpu", H=4, G=2, P=16, N=16, W=6, T=4, k=4, rows=4,
                          n_pad=1, route="mixed", act_dtype=torch.bfloat16)
    row_shift = case["conv_shift"][case["page_ids"].long()].clone()
    assert _kernels(case, row_shift=row_shift) == ["verify_tma_kernel"]
    got = run_conv_verify(ot.replay_conv_verify, case, row_shift=row_shift)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])
    assert torch.equal(got[1], run_conv_verify(ot.replay_conv_verify, case)[1])
    with pytest.raises(ShapeError, match="row_shift"):
        run_conv_verify(ot.replay_conv_verify, case, row_shift=row_shift[:-1])


@pytest.mark.parametrize("shape", ["latency", "one_head", "split", "pipelined"])
def test_tma_launch_shapes(shape):
    """The TMA kernel with its conv in the GPU's launch shapes (one head per program, the split persistent launches,
    a group's 16 heads pipelined in one program): the counters' arrivals add up whatever a program's head count."""
    case = make_conv_case(torch.Generator().manual_seed(len(shape)), "cpu", H=16, G=1, P=16, N=16, W=6, T=4, k=4,
                          rows=4, n_pad=1, route="mixed", act_dtype=torch.bfloat16, empty_row=True)
    row_shift = case["conv_shift"][case["page_ids"].long()].clone()
    with ot.override(shape=shape, fused={"TMA": 1}):
        assert set(_kernels(case)) == {"verify_tma_kernel"}
        got = run_conv_verify(ot.replay_conv_verify, case, row_shift=row_shift)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got, want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


@pytest.mark.parametrize("act_dtype,T,empty_row", [(torch.bfloat16, 4, False), (torch.float32, 3, True),
                                                   (torch.bfloat16, 1, False)])
def test_conv_outputs_placed_by_gather_or_selects_bit_for_bit(act_dtype, T, empty_row):
    """The fused layer on the TMA kernel puts its conv outputs into the sequence rows by ``tl.gather`` (Triton
    before 3.7) or by selects in the loads' layout (from 3.7): the same bits everywhere, both routes, padding and
    empty rows, on the launch the GPU takes at batch 1 and on the interpreter's."""
    case = make_conv_case(torch.Generator().manual_seed(T), "cpu", H=4, G=2, P=16, N=16, W=6, T=T, k=4, rows=4,
                          n_pad=1, route="mixed", act_dtype=act_dtype, empty_row=empty_row)
    for shape in ("base", "latency"):
        got = []
        for gather in (1, 0):
            with ot.override(shape=shape, fused={"TMA": 1, "GATHER": gather}):
                assert _kernels(case) == ["verify_tma_kernel"]
                got.append(run_conv_verify(ot.replay_conv_verify, case))
        (s1, o1), (s0, o0) = got
        assert torch.equal(o1, o0) and s1.keys() == s0.keys()
        for name in s1:
            assert torch.equal(s1[name], s0[name]), (shape, name)
    want = run_conv_verify(ref.replay_conv_verify, case)
    compare_conv_verify(case, got[1], want, out_tol=TOL[act_dtype], state_tol=TOL[torch.float32])


@triton.jit
def _place_rows(y_ptr, idx_ptr, out_ptr, T: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    tt, rr, cc = tl.arange(0, T), tl.arange(0, R), tl.arange(0, C)
    y = tl.load(y_ptr + tt[:, None] * C + cc[None, :])
    tl.store(out_ptr + rr[:, None] * C + cc[None, :], _rows_at(y, tl.load(idx_ptr + rr), T))


def test_rows_at_takes_rows_bit_for_bit():
    """The selects' placement (``conv._rows_at``) moves bits, not values: -0.0, NaN payloads and infinities arrive
    as they were, in 16-bit and 32-bit tiles, rows named more than once or not at all."""
    special = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.5, -2.25, 3e-39]
    idx = torch.tensor([3, 0, 0, 2, 1, 3, 3, 0], dtype=torch.int32)  # every row, three of them more than once
    for dtype, bits in ((torch.bfloat16, torch.int16), (torch.float32, torch.int32)):
        y = torch.tensor(special * 2, dtype=torch.float32).reshape(4, 4).to(dtype)
        y.view(bits)[0, 0] = torch.tensor(-1, dtype=bits)  # a NaN with every payload bit set
        out = torch.empty(8, 4, dtype=dtype)
        _place_rows[(1,)](y, idx, out, T=4, R=8, C=4)
        assert torch.equal(out.view(bits), y.view(bits)[idx.long()])


@pytest.mark.parametrize("tma", [1, 0])
def test_fused_agrees_with_the_triton_pair(tma):
    """The fused launch against the Triton conv then verify on the same case (the pair the manager ran before)."""
    case = make_conv_case(torch.Generator().manual_seed(5), "cpu", H=4, G=2, P=16, N=16, W=6, T=4, k=4, rows=4,
                          n_pad=1, route="mixed", act_dtype=torch.bfloat16)
    with ot.override(fused={"TMA": tma}):
        got = run_conv_verify(ot.replay_conv_verify, case)

    def pair(ck, xr, Br, dtr, rs, nc, win, shift, xBC, dt, A, w, b, ids, cu, W, out, counters=None, **kw):
        y = torch.zeros_like(xBC)
        ot.conv_update(win, shift, xBC, w, b, ids, cu, y, activation=kw.pop("activation"))
        x, B, C = ref.split_xbc(y, ck.shape[1], ck.shape[2], Br.shape[1], ck.shape[3])
        return ot.replay_verify(ck, xr, Br, dtr, rs, nc, x, dt, A, B, C, ids, cu, W, out, **kw)

    compare_conv_verify(case, got, run_conv_verify(pair, case), out_tol=2e-2, state_tol=3e-5)


def test_kernel_refusals():
    case = make_conv_case(torch.Generator().manual_seed(0), "cpu", H=2, G=1, P=16, N=16, W=4, T=2, k=4, rows=2,
                          n_pad=0)
    with pytest.raises(ShapeError, match="counters"):
        run_conv_verify(ot.replay_conv_verify, case, counters=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ConfigError, match="fused override"):
        with ot.override(fused={"BLOCK_P": 12}):
            pass
    with pytest.raises(ConfigError, match="fused override TMA"):
        with ot.override(fused={"TMA": 2}):
            pass
    with pytest.raises(ConfigError, match="unknown fused"):
        with ot.override(fused={"HEADS": 2}):
            pass
    bad = dict(case, state=dict(case["state"], checkpoint=case["state"]["checkpoint"].to(torch.int8)))
    with pytest.raises(ShapeError, match="fp32/bf16/fp16"):
        run_conv_verify(ot.replay_conv_verify, bad)


# -- manager level --------------------------------------------------------------------------


def _managers(geom, spec, backends):
    layout = PageLayout.replay(geom, spec)
    return [StateManager(layout, 6, backend=b, max_batch=4) for b in backends]


def _params(geom, gen):
    H, Dc, k = geom.heads_per_rank, geom.conv_dim_per_rank, geom.conv_kernel
    return [dict(A=-(torch.rand(H, generator=gen) + 0.3), D=torch.randn(H, generator=gen),
                 dt_bias=torch.randn(H, generator=gen) * 0.3, w=torch.randn(Dc, k, generator=gen) * 0.5,
                 b=torch.randn(Dc, generator=gen) * 0.1) for _ in range(geom.num_layers)]


def _step(managers, fused, layer, plans, prm, xBC, dt, z):
    """One layer on every manager: ``conv_verify`` where ``fused[i]``, else ``conv`` + ``verify``."""
    g = managers[0].geometry
    H, P, G, N = g.heads_per_rank, g.head_dim, g.groups_per_rank, g.state_size
    outs = []
    for m, plan, f in zip(managers, plans, fused):
        if f:
            outs.append(m.conv_verify(layer, plan, xBC, dt, prm["A"], prm["w"], prm["b"], D=prm["D"],
                                      dt_bias=prm["dt_bias"], z=z))
        else:
            x, B, C = ref.split_xbc(m.conv(layer, plan, xBC, prm["w"], prm["b"]), H, P, G, N)
            outs.append(m.verify(layer, plan, x, dt, B, C, prm["A"], D=prm["D"], dt_bias=prm["dt_bias"], z=z))
    return outs


def _lockstep(geom, spec, ops, seed):
    managers = _managers(geom, spec, ["triton", "reference", "triton"])
    fused = [True, True, False]
    gen = torch.Generator().manual_seed(seed)
    params = _params(geom, gen)
    H, P, N, Dc, k = geom.heads_per_rank, geom.head_dim, geom.state_size, geom.conv_dim_per_rank, geom.conv_kernel
    ids = [f"r{i}" for i in range(3)]
    for rid in ids:
        for m in managers:
            m.admit(rid)
        for layer in range(geom.num_layers):
            S, conv = torch.randn(H, P, N, generator=gen) * 0.5, torch.randn(Dc, k - 1, generator=gen)
            for m in managers:
                m.write_state(rid, layer, S, conv)
    T = spec.num_tokens
    for op, sub_n, pad, q_seed in ops:
        sub = ids[:sub_n]
        if op == "materialize":
            for m in managers:
                m.materialize(sub)
            continue
        g2 = torch.Generator().manual_seed(q_seed)
        qs = torch.randint(1, T + 1, (sub_n,), generator=g2).tolist()
        acc = [int(torch.randint(0, q + 1, (1,), generator=g2)) for q in qs]
        acc[0] = qs[0] if q_seed % 2 else 0
        plans = [m.begin_step(sub, qs, pad_to=sub_n + pad) for m in managers]
        L = plans[0].total_tokens
        for layer, prm in enumerate(params):
            xBC = torch.randn(L, Dc, generator=gen).to(geom.act_dtype)
            dt, z = torch.randn(L, H, generator=gen) * 0.5 - 0.5, torch.randn(L, H, P, generator=gen)
            outs = _step(managers, fused, layer, plans, prm, xBC, dt, z.to(geom.act_dtype))
            assert ref_rel(outs[0], outs[1]) < 5e-5 and ref_rel(outs[2], outs[1]) < 5e-5, "verify output"
        for m, plan in zip(managers, plans):
            if op == "rollback":
                m.rollback(plan)
            else:
                m.commit(plan, acc)
        _assert_same_state(managers, ids)


def ref_rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-12))


def _assert_same_state(managers, ids):
    base = managers[1]
    for m in (managers[0], managers[2]):
        assert torch.equal(m.cache.cursors, base.cache.cursors)
        for layer in range(base.num_layers):
            for name in ("checkpoint", "x_ring", "B_ring", "dt_ring", "conv"):
                a, b = m.cache.layers[layer][name], base.cache.layers[layer][name]
                assert ref_rel(a, b) < 5e-5, f"{name} differs"
            for rid in ids:
                assert ref_rel(m.read_state(rid, layer), base.read_state(rid, layer)) < 5e-5
                assert torch.equal(m.read_conv(rid, layer), base.read_conv(rid, layer))
    from ssmstate.backends.layer_step import fused_counters
    assert not fused_counters(managers[0].cache).any(), "a fused launch left a counter set"


@settings(max_examples=6, **SETTINGS)
@given(st.integers(0, 2**16), st.sampled_from([(1, 4), (3, 6)]), st.sampled_from([1, 2]),
       st.lists(st.tuples(st.sampled_from(["commit", "commit", "rollback", "materialize"]),
                          st.integers(1, 3), st.integers(0, 1), st.integers(0, 2**16)), min_size=3, max_size=5))
def test_manager_lockstep(seed, KW, layers, ops):
    K, W = KW
    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=layers,
                          state_dtype=torch.float32, act_dtype=torch.float32)
    _lockstep(geom, SpecConfig(K, window=W), ops, seed)


def test_manager_refusals_change_nothing():
    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1,
                          state_dtype=torch.float32, act_dtype=torch.float32)
    (m,) = _managers(geom, SpecConfig(1, window=2), ["triton"])
    m.admit("a")
    plan = m.begin_step(["a"], 2)
    prm = _params(geom, torch.Generator().manual_seed(0))[0]
    L, Dc, H, P = 2, geom.conv_dim_per_rank, 2, 16
    xBC, dt = torch.randn(L, Dc), torch.randn(L, H)
    before = {n: t.clone() for n, t in m.cache.layers[0].items()}
    cursors = m.cache.cursors.clone()
    bad = [
        (dict(xBC=torch.randn(L, Dc + 1)), ShapeError),
        (dict(xBC=xBC.to(torch.bfloat16)), ShapeError),
        (dict(dt=torch.randn(L + 1, H)), ShapeError),
        (dict(weight=torch.randn(Dc, 3)), ShapeError),
        (dict(activation="relu"), SSMStateError),
        (dict(out=xBC[:, : H * P].view(L, H, P)), ShapeError),
        (dict(A=torch.ones(H)), SSMStateError),
        (dict(layer=1), SSMStateError),
    ]
    for change, err in bad:
        kw = dict(layer=0, xBC=xBC, dt=dt, A=prm["A"], weight=prm["w"], bias=prm["b"])
        kw.update(change)
        with pytest.raises(err):
            m.conv_verify(kw.pop("layer"), plan, kw.pop("xBC"), kw.pop("dt"), kw.pop("A"), kw.pop("weight"), **kw)
        assert all(torch.equal(t, before[n]) for n, t in m.cache.layers[0].items())
        assert torch.equal(m.cache.cursors, cursors)
    m.conv_verify(0, plan, xBC, dt, prm["A"], prm["w"], prm["b"])
    with pytest.raises(LifecycleError, match="already"):
        m.conv_verify(0, plan, xBC, dt, prm["A"], prm["w"], prm["b"])
    x, B, C = ref.split_xbc(torch.zeros(L, Dc), 2, 16, 1, 16)
    with pytest.raises(LifecycleError, match="already verified"):
        m.verify(0, plan, x, dt, B, C, prm["A"])
    m.commit(plan, [1])


def test_fused_launch_choice(monkeypatch):
    """The table's rule: one head per program on the GPU, the P tile halved while the grid is under
    ``split_p_programs_per_sm`` programs per SM; the interpreter takes a group's heads and P whole;
    ``override(fused=...)`` replaces fields."""
    from ssmstate.ops.triton import config
    from ssmstate.ops.triton.config import DeviceClass, fused_launch

    h100 = DeviceClass(compiled=True, sms=132, gbps_per_sm=25.4)
    with ot.override():
        assert [fused_launch(b, 128, 64, 128, 8, h100).block_p for b in (1, 256)] == [64, 64]  # the table: no split
    monkeypatch.setitem(config.table()["fused"], "split_p_programs_per_sm", 2)
    assert [fused_launch(b, 128, 64, 128, 8, h100).block_p for b in (1, 2, 4, 256)] == [16, 32, 64, 64]
    assert fused_launch(1, 128, 64, 128, 8, h100).hpp == 1
    interp = fused_launch(3, 4, 24, 16, 2, DeviceClass(compiled=False))
    assert (interp.block_p, interp.hpp, interp.fold_n) == (32, 2, 16)
    base = fused_launch(1, 128, 64, 128, 8, h100)
    with ot.override(fused={"BLOCK_P": 32, "num_warps": 8}):
        got = fused_launch(1, 128, 64, 128, 8, h100)
    assert (got.block_p, got.num_warps, got.fold_n) == (32, 8, base.fold_n) and base.num_warps == 8
    with ot.override(fused={"FOLD_N": 8}):
        with pytest.raises(ConfigError, match="FOLD_N"):
            fused_launch(1, 128, 64, 128, 8, h100)
    with ot.override(fused={"HPP": 32}):
        with pytest.raises(ConfigError, match="HPP"):
            fused_launch(1, 128, 64, 128, 8, h100)


def test_backend_takes_the_pair_past_max_rows():
    """Steps of more rows than the table's ``fused.max_rows`` run the conv and verify kernels: same results, the
    fused kernel's counters never touched."""
    from ssmstate.backends.layer_step import _BUFFERS

    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1,
                          state_dtype=torch.float32, act_dtype=torch.float32)
    mf, mp = _managers(geom, SpecConfig(2, window=4), ["triton", "triton"])
    prm = _params(geom, torch.Generator().manual_seed(3))[0]
    for m in (mf, mp):
        m.admit("a")
        m.admit("b")
    plans = [m.begin_step(["a", "b"], [3, 2]) for m in (mf, mp)]
    gen = torch.Generator().manual_seed(4)
    xBC, dt = torch.randn(5, geom.conv_dim_per_rank, generator=gen), torch.randn(5, 2, generator=gen)
    y1 = mf.conv_verify(0, plans[0], xBC, dt, prm["A"], prm["w"], prm["b"])
    with ot.override(fused={"MAX_ROWS": 1}):
        y2 = mp.conv_verify(0, plans[1], xBC, dt, prm["A"], prm["w"], prm["b"])
    assert mf.cache in _BUFFERS and _BUFFERS[mf.cache].counters is not None
    assert mp.cache not in _BUFFERS or _BUFFERS[mp.cache].counters is None, "the pair ran the fused kernel"
    assert ref_rel(y1, y2) < 5e-5
    for name in ("checkpoint", "x_ring", "B_ring", "dt_ring", "conv"):
        assert ref_rel(mf.cache.layers[0][name], mp.cache.layers[0][name]) < 5e-5, name


@pytest.mark.parametrize("state_dtype,sr", [(torch.int8, False), (torch.float16, True)])
def test_backend_takes_the_pair_for_what_the_fused_kernel_does_not_write(state_dtype, sr):
    """An 8-bit checkpoint (decode scales) or a stochastically rounded one: the triton ``conv_verify`` runs its
    conv and verify kernels even where the fused kernel is forced (this module's fixture), so it writes the same
    bytes as ``conv`` + ``verify`` (scales and seed passed through), flushes included; no fused counter touched."""
    from ssmstate.backends.layer_step import _BUFFERS

    geom = Mamba2Geometry(num_heads=2, head_dim=16, state_size=16, n_groups=1, conv_kernel=4, num_layers=1,
                          state_dtype=state_dtype, act_dtype=torch.float32)
    layout = PageLayout.replay(geom, SpecConfig(2, window=3))
    mf, mp = (StateManager(layout, 6, backend="triton", max_batch=4, stochastic_rounding=sr, seed=7)
              for _ in range(2))
    gen = torch.Generator().manual_seed(6)
    prm = _params(geom, gen)[0]
    H, P, N, Dc, k = 2, 16, 16, geom.conv_dim_per_rank, geom.conv_kernel
    for rid in ("a", "b"):
        S, conv = torch.randn(H, P, N, generator=gen), torch.randn(Dc, k - 1, generator=gen)
        for m in (mf, mp):
            m.admit(rid)
            m.write_state(rid, 0, S, conv)
    for _ in range(3):  # 3 tokens a step into a window of 3: the second step flushes
        plans = [m.begin_step(["a", "b"], [3, 3]) for m in (mf, mp)]
        xBC, dt = torch.randn(6, Dc, generator=gen), torch.randn(6, H, generator=gen) * 0.5 - 0.5
        y1 = mf.conv_verify(0, plans[0], xBC, dt, prm["A"], prm["w"], prm["b"], D=prm["D"], dt_bias=prm["dt_bias"])
        x, B, C = ref.split_xbc(mp.conv(0, plans[1], xBC, prm["w"], prm["b"]), H, P, 1, N)
        y2 = mp.verify(0, plans[1], x, dt, B, C, prm["A"], D=prm["D"], dt_bias=prm["dt_bias"])
        assert torch.equal(y1, y2)
        for m, plan in zip((mf, mp), plans):
            m.commit(plan, [3, 2])
    assert mf.cache not in _BUFFERS or _BUFFERS[mf.cache].counters is None, "the fused kernel ran"
    names = ["checkpoint", "x_ring", "B_ring", "dt_ring", "conv"] + (["checkpoint_scale"] if not sr else [])
    for name in names:
        assert torch.equal(mf.cache.layers[0][name], mp.cache.layers[0][name]), name
    assert torch.equal(mf.cache.cursors, mp.cache.cursors)
