"""The FlashInfer backend's tuning on CPU: the profile calls carry what the served calls carry.

FlashInfer keys its autotuned tactics on the call's dtypes, on which optional tensors are present and on the
batch bucket; a profile call that differs from the served one tunes an entry no served call finds. What is under
test here is our argument building, so FlashInfer itself is replaced at its boundary only: the recording
stand-in ``FakeMamba`` of tests/test_flashinfer_adapter.py (which runs the reference on the views it gets)
captures the keyword arguments of ``checkpointing_ssu``, and the served call and the profile call are compared.
The kernels and the timing are exercised on the GPU (tests/gpu/test_flashinfer_gpu.py, benchmarks).
"""

from __future__ import annotations

import contextlib

import torch

from ssmstate.backends import flashinfer_tune as ft
from tests.test_flashinfer_adapter import make_manager

#: first dims FlashInfer's key does not see: the cache tensors' page count (it profiles batch + 1 pages) and the
#: scratch trio's rows (the backend's scratch is sized for max_batch; the key maps them to x's batch bucket)
UNKEYED_DIM0 = ("state", "x_cache", "B_cache", "dt_cache", "ring_start", "pnat", "cb_scaled", "cumAdt_vec", "cb_old")


def signature(kw: dict) -> dict:
    """What FlashInfer's JIT build and tactic cache see of one ``checkpointing_ssu`` call, plus the strides."""
    sig = {}
    for k, v in kw.items():
        if isinstance(v, torch.Tensor):
            shape, stride = tuple(v.shape), tuple(v.stride())
            if k in UNKEYED_DIM0:
                shape, stride = shape[1:], stride[1:]
            sig[k] = (v.dtype, shape, stride)
        else:
            sig[k] = v
    return sig


def served_call(m, rows: int, gen: torch.Generator) -> dict:
    """A decode verify as the vLLM plugin issues it (ssmstate/integrations/vllm.py ``ssmstate_decode``): x, B, C
    views of the conv output, dt a model-dtype slice of the projection, D and dt_bias model-dtype parameters."""
    g = m.geometry
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    ids = [f"r{i}" for i in range(rows)]
    for r in ids:
        m.admit(r)
    plan = m.begin_step(ids, m.layout.spec.num_tokens)
    L = plan.total_tokens
    proj = torch.randn(L, H * P + 2 * G * N + H, generator=gen).to(g.act_dtype)
    _xBC, dt = torch.split(proj, [H * P + 2 * G * N, H], dim=-1)
    conv_out = torch.randn(L, H * P + 2 * G * N, generator=gen).to(g.act_dtype)  # what m.conv returns
    x, B, C = torch.split(conv_out, [H * P, G * N, G * N], dim=-1)
    D, dtb = torch.ones(H, dtype=g.act_dtype), torch.ones(H, dtype=g.act_dtype)
    A = -(torch.rand(H, generator=gen) + 0.5)
    out = torch.empty(L, H, P, dtype=g.act_dtype)
    m.verify(0, plan, x.reshape(L, H, P), dt.contiguous(), B.reshape(L, G, N), C.reshape(L, G, N), A, D=D,
             dt_bias=dtb, out=out)
    return m.backend._fim.calls[-1][2]


def profile_call(m, rows: int, call: ft.CallShape, gen: torch.Generator) -> dict:
    """The call ``tune()`` makes inside FlashInfer's autotune block, built on CPU."""
    be = m.backend
    priv, _ = ft.private_cache(m.layout, [rows], torch.device("cpu"), 0, gen)
    with be.forcing("auto"):
        be.run_probe(priv, ft.probe(m.layout, call, "dense", rows, 1, torch.device("cpu"), gen), 0)
    return be._fim.calls[-1][2]


def test_profile_call_matches_the_served_call(monkeypatch):
    m, fake = make_manager(monkeypatch, max_batch=4)
    m.backend._fim = fake
    gen = torch.Generator().manual_seed(0)
    served = served_call(m, 3, gen)
    tuned = profile_call(m, 3, ft.CallShape.vllm(m.layout), gen)
    assert served["D"] is not None and served["dt_bias"] is not None and served["cu"] is None
    assert signature(tuned) == signature(served)
    assert tuned["algorithm"] == served["algorithm"] == "auto"  # both go through FlashInfer's tuner


def test_a_profile_without_D_and_dt_bias_would_miss(monkeypatch):
    """The old profile (D and dt_bias left out) differs from the served call where FlashInfer keys its cache."""
    m, fake = make_manager(monkeypatch, max_batch=4)
    m.backend._fim = fake
    gen = torch.Generator().manual_seed(1)
    served = signature(served_call(m, 2, gen))
    act = m.geometry.act_dtype
    old = signature(profile_call(m, 2, ft.CallShape(D=None, dt_bias=None, dt=torch.float32, packed=False), gen))
    assert {k for k in served if served[k] != old[k]} >= {"D", "dt_bias", "dt", "x", "B", "C"}
    # dtypes alone also change the key: fp32 D/dt_bias build another JIT module than model-dtype ones
    f32 = signature(profile_call(m, 2, ft.CallShape(D=torch.float32, dt_bias=act, dt=act), gen))
    assert f32["D"] != served["D"]


