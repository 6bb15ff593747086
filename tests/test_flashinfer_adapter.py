"""The FlashInfer adapter on CPU: availability errors, layout limits, argument plumbing.

No flashinfer and no GPU needed: a stand-in ``flashinfer.mamba`` records what the
adapter passes, and the checks that must not need flashinfer are run with the
real import blocked. The kernels themselves are tested in tests/gpu/.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from ssmstate import (
    BackendUnavailableError,
    ConfigError,
    Mamba2Geometry,
    PageLayout,
    ShapeError,
    SpecConfig,
    StateManager,
)
from ssmstate.backends import get_backend
from ssmstate.backends import flashinfer as fb
from ssmstate.ops import reference as ref
from ssmstate.plan import StepPlan


def geom(H=8, P=64, N=128, G=2, act="bf16", state="fp32", layers=1):
    return Mamba2Geometry(num_heads=H, head_dim=P, state_size=N, n_groups=G, conv_kernel=4, num_layers=layers,
                          act_dtype=act, state_dtype=state)


def nemotron_layout(scheme="replay", K=3, W=16):
    g = Mamba2Geometry(num_heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4, num_layers=2)
    s = SpecConfig(K, window=W)
    return PageLayout.replay(g, s) if scheme == "replay" else PageLayout.native(g, s)


@pytest.fixture
def no_flashinfer(monkeypatch):
    """Make ``import flashinfer`` fail, whatever is installed."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "flashinfer.mamba", None)


# -- import and layout limits ---------------------------------------------------------

