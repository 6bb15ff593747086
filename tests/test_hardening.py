"""Lifecycle hardening: every bad call is a typed refusal that changes nothing, resume trusts nothing it is
given, a rollback after a conv is exact, and the kernels stay inside their page whatever the cursors say.

The reference backend here; ``tests/test_hardening_triton.py`` runs the bad-input walk and the corrupted-cursor
checks on the Triton backend under the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssmstate import (
    BackendUnavailableError,
    ConfigError,
    LifecycleError,
    Mamba2Geometry,
    PageLayout,
    SavedState,
    ShapeError,
    SpecConfig,
    SSMStateError,
    StateManager,
)
from ssmstate.ops import reference as ref
from tests.hardening_walk import bad_input_walk, full_snapshot, layer_inputs, same_snapshot

GEOM = Mamba2Geometry(4, 4, 8, 2, 4, 2, act_dtype=torch.float32)
SPEC = SpecConfig(2, window=4)


def _mgr(scheme: str = "replay", pages: int = 5, backend: str = "reference") -> StateManager:
    layout = getattr(PageLayout, scheme)(GEOM, SPEC)
    m = StateManager(layout, num_pages=1 + (pages - 1) * layout.pages_per_request, backend=backend)
    gen = torch.Generator().manual_seed(1)
    for rid in ("a", "b"):
        m.admit(rid)
        for layer in range(GEOM.num_layers):
            m.write_state(rid, layer, torch.randn(4, 4, 8, generator=gen),
                          torch.randn(GEOM.conv_dim, 3, generator=gen))
    return m


def _step(m: StateManager, ids, q, accepted, seed: int = 0, conv: bool = True) -> None:
    plan = m.begin_step(ids, q)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(m.num_layers):
        inp = layer_inputs(m, plan.total_tokens, gen)
        if conv:
            m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"])
        m.verify(layer, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"])
    m.commit(plan, accepted)


def _same_tensors(m1: StateManager, m2: StateManager) -> bool:
    pairs = [(a, b) for la, lb in zip(m1.cache.layers, m2.cache.layers) for a, b in zip(la.values(), lb.values())]
    return all(torch.equal(a, b) for a, b in pairs + [(m1.cache.cursors, m2.cache.cursors)])


def _refused(m: StateManager, call, exc=SSMStateError, match: str | None = None) -> None:
    snap = full_snapshot(m)
    with pytest.raises(exc, match=match):
        call()
    assert same_snapshot(snap, full_snapshot(m))


# -- 1. resume trusts nothing ------------------------------------------------------------------------------

def _saved(m: StateManager, rid: str = "b") -> SavedState:
    _step(m, ["a", rid], [3, 2], [2, 1])
    return m.preempt(rid)


def _edit(saved: SavedState, layer: int | None = None, name: str | None = None, value=None, cursors=None,
          tensors=None) -> SavedState:
    layers = [dict(t) for t in saved.tensors] if tensors is None else tensors
    if name is not None:
        if value is None:
            del layers[layer][name]
        else:
            layers[layer][name] = value
    return SavedState(saved.layout, tuple(layers), saved.cursors if cursors is None else cursors)


def _cursor(saved: SavedState, row: int, value: int) -> SavedState:
    cur = saved.cursors.clone()
    cur[row, 0] = value
    return _edit(saved, cursors=cur)


@pytest.mark.parametrize("row,value,what", [
    (0, -7, "ring_start"), (0, 7, "ring_start"), (1, 999, "num_committed"), (1, -1, "num_committed"),
    (2, 1, "pending"), (3, 4, "conv_shift"), (3, -2, "conv_shift"),
])
def test_resume_refuses_cursors_out_of_range(row, value, what):
    m = _mgr()
    saved = _saved(m)
    _refused(m, lambda: m.resume("b", _cursor(saved, row, value)), SSMStateError, what)
    m.resume("b", saved)  # the untouched blob still resumes


def test_resume_refuses_a_blob_of_another_shape_and_leaks_no_page():
    m = _mgr()
    saved = _saved(m)
    x_ring = saved.tensors[0]["x_ring"]
    bad = {
        "fewer layers": (_edit(saved, tensors=[dict(saved.tensors[0])]), "layers"),
        "extra layer": (_edit(saved, tensors=[dict(t) for t in saved.tensors] + [dict(saved.tensors[0])]),
                        "layers"),
        "ring shape": (_edit(saved, 1, "x_ring", x_ring[:, :, :-1]), "x_ring"),
        "ring dtype": (_edit(saved, 1, "x_ring", x_ring.double()), "x_ring"),
        "missing key": (_edit(saved, 1, "B_ring"), "B_ring"),
        "extra key": (_edit(saved, 0, "junk", x_ring), "junk"),
        "not a tensor": (_edit(saved, 0, "dt_ring", [1.0]), "dt_ring"),
        "cursor shape": (_edit(saved, cursors=saved.cursors[:3]), "cursors"),
        "cursor dtype": (_edit(saved, cursors=saved.cursors.long()), "cursors"),
        "tensors not a sequence": (SavedState(saved.layout, None, saved.cursors), "tensors"),
    }
    for name, (blob, match) in bad.items():
        free = m.pool.num_free
        _refused(m, lambda: m.resume("b", blob), SSMStateError, match)
        assert m.pool.num_free == free, name
    _refused(m, lambda: m.resume(["b"], saved), SSMStateError, "hashable")
    _refused(m, lambda: m.resume("a", saved), LifecycleError, "already admitted")
    page = m.resume("b", saved)
    assert m.pool.num_free == 5 - 1 - 2


def test_resumed_page_holds_nothing_of_its_previous_owner():
    m = _mgr(pages=4)
    saved = _saved(m)
    m.admit("c")
    want = [(name, t.clone()) for layer in saved.tensors for name, t in layer.items()]
    m.preempt("c")  # its page goes back to the pool and comes out again for "b"
    page = m.resume("b", saved)
    got = [t[page:page + 1] for layer in m.cache.layers for t in layer.values()]
    assert all(torch.equal(w, g) for (_, w), g in zip(want, got))
    assert torch.equal(m.cache.cursors[:, page:page + 1], saved.cursors)


# -- 2. rollback after a conv but no verify ------------------------------------------------------------

def _conv_outputs(m: StateManager, seed: int) -> list[torch.Tensor]:
    plan = m.begin_step(["a", "b"], [2, 1])
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for layer in range(m.num_layers):
        inp = layer_inputs(m, plan.total_tokens, gen)
        outs.append(m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"]).clone())
    m.rollback(plan)
    return outs


@pytest.mark.parametrize("scheme", ["replay", "native"])
def test_rollback_after_conv_without_verify_is_exact(scheme):
    m, clean = _mgr(scheme), _mgr(scheme)
    if scheme == "replay":
        _step(m, ["a", "b"], [3, 2], [1, 2])
        _step(clean, ["a", "b"], [3, 2], [1, 2])
    plan = m.begin_step(["a", "b"], [2, 1])  # q <= K: exact on the native layout too
    gen = torch.Generator().manual_seed(5)
    for layer in range(m.num_layers):
        inp = layer_inputs(m, plan.total_tokens, gen)
        m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"])
    m.rollback(plan)
    assert m.open_step is None
    assert torch.equal(m.cache.pending, clean.cache.pending)
    for rid in ("a", "b"):
        for layer in range(m.num_layers):
            assert torch.equal(m.read_conv(rid, layer), clean.read_conv(rid, layer))
    assert all(torch.equal(x, y) for x, y in zip(_conv_outputs(m, 9), _conv_outputs(clean, 9)))


def test_native_rollback_after_a_full_window_conv_is_refused():
    """The native window (k - 1 + K columns) lost its oldest history column to a T-token conv: refused, and
    the step can still be verified and committed."""
    m = _mgr("native")
    plan = m.begin_step(["a"], 3)
    gen = torch.Generator().manual_seed(0)
    inps = [layer_inputs(m, 3, gen) for _ in range(m.num_layers)]
    for layer, inp in enumerate(inps):
        m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"])
    _refused(m, lambda: m.rollback(plan), LifecycleError, "conv")
    for layer, inp in enumerate(inps):
        m.verify(layer, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"])
    m.commit(plan, [1])


# -- 3. materialize with a repeated request or page ---------------------------------------------------

def test_materialize_refuses_a_repeated_request():
    m = _mgr()
    _step(m, ["a", "b"], [3, 2], [2, 2])
    _refused(m, lambda: m.materialize(["a", "a"]), SSMStateError, "twice")


def test_materialize_pages_folds_a_repeated_page_once():
    m, once = _mgr(), _mgr()
    for mm in (m, once):
        _step(mm, ["a", "b"], [3, 2], [2, 2])
    pa, pb = m.page_of("a"), m.page_of("b")
    m.materialize_pages(torch.tensor([pa, pb, pa, 0, pa], dtype=torch.int32))
    once.materialize_pages(torch.tensor([pa, pb], dtype=torch.int32))
    assert int(m.cache.num_committed[pa]) == 0 and _same_tensors(m, once)


# -- 4. native rollback before any verify ----------------------------------------------------------------

def test_native_rollback_before_verify():
    m = _mgr("native")
    plan = m.begin_step(["a", "b"], 2)
    m.rollback(plan)
    assert m.open_step is None and int(m.cache.pending.sum()) == 0
    _step(m, ["a"], 2, [1], conv=False)


# -- 5. out aliasing an input ------------------------------------------------------------------------------

def test_out_aliasing_an_input_is_refused():
    m = _mgr()
    plan = m.begin_step(["a", "b"], [3, 2])
    inp = layer_inputs(m, plan.total_tokens, torch.Generator().manual_seed(0))
    args = (0, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"])
    _refused(m, lambda: m.verify(*args, out=inp["x"]), ShapeError, "overlaps x")
    z = torch.randn_like(inp["x"])
    _refused(m, lambda: m.verify(*args, z=z, out=z), ShapeError, "overlaps z")
    _refused(m, lambda: m.conv(0, plan, inp["xBC"], inp["w"], out=inp["xBC"]), ShapeError, "overlaps xBC")


# -- 6. engine-facing page ids ---------------------------------------------------------------------------------

def test_engine_page_ids_are_range_checked():
    m = _mgr()
    i32 = dict(dtype=torch.int32)
    for pages in ([-1], [5], [1, 1 << 20]):
        _refused(m, lambda: m.reset_cursors(torch.tensor(pages, **i32)), SSMStateError, "page")
        _refused(m, lambda: m.materialize_pages(torch.tensor(pages, **i32)), SSMStateError, "page")
    for pages in ([-2], [5], [1, 1]):
        n = len(pages)
        cu = torch.arange(n + 1, **i32)
        _refused(m, lambda: m.begin_step_from_tensors(torch.tensor(pages, **i32), cu, n, 1), SSMStateError, "page")
        assert m.open_step is None


# -- 7. untyped TypeErrors ---------------------------------------------------------------------------------

def test_counts_bad_types_refused_numpy_integers_accepted():
    m = _mgr()
    for bad in (2.0, None, True, "2", [2.0], [True], [None]):
        _refused(m, lambda: m.begin_step(["a"], bad), SSMStateError, "num_tokens")
    _refused(m, lambda: m.begin_step(None, 1), SSMStateError, "request_ids")
    _refused(m, lambda: m.begin_step(["a"], 1, pad_to=1.5), SSMStateError, "pad_to")
    _refused(m, lambda: m.begin_step(["a"], 1, pad_to=True), SSMStateError, "pad_to")
    _refused(m, lambda: m.materialize(None), SSMStateError, "request_ids")
    _refused(m, lambda: m.begin_step([["a"]], 1), SSMStateError, "hashable")
    plan = m.begin_step(["a", "b"], np.int64(2), pad_to=np.int32(3))
    assert plan.num_tokens == (2, 2, 2)
    m.rollback(plan)
    plan = m.begin_step(["a"], [np.int64(2)])
    m.rollback(plan)
    _step(m, ["a", "b"], 2, np.int64(1))


# -- 8. constructors -----------------------------------------------------------------------------------------

def test_constructor_refusals_are_typed():
    layout = PageLayout.replay(GEOM, SPEC)
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="cuda"):
            StateManager(layout, 4, device="cuda")
    with pytest.raises(ConfigError, match="device"):
        StateManager(layout, 4, device="gpu")
    with pytest.raises(ConfigError, match="layout"):
        StateManager("x", 4)
    with pytest.raises(ConfigError, match="cache"):
        StateManager(layout, 4, cache="x")
    with pytest.raises(ConfigError, match="spec"):
        PageLayout.replay(GEOM, "spec")
    with pytest.raises(ConfigError, match="geometry"):
        PageLayout.native("geometry", SPEC)


# -- 9. A > 0 ----------------------------------------------------------------------------------------------------

def test_positive_A_refused_once_per_tensor(monkeypatch):
    m = _mgr()
    _refused(m, lambda: m.bind_layer(0, torch.tensor([-1.0, 0.5, -1.0, -1.0])), SSMStateError, "A")
    plan = m.begin_step(["a", "b"], [3, 2])
    inp = layer_inputs(m, plan.total_tokens, torch.Generator().manual_seed(0))
    bad_A = -inp["A"]
    _refused(m, lambda: m.verify(0, plan, inp["x"], inp["dt"], inp["B"], inp["C"], bad_A), SSMStateError, "A")
    nan_A = inp["A"].clone()
    nan_A[1] = float("nan")
    _refused(m, lambda: m.verify(0, plan, inp["x"], inp["dt"], inp["B"], inp["C"], nan_A), SSMStateError, "A")
    import ssmstate.manager as mm
    seen = []
    real = mm.check_A_values
    monkeypatch.setattr(mm, "check_A_values", lambda A: (seen.append(A), real(A))[1])
    for layer in range(2):
        m.verify(layer, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"])
    m.rollback(plan)
    assert len(seen) == 2  # once per (layer, tensor)
    _step(m, ["a", "b"], [3, 2], [1, 1])  # same A object for every layer of every step (layer_inputs caches it)
    assert len(seen) == 2


# -- kernels stay inside their page whatever the cursors say --------------------------------------------------

def test_reference_clamps_corrupted_cursors():
    """Cursors written straight into the cursor tensor: the reference reads them clamped (ring_start to [0, R),
    num_committed to [0, W], conv_shift and pending to [0, T]); every other page ends bit-identical to a run
    that never saw the corruption, and the corrupted page's cursors come back in range."""
    R, W, T = SPEC.ring_len, SPEC.window, SPEC.num_tokens
    for row, value in ((0, -7), (0, 1 << 30), (1, 999), (1, -3), (3, -5), (3, 99)):
        m, clean = _mgr(), _mgr()
        for mm in (m, clean):
            mm.admit("c")
            _step(mm, ["a", "b", "c"], [3, 2, 3], [2, 1, 3])
        pa = m.page_of("a")
        m.cache.cursors[row, pa] = value
        for mm in (m, clean):
            _step(mm, ["a", "b", "c"], [3, 2, 1], [1, 2, 0], seed=row)
            _step(mm, ["b", "a"], [1, 2], [1, 2], seed=row + 1)
        keep = [p for p in range(m.cache.num_pages) if p != pa]
        for la, lb in zip(m.cache.layers, clean.cache.layers):
            for name in la:
                assert torch.equal(la[name][keep], lb[name][keep]), (row, value, name)
        assert torch.equal(m.cache.cursors[:, keep], clean.cache.cursors[:, keep])
        rs, c, q, s = (int(v) for v in m.cache.cursors[:, pa])
        assert 0 <= rs < R and 0 <= c <= W and q == 0 and 0 <= s <= T, (row, value, rs, c, s)
        m.cache.cursors[1, pa] = 999
        m.materialize(["a"])
        assert int(m.cache.num_committed[pa]) == 0 and 0 <= int(m.cache.ring_start[pa]) < R


