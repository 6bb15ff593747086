"""Lifecycle hardening on the Triton backend, under the Triton interpreter (CPU).

The bad-input walk of ``tests/hardening_walk.py`` on a Triton :class:`StateManager`, and every Triton kernel
(verify on both routes and kernels, commit, materialize, conv) against the reference on cursors written straight
into the cursor tensor (negative, huge): both read them clamped, agree, and leave every other page bit for bit
as it was. ``tests/gpu/sanitize_kernels.py`` runs the same corruption on the GPU under compute-sanitizer.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: tests/gpu/sanitize_kernels.py covers the compiled kernels", allow_module_level=True)
if "ssmstate.ops.triton.common" in sys.modules and not sys.modules["ssmstate.ops.triton.common"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.layout import conv_spec  # noqa: E402
from ssmstate.ops import reference as ref  # noqa: E402
from ssmstate.ops import triton as trk  # noqa: E402
from tests.hardening_walk import bad_input_walk, layer_inputs  # noqa: E402
from tests.test_triton_common import compare_verify, make_case, rel, run_verify  # noqa: E402

GEOM = Mamba2Geometry(2, 16, 16, 1, 4, 2, act_dtype=torch.float32)
SPEC = SpecConfig(2, window=4)
BIG = 1 << 30
INT_MIN = -(1 << 31)


def test_bad_input_walk_triton():
    counts = bad_input_walk(lambda **kw: StateManager(**kw), backend="triton", device="cpu", geometry=GEOM,
                            spec=SPEC)
    print(f"triton backend: {counts['tried']} bad calls, {counts['typed_unchanged']} typed and unchanged")
    assert counts["tried"] == counts["typed_unchanged"] >= 250


def _corrupt(case: dict, gen: torch.Generator) -> list[int]:
    """Write out-of-range cursors into two live pages of ``case`` (one flush-sized, one negative); return them."""
    live = [p for p in case["page_ids"].tolist() if p]
    a, b = live[0], live[1]
    case["ring_start"][a], case["num_committed"][a] = -7, BIG
    case["ring_start"][b], case["num_committed"][b] = BIG, INT_MIN
    return [a, b]


VERIFY_CONFIGS = [  # launch overrides (ssmstate.ops.triton.override): every named shape on this small case
    {"shape": "ldg"}, {"shape": "ldg_stream", "NC": 8}, {"shape": "base"}, {"shape": "latency", "BLOCK_P": 16},
    {"shape": "one_head", "BLOCK_P": 16}, {"shape": "pipelined", "HEADS": 2}, {"shape": "split", "BLOCK_P": 16},
    {"shape": "split", "BLOCK_P": 16, "PROGS": 3}, {"shape": "split", "BLOCK_P": 16, "PROGS": 2, "maxnreg": 0},
]


@pytest.mark.parametrize("cfg", VERIFY_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("row_cursors", [False, True])
def test_verify_corrupted_cursors_stay_in_their_page(cfg, row_cursors):
    gen = torch.Generator().manual_seed(3)
    case = make_case(gen, "cpu", pages=8, H=4, G=2, P=16, N=16, W=8, T=3, rows=5, n_pad=1, route="mixed")
    bad = _corrupt(case, gen)
    p = case["page_ids"].long()
    kw = {"row_cursors": torch.stack((case["ring_start"][p], case["num_committed"][p]))} if row_cursors else {}
    with trk.override(**cfg):
        got = run_verify(trk.replay_verify, case, **kw)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=2e-5, state_tol=2e-5)
    untouched = [q for q in range(8) if q not in case["page_ids"].tolist()]
    for name, t in got[0].items():
        assert torch.equal(t[untouched], case["state"][name][untouched]), f"a page outside the step: {name}"
    assert bad  # the corrupted rows were live rows of the step


def test_commit_corrupted_cursors():
    gen = torch.Generator().manual_seed(4)
    W, T = 8, 3
    R, pages = W + T, 10
    cur = torch.stack([torch.randint(0, R, (pages,), generator=gen), torch.randint(0, W + 1, (pages,), generator=gen),
                       torch.randint(1, T + 1, (pages,), generator=gen),
                       torch.randint(0, T + 1, (pages,), generator=gen)]).to(torch.int32)
    cur[:, 0] = 0
    ids = torch.tensor([2, 5, 7, 3, 0], dtype=torch.int32)
    cur[:, 2] = torch.tensor([-7, BIG, T, -1])  # page 2: every cursor out of range
    cur[:, 5] = torch.tensor([BIG, INT_MIN, BIG, BIG])
    cur[:, 7] = torch.tensor([INT_MIN, -3, 2, INT_MIN])
    for acc in ([0, 3, 1, 1, 0], [2, 0, 2, 0, 0], [0, 4, 0, 0, 0]):  # the last: a > T, the step commits 0
        a = torch.tensor(acc, dtype=torch.int32)
        c1, c2 = cur.clone(), cur.clone()
        e1, e2 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        ref.replay_commit(c1[0], c1[1], c1[2], c1[3], ids, a, W, R, True, e1)
        trk.replay_commit(c2[0], c2[1], c2[2], c2[3], ids, a, W, R, True, e2)
        assert torch.equal(c1, c2) and int(e1) == int(e2), acc
        live = ids[ids != 0].long()
        assert bool(((c2[0, live] >= 0) & (c2[0, live] < R) & (c2[1, live] >= 0) & (c2[1, live] <= W)).all())
        others = [q for q in range(pages) if q not in ids.tolist() or q == 0]
        assert torch.equal(c2[:, others], cur[:, others])


def test_materialize_corrupted_cursors():
    gen = torch.Generator().manual_seed(5)
    case = make_case(gen, "cpu", pages=7, H=2, G=1, P=16, N=16, W=8, T=3, rows=4, n_pad=1)
    _corrupt(case, gen)
    a = {k: v.clone() for k, v in case["state"].items()}
    b = {k: v.clone() for k, v in case["state"].items()}
    args = (case["ring_start"], case["num_committed"], case["A"], case["page_ids"])
    ref.replay_materialize(a["checkpoint"], a["x_ring"], a["B_ring"], a["dt_ring"], *args, window=case["W"])
    trk.replay_materialize(b["checkpoint"], b["x_ring"], b["B_ring"], b["dt_ring"], *args, window=case["W"])
    assert rel(b["checkpoint"], a["checkpoint"]) < 2e-5
    untouched = [q for q in range(7) if q not in case["page_ids"].tolist()]
    assert torch.equal(b["checkpoint"][untouched], case["state"]["checkpoint"][untouched])
    for name in ("x_ring", "B_ring", "dt_ring"):
        assert torch.equal(b[name], case["state"][name])


def test_conv_corrupted_shift():
    gen = torch.Generator().manual_seed(6)
    pages, Dc, k, T = 7, 40, 4, 3
    width = k - 1 + T
    win = conv_spec(Dc, width, torch.float32).zeros(pages, "cpu").copy_(torch.randn(pages, Dc, width, generator=gen))
    win[0] = 0
    shift = torch.tensor([0, -5, BIG, INT_MIN, T + 1, 2, 1], dtype=torch.int32)
    ids = torch.tensor([1, 2, 3, 0, 4], dtype=torch.int32)
    qs = [3, 2, 1, 2, 3]
    cu = torch.tensor([0] + torch.tensor(qs).cumsum(0).tolist(), dtype=torch.int32)
    L = sum(qs)
    xbc, w, bias = torch.randn(L, Dc, generator=gen), torch.randn(Dc, k, generator=gen), torch.randn(Dc, generator=gen)
    w1, w2 = win.clone(), win.clone()
    o1, o2 = torch.full((L, Dc), 7.0), torch.full((L, Dc), 7.0)
    ref.conv_update(w1, shift, xbc, w, bias, ids, cu, o1)
    with trk.override(conv={"BLOCK_D": 16}):
        trk.conv_update(w2, shift, xbc, w, bias, ids, cu, o2)
    assert torch.equal(w1, w2) and rel(o2, o1) < 1e-5
    assert torch.equal(w2[[0, 5, 6]], win[[0, 5, 6]])


def test_manager_lockstep_with_corrupted_cursors():
    """A reference and a Triton manager with the same cursor corrupted behind their backs: every later step,
    rollback and materialize agrees, and the other requests' pages match a run that never saw the corruption."""
    layout = PageLayout.replay(GEOM, SPEC)
    ms = {name: StateManager(layout, 5, backend=name) for name in ("triton", "reference")}
    clean = StateManager(layout, 5, backend="reference")
    gen = torch.Generator().manual_seed(8)
    for rid in ("a", "b", "c"):
        S = [torch.randn(2, 16, 16, generator=gen) for _ in range(2)]
        for m in (*ms.values(), clean):
            m.admit(rid)
            for layer in range(2):
                m.write_state(rid, layer, S[layer])
    def step(m, q, acc, seed):
        plan = m.begin_step(["a", "b", "c"], q)
        g2 = torch.Generator().manual_seed(seed)
        outs = []
        for layer in range(2):
            inp = layer_inputs(m, plan.total_tokens, g2)
            outs.append(m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"]).clone())
            outs.append(m.verify(layer, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"]).clone())
        if acc is None:
            m.rollback(plan)
        else:
            m.commit(plan, acc)
        return outs, plan.cu_seqlens_host.tolist()
    for m in (*ms.values(), clean):
        step(m, [3, 2, 3], [2, 2, 3], 0)
    pa = ms["triton"].page_of("a")
    for m in ms.values():
        m.cache.cursors[:, pa] = torch.tensor([-7, BIG, 0, INT_MIN], dtype=torch.int32)
    for i, (q, acc) in enumerate((([3, 1, 2], [1, 1, 0]), ([2, 3, 1], None), ([1, 2, 3], [1, 2, 3]))):
        (ot, cu), (orf, _) = step(ms["triton"], q, acc, i + 1), step(ms["reference"], q, acc, i + 1)
        oc, _ = step(clean, q, acc, i + 1)
        assert all(rel(a, b) < 5e-5 for a, b in zip(ot, orf))
        for a, b in zip(ot, oc):  # rows b and c: the same outputs as without the corruption
            assert rel(a[cu[1]:], b[cu[1]:]) < 5e-5
        assert torch.equal(ms["triton"].cache.cursors, ms["reference"].cache.cursors)
        keep = [p for p in range(5) if p != pa]
        assert torch.equal(ms["triton"].cache.cursors[:, keep], clean.cache.cursors[:, keep])
        for lt, lr, lc in zip(ms["triton"].cache.layers, ms["reference"].cache.layers, clean.cache.layers):
            for name in lt:
                assert rel(lt[name], lr[name]) < 5e-5, name
                assert rel(lt[name][keep], lc[name][keep]) < 5e-5, name
    for m in ms.values():
        m.materialize(["a", "b"])
    for lt, lr in zip(ms["triton"].cache.layers, ms["reference"].cache.layers):
        assert rel(lt["checkpoint"], lr["checkpoint"]) < 5e-5


def test_rollback_after_conv_without_verify_triton():
    """The Triton conv moved the window; a rollback before any verify puts the history back (conv_shift = q)."""
    layout = PageLayout.replay(GEOM, SPEC)
    m, clean = (StateManager(layout, 4, backend="triton") for _ in range(2))
    gen = torch.Generator().manual_seed(2)
    for rid in ("a", "b"):
        cw = [torch.randn(GEOM.conv_dim, 3, generator=gen) for _ in range(2)]
        for mm in (m, clean):
            mm.admit(rid)
            for layer in range(2):
                mm.write_state(rid, layer, torch.zeros(2, 16, 16), cw[layer])

    def convs(mm, q, seed):
        plan = mm.begin_step(["a", "b"], q)
        g2 = torch.Generator().manual_seed(seed)
        outs = [mm.conv(layer, plan, *(lambda i: (i["xBC"], i["w"], i["b"]))(layer_inputs(mm, plan.total_tokens, g2)))
                for layer in range(2)]
        mm.rollback(plan)
        return outs

    convs(m, [3, 2], 0)
    assert m.cache.conv_shift[[m.page_of("a"), m.page_of("b")]].tolist() == [3, 2]
    for a, b in zip(convs(m, [2, 3], 1), convs(clean, [2, 3], 1)):
        assert torch.equal(a, b)
    for layer in range(2):
        assert torch.equal(m.read_conv("a", layer), clean.read_conv("a", layer))


@pytest.mark.parametrize("state_dtype", ["int8", "fp8"])
def test_bad_input_walk_triton_8bit_stochastic(state_dtype):
    """The walk on an 8-bit pool with stochastic rounding: every refused call leaves codes, scales and the seed as
    they were."""
    g = Mamba2Geometry(2, 16, 16, 1, 4, 2, state_dtype=state_dtype, act_dtype=torch.float32)
    counts = bad_input_walk(lambda **kw: StateManager(**kw, stochastic_rounding=True, seed=3), backend="triton",
                            device="cpu", geometry=g, spec=SPEC)
    assert counts["tried"] == counts["typed_unchanged"] >= 250
