"""Geometry, layout byte math, page pool, and the manager's refusals."""

from __future__ import annotations

import json

import pytest
import torch

import ssmstate
from ssmstate import (
    CapacityError,
    ConfigError,
    LifecycleError,
    Mamba2Geometry,
    PageLayout,
    PagePool,
    ShapeError,
    SpecConfig,
    SSMStateError,
    StateCache,
    StateManager,
    UnknownRequestError,
)
from ssmstate.geometry import PRESETS, load_model


# -- geometry ---------------------------------------------------------------------

def test_presets_match_published_facts():
    g = Mamba2Geometry.from_pretrained("nemotron-h-8b")
    assert (g.num_heads, g.head_dim, g.state_size, g.n_groups, g.conv_kernel, g.num_layers) == (128, 64, 128, 8, 4, 24)
    assert g.conv_dim == 128 * 64 + 2 * 8 * 128 == 10240
    assert Mamba2Geometry.from_pretrained("nemotron-nano-9b-v2").num_layers == 27
    assert Mamba2Geometry.from_pretrained("nemotron-3-nano-30b-a3b").num_heads == 64
    assert Mamba2Geometry.from_pretrained("nemotron-3-super-120b").num_layers == 40
    m = load_model("nemotron-h-8b")
    assert m.attention is not None and m.attention.num_layers == 4
    assert m.attention.kv_bytes_per_token() == 4 * 2 * 8 * 128 * 2


def test_from_pretrained_reads_config_json(tmp_path):
    cfg = dict(PRESETS["nemotron-h-8b"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = Mamba2Geometry.from_pretrained(tmp_path)
    b = Mamba2Geometry.from_pretrained(tmp_path / "config.json", tp_size=2)
    assert a == Mamba2Geometry.from_pretrained("nemotron-h-8b")
    assert b.heads_per_rank == 64 and b.groups_per_rank == 4 and b.conv_dim_per_rank == 5120
    mamba2 = {"model_type": "mamba2", "num_heads": 80, "head_dim": 64, "state_size": 128, "n_groups": 1,
              "conv_kernel": 4, "num_hidden_layers": 64, "hidden_size": 2560}
    (tmp_path / "m2.json").write_text(json.dumps(mamba2))
    g = Mamba2Geometry.from_pretrained(tmp_path / "m2.json")
    assert (g.num_heads, g.num_layers, g.n_groups) == (80, 64, 1)


@pytest.mark.parametrize("bad", ["no-such-model", "/nonexistent/config.json"])
def test_unknown_model_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="unknown model"):
        Mamba2Geometry.from_pretrained(bad)


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="tp_size"):
        Mamba2Geometry.from_pretrained("nemotron-h-8b", tp_size=16)
    with pytest.raises(ConfigError, match="n_groups"):
        Mamba2Geometry(6, 8, 16, 4, 4, 1)
    with pytest.raises(ConfigError):
        Mamba2Geometry(0, 8, 16, 1, 4, 1)
    with pytest.raises(ConfigError, match="unknown dtype"):
        Mamba2Geometry(4, 8, 16, 1, 4, 1, state_dtype="int3")
    with pytest.raises(ConfigError, match="window"):
        SpecConfig(4, window=4)
    with pytest.raises(ConfigError):
        SpecConfig(-1)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="not a supported hybrid Mamba2 model"):
        load_model(tmp_path)


# -- layout -----------------------------------------------------------------------

@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("K", [0, 3, 7])
def test_layout_formulas(preset, K):
    g = Mamba2Geometry.from_pretrained(preset)
    spec = SpecConfig(K, window=16)
    H, P, N, G, L, k = g.num_heads, g.head_dim, g.state_size, g.n_groups, g.num_layers, g.conv_kernel
    R = 16 + 1 + K
    replay = PageLayout.replay(g, spec)
    native = PageLayout.native(g, spec)
    assert replay.bytes_per_request == L * (H * P * N * 4 + g.conv_dim * (k + K) * 2 + R * (H * P + G * N) * 2 + R * H * 4)
    assert native.bytes_per_request == (1 + K) * L * (H * P * N * 4 + g.conv_dim * (k - 1 + K) * 2)
    assert replay.pages_per_request == 1 and native.pages_per_request == 1 + K