def test_importing_the_backend_does_not_import_flashinfer():
    code = ("import sys, ssmstate; from ssmstate.backends import get_backend; "
            "b = get_backend('flashinfer'); assert b.name == 'flashinfer'; "
            "assert 'flashinfer' not in sys.modules, 'flashinfer imported eagerly'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("scheme", ["replay", "native"])
def test_nemotron_geometry_is_supported(scheme):
    assert fb.unsupported_reasons(nemotron_layout(scheme)) == []


@pytest.mark.parametrize("kwargs,spec,needle", [
    (dict(N=96), (3, 16), "state_size N=96 is not a multiple of 64"),
    (dict(N=32), (3, 16), "state_size N=32 is not a multiple of 64"),
    (dict(P=16), (3, 16), "head_dim P=16 < 32"),
    (dict(P=40), (3, 16), "head_dim P=40 is not a multiple of 16"),
    (dict(act="fp32"), (3, 16), "act_dtype=torch.float32"),
    (dict(), (3, 17), "window W=17 > 16"),
    (dict(), (15, 32), "window W=32 > 16"),
])
def test_replay_limits(kwargs, spec, needle):
    layout = PageLayout.replay(geom(**kwargs), SpecConfig(spec[0], window=spec[1]))
    reasons = fb.unsupported_reasons(layout)
    assert any(needle in r for r in reasons), reasons
    with pytest.raises(BackendUnavailableError) as ei:
        fb.check_layout(layout)
    msg = str(ei.value)
    assert needle in msg and "'reference'" in msg and "'triton'" in msg


def test_native_limits():
    g = geom(H=12, G=4)  # 3 heads per group
    reasons = fb.unsupported_reasons(PageLayout.native(g, SpecConfig(16, window=32)))
    assert any("T=1+K=17 > 16" in r for r in reasons), reasons
    assert any("H/G=3 is not a power of two" in r for r in reasons), reasons
    # the ring window does not limit the native scheme
    assert fb.unsupported_reasons(PageLayout.native(geom(), SpecConfig(3, window=32))) == []


def test_every_reason_is_reported_at_once():
    layout = PageLayout.replay(geom(P=16, N=96, act="fp32"), SpecConfig(3, window=20))
    msg = str(pytest.raises(BackendUnavailableError, fb.check_layout, layout).value)
    for needle in ("act_dtype", "N=96", "P=16", "W=20"):
        assert needle in msg


# -- availability -----------------------------------------------------------------------

def test_cpu_device_is_refused_after_layout_checks(no_flashinfer):
    with pytest.raises(BackendUnavailableError, match="needs a CUDA device, got cpu.*'reference'"):
        StateManager(nemotron_layout(), 4, device="cpu", backend="flashinfer")
    # a bad layout is reported before the device
    bad = PageLayout.replay(geom(N=96), SpecConfig(3))
    with pytest.raises(BackendUnavailableError, match="N=96"):
        StateManager(bad, 4, device="cpu", backend="flashinfer")


def test_missing_flashinfer_names_the_extra(no_flashinfer):
    with pytest.raises(BackendUnavailableError) as ei:
        fb.FlashInferBackend().check(nemotron_layout(), torch.device("cuda"))
    msg = str(ei.value)
    assert "flashinfer-python cannot be imported" in msg
    assert "flashinfer-python>=0.7.2" in msg and "'reference'" in msg and "'triton'" in msg
    with pytest.raises(BackendUnavailableError, match=r"\.\[flashinfer\]"):
        with fb.autotune([8]):
            pass


def _fake_flashinfer(monkeypatch, mamba: types.ModuleType) -> None:
    top = types.ModuleType("flashinfer")
    top.mamba = mamba
    mamba.__name__ = "flashinfer.mamba"
    monkeypatch.setitem(sys.modules, "flashinfer", top)
    monkeypatch.setitem(sys.modules, "flashinfer.mamba", mamba)


def test_old_flashinfer_without_ring_api(monkeypatch):
    old = types.ModuleType("flashinfer.mamba")
    old.selective_state_update = lambda *a, **k: None
    _fake_flashinfer(monkeypatch, old)
    with pytest.raises(BackendUnavailableError, match="no checkpointing_ssu ring API"):
        fb.import_flashinfer()

    def checkpointing_ssu(state, x, dt, A, B, C, out, old_x, old_B, old_dt, cache_buf_idx):
        return out

    older = types.ModuleType("flashinfer.mamba")
    older.checkpointing_ssu = checkpointing_ssu
    older.allocate_checkpointing_ssu_scratch = lambda *a: None
    _fake_flashinfer(monkeypatch, older)
    with pytest.raises(BackendUnavailableError, match="predates the ring API"):
        fb.import_flashinfer()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_gpu_missing_after_a_good_import(monkeypatch):
    _fake_flashinfer(monkeypatch, FakeMamba())
    with pytest.raises(BackendUnavailableError, match="CUDA is not available"):
        fb.FlashInferBackend().check(nemotron_layout(), torch.device("cuda"))


def test_algorithm_option_is_validated():
    b = fb.FlashInferBackend(algorithm="monolith")
    assert b.algorithm == "monolith"
    b.algorithm = "two-kernel"
    with pytest.raises(ConfigError, match="'auto', 'monolith', 'two-kernel'"):
        b.algorithm = "fastest"
    assert b.algorithm == "two-kernel"
    with pytest.raises(ConfigError):
        fb.FlashInferBackend(native_algorithm="vertical")
    assert get_backend("flashinfer").algorithm == "auto"


# -- plumbing, with a recording stand-in for flashinfer.mamba ----------------------------

class FakeMamba(types.ModuleType):
    """Records calls; its kernels run the reference on the views it is given (CPU)."""

    def __init__(self) -> None:
        super().__init__("flashinfer.mamba")
        self.calls: list[tuple[str, tuple, dict]] = []
        self.scratch_allocs: list[tuple] = []

    def allocate_checkpointing_ssu_scratch(self, batch_size, num_heads, num_predicted_tokens, max_window,
                                           dtype, device):
        self.scratch_allocs.append((batch_size, num_heads, num_predicted_tokens, max_window, dtype))
        tp, op = (num_predicted_tokens + 15) // 16 * 16, (max_window + 7) // 8 * 8
        return (torch.empty(batch_size, num_heads, 32, tp // 2, dtype=dtype, device=device),
                torch.empty(batch_size, num_heads, tp, dtype=torch.float32, device=device),
                torch.empty(batch_size, num_heads, 32, op // 2, dtype=dtype, device=device))

    def checkpointing_ssu(self, state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens,
                          x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_softplus=False,
                          state_batch_indices=None, pad_slot_id=-1, state_scale=None, rand_seed=None,
                          philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, enable_pdl=False,
                          cb_scaled=None, cumAdt_vec=None, cb_old=None, precompute_heads_per_cta=0,
                          algorithm="auto"):
        kw = dict(state=state, x_cache=x_cache, B_cache=B_cache, dt_cache=dt_cache, ring_start=ring_start,
                  pnat=prev_num_accepted_tokens, x=x, dt=dt, A=A, B=B, C=C, out=out, D=D, z=z, dt_bias=dt_bias,
                  dt_softplus=dt_softplus, sbi=state_batch_indices, pad_slot_id=pad_slot_id, cu=cu_seqlens,
                  max_seqlen=max_seqlen, cb_scaled=cb_scaled, cumAdt_vec=cumAdt_vec, cb_old=cb_old,
                  algorithm=algorithm, state_scale=state_scale, rand_seed=rand_seed)
        self.calls.append(("ckpt", (), kw))
        npred = max_seqlen if cu_seqlens is not None else x.shape[1]
        window = x_cache.shape[2] - npred
        H, P, N = state.shape[1:]
        rows = state_batch_indices.shape[0]
        cu = cu_seqlens if cu_seqlens is not None else torch.arange(0, (rows + 1) * npred, npred, dtype=torch.int32)
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
        ref.replay_verify(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens,
                          flat(x), flat(dt)[..., 0], A[:, 0, 0], flat(B), flat(C), state_batch_indices, cu, window,
                          out.view(-1, H, P), D=None if D is None else D[:, 0], z=None if z is None else flat(z),
                          dt_bias=None if dt_bias is None else dt_bias[:, 0], dt_softplus=dt_softplus,
                          checkpoint_scale=state_scale)  # (its rand_seed draws Philox bits: rounded to nearest here)
        return out

    def selective_state_update(self, state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False,
                               state_batch_indices=None, pad_slot_id=-1, state_scale=None, out=None,
                               disable_state_update=False, intermediate_states_buffer=None,
                               intermediate_state_indices=None, intermediate_state_scales=None, rand_seed=None,
                               philox_rounds=10, cache_steps=0, algorithm="auto", dst_state_batch_indices=None,
                               cu_seqlens=None, num_accepted_tokens=None, backend="auto"):
        kw = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, sbi=state_batch_indices,
                  dsbi=dst_state_batch_indices, pad_slot_id=pad_slot_id, out=out, cache_steps=cache_steps,
                  cu=cu_seqlens, nat=num_accepted_tokens.clone(), algorithm=algorithm)
        self.calls.append(("ssu", (), kw))
        return out


def make_manager(monkeypatch, scheme="replay", max_batch=6, sr=False, **gkw):
    fake = FakeMamba()
    _fake_flashinfer(monkeypatch, fake)
    g = geom(layers=2, **gkw)
    spec = SpecConfig(3, window=6)
    layout = PageLayout.replay(g, spec) if scheme == "replay" else PageLayout.native(g, spec)
    m = StateManager(layout, 12, device="cpu", backend="reference", max_batch=max_batch, stochastic_rounding=sr)
    m.backend = fb.FlashInferBackend()
    return m, fake


def inputs(m, L, gen, dt_dtype=torch.float32):
    g = m.geometry
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    act = g.act_dtype
    return dict(x=torch.randn(L, H, P, generator=gen).to(act), dt=torch.randn(L, H, generator=gen).to(dt_dtype),
                B=(torch.randn(L, G, N, generator=gen) * 0.3).to(act),
                C=(torch.randn(L, G, N, generator=gen) * 0.3).to(act), A=-(torch.rand(H, generator=gen) + 0.5))


def test_replay_dense_call_passes_the_cache_itself(monkeypatch):
    m, fake = make_manager(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    for r in ("a", "b", "c"):
        m.admit(r)
    plan = m.begin_step(["a", "b", "c"], 4, pad_to=5)
    assert plan.row_cursors is None  # checkpointing_ssu reads the pages' cursors: no per-step gather
    inp = inputs(m, plan.total_tokens, gen, dt_dtype=torch.bfloat16)
    H = m.geometry.heads_per_rank
    D, dtb = torch.randn(H), torch.randn(H).to(torch.bfloat16)
    out = m.verify(0, plan, **inp, D=D, dt_bias=dtb)
    kind, _, kw = fake.calls[-1]
    assert kind == "ckpt"
    t = m.cache.layers[0]
    for name, key in (("state", "checkpoint"), ("x_cache", "x_ring"), ("B_cache", "B_ring"), ("dt_cache", "dt_ring")):
        assert kw[name] is t[key]
    assert kw["ring_start"].data_ptr() == m.cache.ring_start.data_ptr()
    assert kw["pnat"].data_ptr() == m.cache.num_committed.data_ptr()
    assert kw["sbi"] is plan.page_ids and kw["pad_slot_id"] == 0 and kw["dt_softplus"] is True
    # dense: (rows, T, H, P) views of the caller's tensors, no varlen arguments
    rows, T, P = 5, 4, m.geometry.head_dim
    assert kw["cu"] is None and kw["max_seqlen"] is None
    assert kw["x"].shape == (rows, T, H, P) and kw["x"].data_ptr() == inp["x"].data_ptr()
    assert kw["out"].data_ptr() == out.data_ptr()
    assert kw["dt"].shape == (rows, T, H, P) and kw["dt"].stride()[2:] == (1, 0)
    assert kw["dt"].dtype == torch.bfloat16  # dt goes in as given
    assert kw["A"].stride() == (1, 0, 0) and kw["D"].stride() == (1, 0) and kw["dt_bias"].stride() == (1, 0)
    # D fp32 and dt_bias bf16 share one weight dtype in the kernel: both fp32
    assert kw["D"].dtype == kw["dt_bias"].dtype == torch.float32
    assert torch.equal(kw["dt_bias"][:, 0], dtb.float())
    # scratch sized once for max_batch, reused by the next layer (no allocation)
    assert fake.scratch_allocs == [(6, H, 4, 6, torch.bfloat16)]
    assert kw["cb_scaled"].shape[0] == 6
    m.verify(1, plan, **inputs(m, plan.total_tokens, gen), D=D, dt_bias=dtb)
    assert fake.calls[-1][2]["cb_scaled"].data_ptr() == kw["cb_scaled"].data_ptr()
    assert len(fake.scratch_allocs) == 1
    assert kw["algorithm"] == "auto"


@pytest.mark.parametrize("qs", [[1, 4, 2], [2, 2, 2]])
def test_replay_ragged_or_short_rows_go_varlen_with_max_seqlen_T(monkeypatch, qs):
    m, fake = make_manager(monkeypatch)
    m.backend.algorithm = "monolith"
    gen = torch.Generator().manual_seed(1)
    for r in ("a", "b", "c"):
        m.admit(r)
    plan = m.begin_step(["a", "b", "c"], qs if len(set(qs)) > 1 else qs[0])
    inp = inputs(m, plan.total_tokens, gen)
    m.verify(0, plan, **inp)
    kw = fake.calls[-1][2]
    L, H, P = plan.total_tokens, m.geometry.heads_per_rank, m.geometry.head_dim
    assert kw["cu"] is plan.cu_seqlens and kw["max_seqlen"] == 4  # T, never the longest row
    assert kw["x"].shape == (1, L, H, P) and kw["dt"].shape == (1, L, H, P)
    assert kw["D"] is None and kw["dt_bias"] is None and kw["algorithm"] == "monolith"


def test_replay_schedule_matches_reference(monkeypatch):
    """End to end on CPU through the stand-in: cursors and rings follow the reference exactly."""
    m, fake = make_manager(monkeypatch)
    r_m = StateManager(m.layout, 12, device="cpu", backend="reference", max_batch=6)
    gen = torch.Generator().manual_seed(2)
    ids = ["a", "b", "c", "d"]
    for mm in (m, r_m):
        for r in ids:
            mm.admit(r)
    import random
    rng = random.Random(0)
    for _ in range(10):
        rows = rng.sample(ids, rng.randint(1, 4))
        qs = [rng.randint(1, 4) for _ in rows] if rng.random() < 0.5 else 4
        plans = [mm.begin_step(rows, qs, pad_to=len(rows) + 1) for mm in (m, r_m)]
        for layer in range(2):
            inp = inputs(m, plans[0].total_tokens, gen)
            sentinel = torch.full((plans[0].total_tokens, 8, 64), 7.0, dtype=torch.bfloat16)
            ys = [mm.verify(layer, p, **inp, out=sentinel.clone()) for mm, p in zip((m, r_m), plans)]
            assert torch.equal(ys[0], ys[1])
        acc = [rng.randint(0, q) for q in plans[0].num_tokens[: len(rows)]]
        for mm, p in zip((m, r_m), plans):
            mm.commit(p, acc)
        assert torch.equal(m.cache.cursors, r_m.cache.cursors)
    for a, b in zip(m.cache.layers, r_m.cache.layers):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert len(fake.scratch_allocs) == 1


def test_native_call_reads_the_accepted_slot(monkeypatch):
    m, fake = make_manager(monkeypatch, scheme="native")
    gen = torch.Generator().manual_seed(3)
    for r in ("a", "b"):
        m.admit(r)
    plan = m.begin_step(["a", "b"], 4, pad_to=3)
    m.verify(0, plan, **inputs(m, plan.total_tokens, gen, dt_dtype=torch.bfloat16))
    m.verify(1, plan, **inputs(m, plan.total_tokens, gen, dt_dtype=torch.bfloat16))
    m.commit(plan, [2, 4])  # slots 1 and 3
    plan = m.begin_step(["a", "b"], [3, 1])
    inp = inputs(m, plan.total_tokens, gen, dt_dtype=torch.bfloat16)
    H = m.geometry.heads_per_rank
    m.verify(0, plan, **inp, dt_bias=torch.randn(H).bfloat16())
    kind, _, kw = fake.calls[-1]
    assert kind == "ssu"
    assert kw["nat"].tolist() == [2, 4]  # state_slot + 1: the kernel reads page_table[r, nat - 1]
    assert kw["sbi"] is plan.page_table and kw["dsbi"] is plan.page_table and kw["pad_slot_id"] == 0
    assert kw["cu"] is plan.cu_seqlens and kw["cache_steps"] == 4 and kw["x"].dim() == 3
    # dt, D, dt_bias share one dtype there: fp32; D=None becomes zeros
    assert kw["dt"].dtype == kw["D"].dtype == kw["dt_bias"].dtype == torch.float32
    assert kw["dt"].stride()[1:] == (1, 0) and torch.equal(kw["dt"][:, :, 0], inp["dt"].float())
    assert torch.count_nonzero(kw["D"]) == 0
    dense = fake.calls[0][2]  # first step, layer 0: uniform q = T
    assert dense["cu"] is None and dense["x"].shape == (3, 4, H, 64) and dense["nat"].tolist() == [1, 1, 1]


def test_bad_strides_raise_shape_error_and_change_nothing(monkeypatch):
    m, fake = make_manager(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    m.admit("a")
    plan = m.begin_step(["a"], 4)
    inp = inputs(m, plan.total_tokens, gen)
    before = [t.clone() for t in m.cache.layers[0].values()]
    x = inp["x"]
    wide = torch.zeros(x.shape[0], x.shape[1], x.shape[2] * 2, dtype=x.dtype)[:, :, ::2]
    wide.copy_(x)
    with pytest.raises(ShapeError, match="x needs its last two dims contiguous"):
        m.verify(0, plan, **{**inp, "x": wide})
    flat = torch.zeros(x.numel() + 1, dtype=x.dtype)
    shifted = flat[1:].view(x.shape)
    with pytest.raises(ShapeError, match="x must be 16-byte aligned"):
        m.verify(0, plan, **{**inp, "x": shifted})
    dt_t = torch.zeros(inp["dt"].shape[1], inp["dt"].shape[0]).t()
    with pytest.raises(ShapeError, match="dt needs unit stride over heads"):
        m.verify(0, plan, **{**inp, "dt": dt_t})
    assert fake.calls == []
    assert all(torch.equal(a, b) for a, b in zip(before, m.cache.layers[0].values()))
    m.verify(0, plan, **inp)  # still verifiable afterwards
    assert len(fake.calls) == 1


def test_tune_and_autotune_need_a_cuda_device(no_flashinfer):
    with pytest.raises(BackendUnavailableError, match="CUDA device"):
        fb.FlashInferBackend().tune(nemotron_layout(), "cpu", [8])


def test_plan_without_host_lengths_goes_dense_only_when_every_row_is_full(monkeypatch):
    """An engine-built plan may record ``max_seqlen`` for every row; the token count decides."""
    m, fake = make_manager(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    for r in ("a", "b", "c"):
        m.admit(r)
    pages = torch.tensor([m.page_of("a"), m.page_of("b"), 0], dtype=torch.int32)
    for cu_list, dense in (([0, 4, 8, 12], True), ([0, 4, 6, 6], False)):
        cu = torch.tensor(cu_list, dtype=torch.int32)
        L = cu_list[-1]
        plan = StepPlan(step_id=1, request_ids=(), num_tokens=(4, 4, 4), page_ids=pages,
                        page_table=pages[:, None].contiguous(), cu_seqlens=cu, page_ids_host=pages,
                        page_table_host=pages[:, None], cu_seqlens_host=cu, max_seqlen=4, total_tokens=L)
        m.cache.pending[pages[:2].long()] = torch.tensor([4, cu_list[2] - cu_list[1]], dtype=torch.int32)
        inp = inputs(m, L, gen)
        out = torch.zeros(L, 8, 64, dtype=torch.bfloat16)
        m.backend.verify(m.cache, 0, plan, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], None, None, None, out)
        kw = fake.calls[-1][2]
        if dense:
            assert kw["cu"] is None and kw["x"].shape[:2] == (3, 4)
        else:
            assert kw["cu"] is cu and kw["max_seqlen"] == 4 and kw["x"].shape[:2] == (1, 6)


@pytest.mark.parametrize("state,sr", [("int8", False), ("fp8", True), ("fp16", True)])
def test_replay_8bit_and_stochastic_rounding_arguments(monkeypatch, state, sr):
    """An 8-bit checkpoint goes in with its decode scales (the cache's own tensor) on the monolithic kernel; a
    stochastically rounding cache passes its device seed as ``rand_seed``."""
    m, fake = make_manager(monkeypatch, state=state, sr=sr)
    gen = torch.Generator().manual_seed(2)
    for r in ("a", "b"):
        m.admit(r)
    plan = m.begin_step(["a", "b"], 4)
    m.verify(0, plan, **inputs(m, plan.total_tokens, gen))
    kw = fake.calls[-1][2]
    t = m.cache.layers[0]
    if state in ("int8", "fp8"):
        assert kw["state_scale"] is t["checkpoint_scale"] and kw["algorithm"] == "monolith"
    else:
        assert kw["state_scale"] is None and kw["algorithm"] == "auto"
    assert kw["rand_seed"] is m.cache.checkpoint_seed if sr else kw["rand_seed"] is None


def test_replay_8bit_refusals_change_nothing(monkeypatch):
    """checkpointing_ssu has no two-kernel 8-bit path and rounds bf16 to nearest only: both refused, typed, before
    any call."""
    m, fake = make_manager(monkeypatch, state="int8")
    m.backend.algorithm = "two-kernel"
    gen = torch.Generator().manual_seed(3)
    m.admit("a")
    plan = m.begin_step(["a"], 4)
    before = {k: v.clone() for k, v in m.cache.layers[0].items()}
    with pytest.raises(BackendUnavailableError, match="two-kernel"):
        m.verify(0, plan, **inputs(m, plan.total_tokens, gen))
    assert not fake.calls and all(torch.equal(before[k], v) for k, v in m.cache.layers[0].items())
    m2, fake2 = make_manager(monkeypatch, state="bf16", sr=True)
    m2.admit("a")
    plan2 = m2.begin_step(["a"], 4)
    with pytest.raises(BackendUnavailableError, match="rounds a torch.bfloat16 checkpoint to nearest"):
        m2.verify(0, plan2, **inputs(m2, plan2.total_tokens, gen))
    assert not fake2.calls