def test_varlen_probe_goes_varlen_with_the_bucket_rows(monkeypatch):
    m, fake = make_manager(monkeypatch, max_batch=4)
    m.backend._fim = fake
    gen = torch.Generator().manual_seed(2)
    priv, _ = ft.private_cache(m.layout, [3], torch.device("cpu"), 0, gen)
    pr = ft.probe(m.layout, ft.CallShape.vllm(m.layout), "varlen", 3, 1, torch.device("cpu"), gen)
    with m.backend.forcing("two-kernel"):
        m.backend.run_probe(priv, pr, 0)
    kw = fake.calls[-1][2]
    assert kw["cu"] is not None and kw["max_seqlen"] == 4 and kw["sbi"].shape == (3,)
    assert kw["algorithm"] == "two-kernel"


def test_served_calls_pass_the_tuned_choice(monkeypatch):
    m, fake = make_manager(monkeypatch, max_batch=8)
    be = m.backend
    be._fim = fake
    be.chosen.update({("dense", 2): "monolith", ("dense", 8): "two-kernel", ("varlen", 8): "monolith"})
    assert be.algorithm_for("dense", 1) == "monolith"  # the smallest tuned batch above
    assert be.algorithm_for("dense", 2) == "monolith"
    assert be.algorithm_for("dense", 3) == "two-kernel"
    assert be.algorithm_for("dense", 64) == "two-kernel"  # past the largest: the largest
    assert be.algorithm_for("varlen", 1) == "monolith"
    be.algorithm = "two-kernel"  # a forced algorithm wins
    assert be.algorithm_for("dense", 2) == "two-kernel"
    be.algorithm = "auto"
    gen = torch.Generator().manual_seed(3)
    assert served_call(m, 2, gen)["algorithm"] == "monolith"
    be.chosen.clear()
    assert be.algorithm_for("dense", 2) == "auto"  # untuned: FlashInfer's own choice


def test_fastest_prefers_the_earlier_candidate_on_a_tie():
    assert ft.fastest({"auto": 5.0, "monolith": 4.0, "two-kernel": 4.5}) == "monolith"
    assert ft.fastest({"auto": 4.0, "monolith": 4.0}) == "auto"


def test_tune_flow_times_every_candidate_and_keeps_the_fastest(monkeypatch):
    """``flashinfer_tune.tune`` (what ``FlashInferBackend.tune`` runs after its device checks) on CPU: FlashInfer's
    autotune block sees one dense served-shape call per size, every (form, size) is timed on each of its
    candidates (the GPU timer is replaced by one that reads which algorithm the probe passed), the fastest is
    kept, and later served calls pass it."""
    import contextlib

    m, fake = make_manager(monkeypatch, max_batch=4)
    be = m.backend
    be._fim = fake
    inside: list[str] = []

    @contextlib.contextmanager
    def autotune(sizes, cache):
        n = len(fake.calls)
        yield
        inside.extend(kw["algorithm"] for _, _, kw in fake.calls[n:])

    fake_us = {("dense", 1): {"auto": 3.0, "monolith": 2.0, "two-kernel": 4.0},
               ("dense", 4): {"auto": 1.0, "monolith": 2.0, "two-kernel": 3.0},
               ("varlen", 1): {"monolith": 5.0, "two-kernel": 4.0},
               ("varlen", 4): {"monolith": 1.0, "two-kernel": 4.0}}

    def time_us(fns, reps=10):
        n = len(fake.calls)
        fns[0]()
        kw = fake.calls[n][2]
        form = "dense" if kw["cu"] is None else "varlen"
        return fake_us[(form, kw["sbi"].shape[0])][kw["algorithm"]]

    monkeypatch.setattr(be, "autotune", autotune)
    monkeypatch.setattr(ft, "time_us", time_us)
    report = ft.tune(be, m.layout, torch.device("cpu"), [1, 4], None, ft.CallShape.vllm(m.layout), 0, 1)
    assert inside == ["auto", "auto"]  # one profile call per size, through FlashInfer's tuner
    got = {(r["form"], r["batch"]): r["chosen"] for r in report}
    assert got == {("dense", 1): "monolith", ("dense", 4): "auto", ("varlen", 1): "two-kernel",
                   ("varlen", 4): "monolith"}
    assert {(r["form"], r["batch"]): r["us"] for r in report} == fake_us
    be.chosen.update(got)
    gen = torch.Generator().manual_seed(4)
    assert served_call(m, 1, gen)["algorithm"] == "monolith"