def test_vllm_native_page_matches_published_number():
    # vLLM 0.33.0's native Mamba page for Nemotron-H-8B at K=3: 128*64*128*4 (fp32 state) + 10240*6*2 (bf16 conv
    # window, 3 + K columns) = 4,317,184 bytes per layer (docs/capacity.md, "By hand"; tests/test_planner.py checks
    # layer_page_bytes against vLLM's own MambaSpec).
    g = Mamba2Geometry.from_pretrained("nemotron-h-8b")
    assert PageLayout.native(g, SpecConfig(3)).layer_page_bytes == 4_317_184
    ratio = PageLayout.native(g, SpecConfig(3)).bytes_per_request / PageLayout.replay(g, SpecConfig(3)).bytes_per_request
    print(f"nemotron-h-8b K=3 fp32 Mamba-state ratio native/replay = {ratio:.3f}")
    assert ratio >= 3.5


@pytest.mark.parametrize("scheme", ["replay", "native"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_layout_bytes_equal_allocated_bytes(scheme, state_dtype):
    g = Mamba2Geometry(8, 16, 32, 2, 4, 3, state_dtype=state_dtype, tp_size=2)
    layout = getattr(PageLayout, scheme)(g, SpecConfig(2, window=5))
    cache = StateCache(layout, 7, "cpu")
    assert cache.nbytes == layout.pool_bytes(7) == 7 * layout.allocated_bytes_per_page
    for layer in cache.layers:
        for spec in layout.tensors:
            t = layer[spec.name]
            assert t.shape == (7, *spec.shape) and t.dtype == spec.dtype and spec.is_laid_out(t)
            assert t.numel() * t.element_size() == 7 * spec.nbytes
    assert layout.max_requests(layout.pool_bytes(7)) == 6 // layout.pages_per_request
    # the conv window is stored channels innermost: every page's column is contiguous
    Dc, width = g.conv_dim_per_rank, layout.conv_width
    conv = cache.layers[0]["conv"]
    assert conv.stride() == (width * Dc, 1, Dc) and conv[3, :, 2].is_contiguous()
    assert [t["stored"] for t in layout.describe()["tensors"]][-1] == [1, 0]


def _views(layout: PageLayout, pages: int, page_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Every layer's tensors carved out of raw byte pages the way an engine's pages are (TensorSpec.view)."""
    views = []
    for _ in range(layout.geometry.num_layers):
        raw, off, layer = torch.zeros((pages, page_bytes), dtype=torch.int8), 0, {}
        for spec in layout.tensors:
            layer[spec.name] = spec.view(raw[:, off: off + spec.nbytes])
            off += spec.nbytes
        views.append(layer)
    return views


@pytest.mark.parametrize("scheme", ["replay", "native"])
def test_from_tensors_requires_the_layout_strides(scheme):
    g = Mamba2Geometry(4, 8, 16, 1, 4, 2, act_dtype="bf16", state_dtype="fp32")
    layout = getattr(PageLayout, scheme)(g, SpecConfig(2, window=4))
    pages, cursors = 5, torch.zeros((4, 5), dtype=torch.int32)
    views = _views(layout, pages, layout.layer_page_bytes + 64)
    cache = StateCache.from_tensors(layout, views, cursors)  # engine pages, padded: accepted
    assert cache.layers[1]["conv"] is views[1]["conv"]
    Dc, width = g.conv_dim_per_rank, layout.conv_width
    row_major = torch.zeros((pages, Dc, width), dtype=g.conv_state_dtype)  # the right shape, the wrong order
    overlapping = views[1]["conv"].as_strided(views[1]["conv"].shape, (Dc, 1, Dc))  # pages share bytes
    for bad, got in ((row_major, (Dc * width, width, 1)), (overlapping, (Dc, 1, Dc))):
        layers = [dict(layer) for layer in views]
        layers[1]["conv"] = bad
        before = [t.clone() for layer in views for t in layer.values()]
        with pytest.raises(ShapeError) as exc:
            StateCache.from_tensors(layout, layers, cursors)
        msg = str(exc.value)
        assert "layer 1 conv" in msg and f"got strides {got}" in msg and f"expected {(1, Dc)}" in msg, msg
        assert all(torch.equal(a, b) for a, b in zip(before, (t for layer in views for t in layer.values())))


def test_tensor_spec_order():
    from ssmstate.layout import TensorSpec, conv_spec

    spec = conv_spec(6, 5, torch.bfloat16)
    assert spec.stored_shape == (5, 6) and spec.page_strides == (1, 6)
    assert TensorSpec("a", (2, 3, 4), torch.float32).page_strides == (12, 4, 1)
    t = spec.zeros(3, "cpu")
    assert t.shape == (3, 6, 5) and t.stride() == (30, 1, 6) and spec.stored_view(t).is_contiguous()
    assert spec.from_stored(spec.stored_view(t)).stride() == t.stride()
    raw = torch.arange(3 * 80, dtype=torch.int16).view(torch.int8).view(3, 160)[:, 20: 20 + spec.nbytes]
    v = spec.view(raw)
    assert v.stride() == (80, 1, 6) and v.data_ptr() == raw.data_ptr()
    # a dim of size 1 may have any stride (torch calls such a tensor contiguous whatever it is)
    one = TensorSpec("B_ring", (1, 3, 4), torch.float32)
    assert one.is_laid_out(torch.zeros(24).as_strided((2, 1, 3, 4), (12, 999, 4, 1)))
    assert not one.is_laid_out(torch.zeros(2, 1, 4, 3).transpose(2, 3))
    assert not spec.is_laid_out(torch.zeros(3, 6, 5))  # row-major: not the conv window's order
    with pytest.raises(ConfigError, match="permutation"):
        TensorSpec("a", (2, 3), torch.float32, stored=(0, 0))


# -- pool -------------------------------------------------------------------------

def test_pool_fill_and_drain():
    pool = PagePool(9)
    start = pool.num_free
    assert start == 8 and pool.can_allocate(8) and not pool.can_allocate(9)
    got = [pool.allocate(3), pool.allocate(5)]
    assert 0 not in sum(got, []) and sorted(sum(got, [])) == list(range(1, 9))
    with pytest.raises(CapacityError) as exc:
        pool.allocate(1)
    assert exc.value.required == 1 and exc.value.available == 0
    for pages in got:
        pool.free(pages)
    assert pool.num_free == start
    with pytest.raises(SSMStateError, match="double free"):
        pool.free([3])
    with pytest.raises(SSMStateError, match="null page"):
        pool.free([0])
    with pytest.raises(SSMStateError):
        pool.free([4, 4])
    assert pool.num_free == start


# -- manager refusals change nothing -------------------------------------------------

def _snapshot(m: StateManager):
    return [t.clone() for layer in m.cache.layers for t in layer.values()] + [m.cache.cursors.clone()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def mgr():
    g = Mamba2Geometry(4, 4, 8, 2, 4, 2, act_dtype=torch.float32)
    m = StateManager(PageLayout.replay(g, SpecConfig(2, window=4)), num_pages=4)
    m.admit("a")
    m.admit("b")
    return m


def _inputs(m, L):
    g = m.geometry
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    return (torch.randn(L, H, P), torch.randn(L, H), torch.randn(L, G, N), torch.randn(L, G, N), -torch.rand(H) - 0.5)


def test_bad_calls_raise_and_change_nothing(mgr):
    m = mgr
    plan = m.begin_step(["a", "b"], [3, 2])
    x, dt, B, C, A = _inputs(m, 5)
    m.verify(0, plan, x, dt, B, C, A)
    snap = _snapshot(m)
    bad_calls = [
        (LifecycleError, lambda: m.verify(0, plan, x, dt, B, C, A)),               # layer twice
        (SSMStateError, lambda: m.verify(2, plan, x, dt, B, C, A)),                # layer out of range
        (ShapeError, lambda: m.verify(1, plan, x[:4], dt, B, C, A)),               # wrong shape
        (ShapeError, lambda: m.verify(1, plan, x.double(), dt, B, C, A)),          # wrong dtype
        (ShapeError, lambda: m.verify(1, plan, x, dt, B, C, A[:3])),
        (LifecycleError, lambda: m.commit(plan, [1, 1])),                          # layer 1 not verified
        (LifecycleError, lambda: m.begin_step(["a"], 1)),                          # step still open
        (LifecycleError, lambda: m.release("a")),                                  # in a step
        (LifecycleError, lambda: m.materialize(["b"])),
        (LifecycleError, lambda: m.preempt("a")),
        (LifecycleError, lambda: m.read_state("a", 0)),
        (LifecycleError, lambda: m.admit("a")),                                    # duplicate admit
        (UnknownRequestError, lambda: m.release("zzz")),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
        assert _same(snap, _snapshot(m)), exc
    m.verify(1, plan, x, dt, B, C, A)
    snap = _snapshot(m)
    for bad in ([4, 1], [-1, 1], [1], [1, 1, 1, 1], [1.5, 1]):
        with pytest.raises(SSMStateError):
            m.commit(plan, bad)
        assert _same(snap, _snapshot(m))
    m.commit(plan, [3, 0])
    with pytest.raises(LifecycleError, match="already committed"):
        m.commit(plan, [1, 1])
    with pytest.raises(LifecycleError):
        m.rollback(plan)


def test_begin_step_refusals(mgr):
    m = mgr
    snap = _snapshot(m)
    for call in (lambda: m.begin_step([], 1), lambda: m.begin_step(["a"], 4), lambda: m.begin_step(["a"], 0),
                 lambda: m.begin_step(["a", "a"], 1), lambda: m.begin_step(["a", "x"], 1),
                 lambda: m.begin_step(["a"], [1, 2]), lambda: m.begin_step(["a"], 1, pad_to=99)):
        with pytest.raises(SSMStateError):
            call()
        assert _same(snap, _snapshot(m)) and m.open_step is None


def test_device_tensor_commit_out_of_range_rolls_back(mgr):
    """A CPU-tensor commit is checked on the host; the device path is exercised by the same kernel."""
    m = mgr
    from ssmstate.ops import reference as ref
    plan = m.begin_step(["a", "b"], [2, 2])
    x, dt, B, C, A = _inputs(m, 4)
    for layer in range(2):
        m.verify(layer, plan, x, dt, B, C, A)
    before = m.cache.cursors.clone()
    ref.replay_commit(m.cache.ring_start, m.cache.num_committed, m.cache.pending, m.cache.conv_shift,
                      plan.page_ids, torch.tensor([1, 3], dtype=torch.int32), 4, 7, False, m.error_flag)
    # rolled back as a whole: nothing committed, pending cleared
    assert torch.equal(m.cache.num_committed, before[1]) and int(m.cache.pending.sum()) == 0
    m._close(plan)
    with pytest.raises(ssmstate.DeviceCommitError):
        m.raise_device_errors()
    m.raise_device_errors()  # flag cleared


def test_write_state_needs_materialize(mgr):
    m = mgr
    plan = m.begin_step(["a"], 2)
    x, dt, B, C, A = _inputs(m, 2)
    for layer in range(2):
        m.verify(layer, plan, x, dt, B, C, A)
    m.commit(plan, [2])
    with pytest.raises(LifecycleError, match="materialize"):
        m.write_state("a", 0, torch.zeros(4, 4, 8))
    m.materialize(["a"])
    m.write_state("a", 0, torch.ones(4, 4, 8))
    assert torch.equal(m.read_state("a", 0), torch.ones(4, 4, 8))
    with pytest.raises(ShapeError):
        m.write_state("a", 0, torch.ones(4, 4, 7))


def test_rollback_without_verify_and_preempt_resume_exact(mgr):
    m = mgr
    plan = m.begin_step(["a", "b"], 3)
    m.rollback(plan)
    assert int(m.cache.pending.sum()) == 0
    m.write_state("b", 1, torch.randn(4, 4, 8), torch.randn(m.geometry.conv_dim, 3))
    page_b = m.page_of("b")
    before = [t[page_b].clone() for layer in m.cache.layers for t in layer.values()]
    saved = m.preempt("b")
    assert m.pool.num_free == 2
    assert all(spec.is_laid_out(layer[spec.name]) for layer in saved.tensors for spec in m.layout.tensors)
    m.admit("c")
    page = m.resume("b", saved)
    after = [t[page].clone() for layer in m.cache.layers for t in layer.values()]
    assert all(torch.equal(x, y) for x, y in zip(before, after))
    with pytest.raises(CapacityError):
        m.admit("d")
    with pytest.raises(SSMStateError, match="different layout"):
        other = StateManager(PageLayout.replay(m.geometry, SpecConfig(1, window=4)), 3)
        other.resume("b", saved)


def test_backend_registry_errors():
    g = Mamba2Geometry(4, 4, 8, 2, 4, 1)
    with pytest.raises(ssmstate.BackendUnavailableError, match="unknown backend"):
        StateManager(PageLayout.replay(g, SpecConfig(1)), 3, backend="cuda-magic")


def test_commit_host_and_device_paths_agree():
    """The numpy path used for CPU tensors and the torch path used on GPUs implement one rule."""
    from ssmstate.ops import reference as ref
    g = torch.Generator().manual_seed(0)
    W, R, pages = 6, 10, 12
    for trial in range(200):
        cur = torch.stack([torch.randint(0, R, (pages,), generator=g), torch.randint(0, W + 1, (pages,), generator=g),
                           torch.randint(1, 5, (pages,), generator=g), torch.randint(0, 5, (pages,), generator=g)]).int()
        rows = torch.randperm(pages - 1, generator=g)[:5].int() + 1
        rows[torch.randint(0, 5, (1,), generator=g)] = 0  # a padding row
        q = cur[2][rows.long()]
        acc = (torch.rand(5, generator=g) * (q + 1).float()).int()
        if trial % 7 == 0:
            acc[1] = q[1] + 1  # out of range: the whole step commits 0
        outs = []
        for fn in (ref.replay_commit_host, ref.replay_commit_torch):
            c = cur.clone()
            flag = torch.zeros(1, dtype=torch.int32)
            args = (c[0], c[1], c[2], c[3], rows, acc, W, R, trial % 2 == 0, flag)
            fn(*[a.numpy() if isinstance(a, torch.Tensor) and fn is ref.replay_commit_host else a for a in args])
            outs.append((c, flag))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), trial
        assert torch.equal(outs[0][0][:, 0], cur[:, 0])  # page 0 untouched


def test_step_gathers_row_cursors(mgr):
    """``StepPlan.row_cursors``: each row's page's (ring_start, num_committed) when the step began, padding rows
    included (page 0's), for host- and engine-built steps; ``reset_cursors`` on an open step gathers them again;
    the reference checks them on every verify. The native scheme has none."""
    m = mgr
    x, dt, B, C, A = _inputs(m, 9)
    for accepted in ([3, 1], [2, 3], [1, 2]):  # cursors move: appended rows, then a flush
        plan = m.begin_step(["a", "b"], 3, pad_to=3)
        want = m.cache.cursors[:2, plan.page_ids.long()]
        assert plan.row_cursors.dtype == torch.int32 and torch.equal(plan.row_cursors, want)
        for layer in range(2):
            m.verify(layer, plan, x, dt, B, C, A)
        m.commit(plan, accepted)
    assert int(m.cache.num_committed[m.page_of("a")]) > 0
    plan = m.begin_step_from_tensors(torch.tensor([m.page_of("b"), 0], dtype=torch.int32),
                                     torch.tensor([0, 2, 2], dtype=torch.int32), 2, 3)
    assert torch.equal(plan.row_cursors, m.cache.cursors[:2, plan.page_ids.long()])
    m.reset_cursors(torch.tensor([m.page_of("b")], dtype=torch.int32))
    assert plan.row_cursors[:, 0].tolist() == [0, 0]
    m.verify(0, plan, x[:2], dt[:2], B[:2], C[:2], A)  # the reference's check passes
    m.cache.num_committed[m.page_of("b")] = 1  # a cursor moved behind the manager's back: refused
    with pytest.raises(LifecycleError, match="stale"):
        m.verify(1, plan, x[:2], dt[:2], B[:2], C[:2], A)
    native = StateManager(PageLayout.native(m.geometry, SpecConfig(2)), num_pages=4)
    native.admit("a")
    assert native.begin_step(["a"], 1).row_cursors is None