def test_clamp_semantics():
    rs = torch.tensor([-7, 0, 6, 7, 1 << 30], dtype=torch.int32)
    c = torch.tensor([-1, 0, 4, 5, 999], dtype=torch.int32)
    got_rs, got_c = ref.clamp_ring_cursors(rs, c, window=4, ring_len=7)
    assert got_rs.tolist() == [0, 0, 6, 6, 6] and got_c.tolist() == [0, 0, 4, 4, 4]


def test_bad_input_walk_reference():
    counts = bad_input_walk(lambda **kw: StateManager(**kw), backend="reference", device="cpu")
    print(f"reference backend: {counts['tried']} bad calls, {counts['typed_unchanged']} typed and unchanged")
    assert counts["tried"] == counts["typed_unchanged"] >= 120


def test_bad_input_walk_native():
    counts = bad_input_walk(lambda **kw: StateManager(**kw), backend="reference", device="cpu", scheme="native")
    print(f"native layout: {counts['tried']} bad calls, {counts['typed_unchanged']} typed and unchanged")
    assert counts["tried"] == counts["typed_unchanged"] >= 60


@pytest.mark.parametrize("state_dtype", ["int8", "fp8"])
def test_bad_input_walk_8bit_stochastic(state_dtype):
    """An 8-bit checkpoint written with stochastic rounding: every refused call also leaves the codes, the scales
    and the device seed alone."""
    geom = Mamba2Geometry(4, 4, 8, 2, 4, 2, act_dtype=torch.float32, state_dtype=state_dtype)
    counts = bad_input_walk(lambda **kw: StateManager(**kw, stochastic_rounding=True, seed=3), backend="reference",
                            device="cpu", geometry=geom)
    assert counts["tried"] == counts["typed_unchanged"] >= 120