def test_8bit_checkpoints_take_the_monolith_whatever_was_tuned(monkeypatch):
    """checkpointing_ssu's 8-bit kernel is monolithic only: a tuned or forced (probe) "two-kernel" choice never
    reaches an int8 call, and tuning an int8 layout times the monolith alone."""
    m, fake = make_manager(monkeypatch, max_batch=4, state="int8")
    be = m.backend
    be._fim = fake
    be.chosen.update({("dense", 4): "two-kernel", ("varlen", 4): "two-kernel"})
    assert be.algorithm_for("dense", 2, quantized=True) == "monolith"
    gen = torch.Generator().manual_seed(5)
    kw = served_call(m, 2, gen)
    assert kw["algorithm"] == "monolith" and kw["state_scale"] is m.cache.layers[0]["checkpoint_scale"]
    with be.forcing("two-kernel"):
        assert be.algorithm_for("dense", 2) == "two-kernel"
        assert be.algorithm_for("dense", 2, quantized=True) == "monolith"
    monkeypatch.setattr(be, "autotune", lambda sizes, cache: contextlib.nullcontext())
    monkeypatch.setattr(ft, "time_us", lambda fns, reps=10: (fns[0](), 1.0)[1])
    n = len(fake.calls)
    report = ft.tune(be, m.layout, torch.device("cpu"), [1], None, ft.CallShape.vllm(m.layout), 0, 1)
    assert [(r["form"], r["us"], r["chosen"]) for r in report] == [("dense", {"monolith": 1.0}, "monolith"),
                                                                  ("varlen", {"monolith": 1.0}, "monolith")]
    assert {kw["algorithm"] for _, _, kw in fake.calls[n:]} == {"monolith"}


def test_a_tuner_miss_says_where_the_keys_differ():
    """``key_mismatch``: on a miss, the tune report says how many entries the op has in FlashInfer's tuner and
    where the closest one's key differs from the served call's (the positions of a shape that differ)."""
    import collections

    Key = collections.namedtuple("Key", ("custom_op", *ft.KEY_FIELDS))
    prof = ((8, 4, 128, 64), (8, 4, 128), (-1, 128, 64, 128))
    stored = [Key("checkpointing_ssu", "R", 1, prof, ("e",)), Key("checkpointing_ssu", "R", 2, prof, ("f",)),
              Key("other_op", "R", 1, prof, ())]
    served = Key("checkpointing_ssu", "R", 1, ((8, 4, 128, 64), (8, 4, 64), (-1, 128, 64, 128)), ("e",))
    why = ft.key_mismatch(served, stored)
    assert why.startswith("2 tuned entries for checkpointing_ssu; the closest differs in nearest_profile[1]")
    assert "stored [(8, 4, 128)] served [(8, 4, 64)]" in why and "runner_hash" not in why
    assert ft.key_mismatch(Key("checkpointing_ssu", "S", 1, prof, ()), stored).count("runner_class_name") == 1
    assert ft.key_mismatch(served, stored[2:]) == "no tuned entry for checkpointing_ssu (of 1 in the tuner): " \
                                                 "its profiling stored none"
    assert "rejected on lookup" in ft.key_mismatch(stored[0], stored)


def test_tuner_warnings_keeps_flashinfers_distinct_warnings(monkeypatch):
    """``tuner_warnings``: what FlashInfer's logger warns inside the block and its autotuner's debug lines about
    failed or skipped tactics, each message once, no other info or debug lines, the logger's level, handlers and
    their levels as before afterwards; without FlashInfer's logger, nothing (and no error)."""
    import logging
    import sys
    import types

    with ft.tuner_warnings() as warned:
        pass
    assert warned == []
    logger = logging.Logger("fake.flashinfer.jit")  # as FlashInfer's: outside logging's registry
    core = types.ModuleType("flashinfer.jit.core")
    core.logger = logger
    for name, mod in (("flashinfer", types.ModuleType("flashinfer")), ("flashinfer.jit", types.ModuleType("j")),
                      ("flashinfer.jit.core", core)):
        monkeypatch.setitem(sys.modules, name, mod)
    console = logging.StreamHandler()
    logger.addHandler(console)
    logger.setLevel(logging.INFO)
    logger.debug("cached: debug is off")  # the logger caches that level as disabled
    with ft.tuner_warnings() as warned:
        assert console.level == logging.INFO  # prints no debug line
        logger.warning("tactic %s failed", 3)
        logger.info("profiling")
        logger.debug("[Autotuner]: Skipping tactic 7, due to failure while profiling: bad")
        logger.debug("[Autotuner]: profile 4")
        logger.warning("tactic %s failed", 3)
        logger.error("out of range")
    assert warned == ["tactic 3 failed", "[Autotuner]: Skipping tactic 7, due to failure while profiling: bad",
                      "out of range"]
    assert logger.handlers == [console] and console.level == logging.NOTSET and logger.level == logging.INFO