def test_resume_refuses_8bit_blob_without_its_scales():
    layout = PageLayout.replay(Mamba2Geometry(4, 4, 8, 2, 4, 2, state_dtype="int8"), SPEC)
    m = StateManager(layout, num_pages=3)
    m.admit("a")
    m.write_state("a", 0, torch.randn(4, 4, 8))
    saved = m.preempt("a")
    layers = [{k: v for k, v in layer.items() if k != "checkpoint_scale"} for layer in saved.tensors]
    before = m.pool.num_free
    with pytest.raises(ShapeError, match="checkpoint_scale"):
        m.resume("a", SavedState(saved.layout, tuple(layers), saved.cursors))
    assert m.pool.num_free == before
    wrong = [dict(layer, checkpoint_scale=layer["checkpoint_scale"].double()) for layer in saved.tensors]
    with pytest.raises(ShapeError, match="checkpoint_scale"):
        m.resume("a", SavedState(saved.layout, tuple(wrong), saved.cursors))
    m.resume("a", saved)
    layer0 = saved.tensors[0]
    assert torch.equal(m.read_state("a", 0), ref.read_checkpoint(layer0["checkpoint"], layer0["checkpoint_scale"], 0))


def test_device_page_ids_out_of_range_or_repeated_become_padding():
    """On a GPU the engine's page ids cannot be checked without a sync: a row whose id is out of range or repeats an
    earlier row's becomes a padding row, and reset_cursors skips such ids (the CPU path refuses them, above). The
    device branch is run here on CPU tensors by switching the manager's host-values flag off."""
    m = _mgr()
    pa, pb = m.page_of("a"), m.page_of("b")
    before = m.cache.cursors.clone()
    m._on_cpu = False
    try:
        i32 = dict(dtype=torch.int32)
        plan = m.begin_step_from_tensors(torch.tensor([pa, -3, 99, pa, pb], **i32),
                                         torch.tensor([0, 1, 2, 3, 4, 6], **i32), 6, 2)
        assert plan.page_ids.tolist() == [pa, 0, 0, 0, pb]
        want = before.clone()
        want[2, pa], want[2, pb] = 1, 2
        assert torch.equal(m.cache.cursors, want)
        m.rollback(plan)
        assert torch.equal(m.cache.cursors, before)
        m.reset_cursors(torch.tensor([-1, 99, 1 << 30], **i32))
        assert torch.equal(m.cache.cursors, before)
    finally:
        m._on_cpu = True
