"""A walk of malformed calls over every public verb and constructor of :class:`StateManager`.

Each call must raise a subclass of :class:`SSMStateError` whose message names the problem, and leave every
tensor, cursor, the pool's free list, the request map and the open step's bookkeeping bit for bit as they were.
Used by ``tests/test_hardening.py`` (reference backend, both layouts) and ``tests/test_hardening_triton.py``
(Triton backend under the interpreter).
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Callable

import numpy as np
import torch

from ssmstate import (
    CapacityError,
    ConfigError,
    LifecycleError,
    Mamba2Geometry,
    PageLayout,
    SavedState,
    ShapeError,
    SpecConfig,
    SSMStateError,
    StateCache,
    StateManager,
    UnknownRequestError,
)
from ssmstate.backends import get_backend

_A_CACHE: "weakref.WeakKeyDictionary[StateManager, torch.Tensor]" = weakref.WeakKeyDictionary()


def layer_inputs(m: StateManager, L: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One layer's verify and conv inputs for ``L`` packed tokens; ``A`` is one tensor per manager."""
    g, dev = m.geometry, m.device
    H, P, N, G, Dc, k = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank, \
        g.conv_kernel
    act = g.act_dtype
    if m not in _A_CACHE:
        _A_CACHE[m] = (-torch.rand(H, generator=torch.Generator().manual_seed(7)) - 0.5).to(dev)
    return dict(
        x=torch.randn(L, H, P, generator=gen).to(dev, act), dt=torch.randn(L, H, generator=gen).to(dev),
        B=torch.randn(L, G, N, generator=gen).to(dev, act), C=torch.randn(L, G, N, generator=gen).to(dev, act),
        A=_A_CACHE[m], xBC=torch.randn(L, Dc, generator=gen).to(dev, act),
        w=(torch.randn(Dc, k, generator=gen) * 0.5).to(dev), b=(torch.randn(Dc, generator=gen) * 0.1).to(dev),
    )


def full_snapshot(m: StateManager) -> list[Any]:
    """Every byte a refused call must leave alone: tensors, cursors, error flag, pool, request map, open step."""
    snap: list[Any] = [t.clone() for layer in m.cache.layers for t in layer.values()]
    seed = getattr(m.cache, "checkpoint_seed", None)
    snap += [m.cache.cursors.clone(), m.error_flag.clone(), None if seed is None else seed.clone()]
    snap += [list(m.pool._free), bytes(m.pool._used)]
    snap += [{rid: list(r.pages) for rid, r in m._requests.items()}, dict(m._first_page)]
    snap += [[id(a) for a in m._A], m._step, m._open_ids]
    plan = m._open
    if plan is None:
        snap.append(None)
    else:
        snap.append((id(plan), sorted(plan.verified_layers), sorted(plan.conv_layers), plan.committed,
                     plan.page_table.clone(), plan.cu_seqlens.clone(),
                     None if plan.row_cursors is None else plan.row_cursors.clone()))
    return snap


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bytes (NaN payloads compared too), whatever its memory order."""
    return t.contiguous().view(torch.uint8) if t.is_floating_point() else t


def same_snapshot(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and x.shape == y.shape
                    and torch.equal(_bits(x), _bits(y))):
                return False
        elif isinstance(x, tuple):
            if not same_snapshot(list(x), list(y)):
                return False
        elif x != y:
            return False
    return True


class _Walk:
    def __init__(self, m: StateManager) -> None:
        self.m = m
        self.tried = 0
        self.ok = 0
        self.failures: list[str] = []

    def bad(self, what: str, call: Callable[[], object], exc: type = SSMStateError, match: str = "") -> None:
        """``call`` must raise ``exc`` (an SSMStateError) with ``match`` in its message and change nothing."""
        assert issubclass(exc, SSMStateError)
        self.tried += 1
        before = full_snapshot(self.m)
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the point is to see what escapes
            if not isinstance(e, exc):
                self.failures.append(f"{what}: raised {type(e).__name__}: {e}")
                return
            if not re.search(match, str(e), re.IGNORECASE):
                self.failures.append(f"{what}: message {str(e)!r} does not name {match!r}")
                return
        else:
            self.failures.append(f"{what}: accepted")
            return
        if not same_snapshot(before, full_snapshot(self.m)):
            self.failures.append(f"{what}: refused but changed state")
            return
        self.ok += 1


def bad_input_walk(factory: Callable[..., StateManager], backend: str, device: str, scheme: str = "replay",
                   geometry: Mamba2Geometry | None = None, spec: SpecConfig | None = None) -> dict[str, int]:
    """Run every malformed call; return ``{"tried": n, "typed_unchanged": k}``; raise listing the failures."""
    g = geometry or Mamba2Geometry(4, 4, 8, 2, 4, 2, act_dtype=torch.float32)
    spec = spec or SpecConfig(2, window=4)
    layout = getattr(PageLayout, scheme)(g, spec)
    replay = scheme == "replay"
    num_pages = 7 if replay else 1 + 3 * layout.pages_per_request
    m = factory(layout=layout, num_pages=num_pages, device=device, backend=backend, max_batch=4)
    dev = m.device
    H, P, N, G, Dc, k = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank, \
        g.conv_kernel
    T = spec.num_tokens
    gen = torch.Generator().manual_seed(0)
    for rid in ("a", "b"):
        m.admit(rid)
        for layer in range(g.num_layers):
            m.write_state(rid, layer, torch.randn(H, P, N, generator=gen).to(dev),
                          torch.randn(Dc, k - 1, generator=gen).to(dev, g.conv_state_dtype))

    def run_step(ids, q, acc) -> None:
        plan = m.begin_step(ids, q)
        for layer in range(g.num_layers):
            inp = layer_inputs(m, plan.total_tokens, gen)
            m.conv(layer, plan, inp["xBC"], inp["w"], inp["b"])
            m.verify(layer, plan, inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"])
        m.commit(plan, acc)

    run_step(["a", "b"], [T, 2], [2, 1])  # committed ring rows on both pages
    w = _Walk(m)
    i32 = dict(dtype=torch.int32, device=dev)
    meta = torch.device("meta")
    pa = m.page_of("a")

    # -- constructors ---------------------------------------------------------------------------------------
    kw = dict(layout=layout, num_pages=num_pages, device=device, backend=backend)
    for name, value, exc, match in [
        ("layout", "x", ConfigError, "layout"), ("layout", None, ConfigError, "layout"),
        ("num_pages", 0, SSMStateError, "num_pages"), ("num_pages", -1, SSMStateError, "num_pages"),
        ("num_pages", 2.5, SSMStateError, "num_pages"), ("num_pages", True, SSMStateError, "num_pages"),
        ("num_pages", "4", SSMStateError, "num_pages"), ("num_pages", None, SSMStateError, "num_pages"),
        ("device", "gpu", ConfigError, "device"), ("device", None, ConfigError, "device"),
        ("device", 3.5, ConfigError, "device"),
        ("backend", "nope", SSMStateError, "unknown backend"), ("backend", 3, ConfigError, "backend"),
        ("backend_options", "x", ConfigError, "backend_options"),
        ("backend_options", {"zzz": 1}, ConfigError, "option"),
        ("max_batch", 0, SSMStateError, "max_batch"), ("max_batch", -2, SSMStateError, "max_batch"),
        ("max_batch", 1.5, SSMStateError, "max_batch"), ("max_batch", True, SSMStateError, "max_batch"),
        ("cache", "x", ConfigError, "cache"),
        ("cache", StateCache(layout, num_pages + 1, device), SSMStateError, "cache"),
    ]:
        w.bad(f"StateManager({name}={value!r:.40})", lambda: factory(**{**kw, name: value}), exc, match)
    if not torch.cuda.is_available():
        w.bad("StateManager(device='cuda')", lambda: factory(**{**kw, "device": "cuda"}), SSMStateError, "cuda")
    w.bad("PageLayout.replay(g, 'spec')", lambda: PageLayout.replay(g, "spec"), ConfigError, "spec")
    w.bad("PageLayout.native('g', spec)", lambda: PageLayout.native("g", spec), ConfigError, "geometry")
    w.bad("PageLayout('bogus', ...)", lambda: PageLayout("bogus", g, spec), ConfigError, "scheme")
    w.bad("SpecConfig(-1)", lambda: SpecConfig(-1), ConfigError, "num_speculative_tokens")
    w.bad("SpecConfig(2.0)", lambda: SpecConfig(2.0), ConfigError, "num_speculative_tokens")
    w.bad("SpecConfig(2, window=2)", lambda: SpecConfig(2, window=2), ConfigError, "window")
    w.bad("StateCache.from_tensors(no layers)", lambda: StateCache.from_tensors(layout, [], m.cache.cursors),
          ShapeError, "layers")
    w.bad("get_backend(None)", lambda: get_backend(None), ConfigError, "backend")

    # -- admission ---------------------------------------------------------------------------------------------
    for rid in ([], {"x"}, {"k": 1}, np.zeros(2)):
        w.bad(f"admit({rid!r:.30})", lambda: m.admit(rid), SSMStateError, "hashable")
        w.bad(f"release({rid!r:.30})", lambda: m.release(rid), SSMStateError, "hashable")
        w.bad(f"preempt({rid!r:.30})", lambda: m.preempt(rid), SSMStateError, "hashable")
        w.bad(f"page_of({rid!r:.30})", lambda: m.page_of(rid), SSMStateError, "hashable")
    w.bad("admit twice", lambda: m.admit("a"), LifecycleError, "already admitted")
    for verb in ("release", "preempt", "page_of", "pages_of"):
        w.bad(f"{verb}(unknown)", lambda: getattr(m, verb)("zzz"), UnknownRequestError, "unknown request")
    for n in (-1, 1.5, True, None, "1"):
        w.bad(f"can_admit({n!r})", lambda: m.can_admit(n), SSMStateError, "can_admit")

    # -- prefill state ---------------------------------------------------------------------------------------
    S = torch.randn(H, P, N).to(dev)
    cw = torch.randn(Dc, k - 1).to(dev, g.conv_state_dtype)
    for layer in (-1, g.num_layers, 1.5, True, None, "0", np.float32(0)):
        w.bad(f"write_state(layer={layer!r})", lambda: m.write_state("a", layer, S), SSMStateError, "layer")
        w.bad(f"read_state(layer={layer!r})", lambda: m.read_state("a", layer), SSMStateError, "layer")
        w.bad(f"read_conv(layer={layer!r})", lambda: m.read_conv("a", layer), SSMStateError, "layer")
        w.bad(f"bind_layer(layer={layer!r})", lambda: m.bind_layer(layer, layer_inputs(m, 1, gen)["A"]),
              SSMStateError, "layer")
    for verb in ("read_state", "read_conv"):
        w.bad(f"{verb}(unknown)", lambda: getattr(m, verb)("zzz", 0), UnknownRequestError, "unknown request")
        w.bad(f"{verb}(unhashable)", lambda: getattr(m, verb)(["a"], 0), SSMStateError, "hashable")
    w.bad("write_state(unknown)", lambda: m.write_state("zzz", 0, S), UnknownRequestError, "unknown request")
    for bad_S, what in ((S[:, :, :-1], "shape"), (S.double(), "dtype"), (S.int(), "dtype"),
                        (torch.zeros(H, P, N, device=meta), "meta"), (S.tolist(), "torch.Tensor"), (None, "Tensor")):
        w.bad(f"write_state(ssm_state {what})", lambda: m.write_state("b", 0, bad_S), ShapeError, "ssm_state")
    for bad_cw in (cw[:, :-1], cw.T.contiguous(), cw.double(), "conv"):
        w.bad("write_state(conv_window bad)", lambda: m.write_state("b", 0, S, bad_cw), ShapeError, "conv_window")
    if replay:
        w.bad("write_state(committed rows)", lambda: m.write_state("a", 0, S), LifecycleError, "materialize")
    A = layer_inputs(m, 1, gen)["A"]
    for bad_A, match in ((A[:-1], "shape"), (A.double(), "dtype"), (A.tolist(), "Tensor"), (-A, "A"),
                         (torch.where(torch.arange(H, device=dev) == 1, float("nan"), A), "A"),
                         (torch.zeros(H, device=meta), "meta"), (A.int(), "dtype")):
        w.bad(f"bind_layer(A {match})", lambda: m.bind_layer(0, bad_A), SSMStateError, match)

    # -- steps, before one is open ------------------------------------------------------------------------------
    for ids, match in ((None, "request_ids"), ("a", "request_ids"), (5, "request_ids"), ([], "at least one"),
                       (["zzz"], "unknown request"), (["a", "zzz"], "unknown request"), ([["a"]], "hashable"),
                       (["a", "a"], "twice"), ([np.zeros(1)], "hashable")):
        w.bad(f"begin_step({ids!r})", lambda: m.begin_step(ids, 1), SSMStateError, match)
    for q in (0, T + 1, -1, 2.0, None, True, "2", np.float64(1), [1], [1, 2, 3], [1, 2.0], [1, True], [1, None],
              [[1], [1]], [0, 1], [1, T + 1], np.array([1, 1.5])):
        w.bad(f"begin_step(num_tokens={q!r})", lambda: m.begin_step(["a", "b"], q), SSMStateError, "num_tokens")
    for pad in (1, 5, 1.5, True, "3", -1):
        w.bad(f"begin_step(pad_to={pad!r})", lambda: m.begin_step(["a", "b"], 1, pad_to=pad), SSMStateError,
              "pad_to")

    cu1 = torch.tensor([0, 1], **i32)
    for pages, match in ((torch.tensor([1]), "page_ids"), ([1], "page_ids"), (torch.tensor([[1]], **i32), "page_ids"),
                         (torch.tensor([1], dtype=torch.int32, device=meta), "page_ids"),
                         (torch.tensor([-2], **i32), "page"), (torch.tensor([num_pages], **i32), "page"),
                         (torch.tensor([1 << 30], **i32), "page")):
        w.bad(f"begin_step_from_tensors(page_ids={pages!r:.50})",
              lambda: m.begin_step_from_tensors(pages, cu1, 1, 1), SSMStateError, match)
    two = torch.tensor([pa, pa], **i32)
    w.bad("begin_step_from_tensors(repeated page)",
          lambda: m.begin_step_from_tensors(two, torch.tensor([0, 1, 2], **i32), 2, 1), SSMStateError, "twice")
    w.bad("begin_step_from_tensors(no rows)",
          lambda: m.begin_step_from_tensors(torch.zeros(0, **i32), torch.zeros(1, **i32), 0, 1), SSMStateError,
          "rows")
    w.bad("begin_step_from_tensors(rows > max_batch)",
          lambda: m.begin_step_from_tensors(torch.zeros(5, **i32), torch.zeros(6, **i32), 0, 1), SSMStateError,
          "rows")
    pg = torch.tensor([pa], **i32)
    for cu, total, mx, qs, match in (
            (torch.tensor([0, 1]), 1, 1, None, "cu_seqlens"), (torch.tensor([0, 1, 2], **i32), 1, 1, None, "cu_seqlens"),
            (torch.tensor([1, 2], **i32), 1, 1, None, "cu_seqlens"), (torch.tensor([0, 2], **i32), 1, 2, None, "cu_seqlens"),
            (torch.tensor([0, 2], **i32), 2, 1, None, "total_tokens"), (torch.tensor([0, -1], **i32), 0, 1, None, "cu_seqlens"),
            (cu1, 1.0, 1, None, "total_tokens"), (cu1, True, 1, None, "total_tokens"), (cu1, -1, 1, None, "total_tokens"),
            (cu1, 9, 1, None, "total_tokens"), (cu1, 1, 0, None, "max_seqlen"), (cu1, 1, T + 1, None, "max_seqlen"),
            (cu1, 1, 1.5, None, "max_seqlen"), (cu1, 1, None, None, "max_seqlen"), (cu1, 1, 1, [1, 0], "num_tokens"),
            (cu1, 1, 1, [2], "num_tokens"), (cu1, 1, 1, [1.0], "num_tokens"), (cu1, 1, 1, 1, "num_tokens"),
            (cu1, 1, 1, [True], "num_tokens")):
        w.bad(f"begin_step_from_tensors({match})", lambda: m.begin_step_from_tensors(pg, cu, total, mx, qs),
              SSMStateError, match)

    for pages, match in (([1], "page_ids"), (torch.tensor([[1]], **i32), "page_ids"),
                         (torch.tensor([1.0], device=dev), "page_ids"),
                         (torch.tensor([1], dtype=torch.int32, device=meta), "page_ids"),
                         (torch.tensor([-1], **i32), "page"), (torch.tensor([num_pages], **i32), "page"),
                         (torch.tensor([0, -(1 << 31)], **i32), "page")):
        w.bad(f"reset_cursors({pages!r:.50})", lambda: m.reset_cursors(pages), SSMStateError, match)
        w.bad(f"materialize_pages({pages!r:.50})", lambda: m.materialize_pages(pages), SSMStateError, match)
    w.bad("materialize_pages(int64)", lambda: m.materialize_pages(torch.tensor([1], dtype=torch.int64, device=dev)),
          ShapeError, "page_ids")
    for ids, match in ((None, "request_ids"), ("a", "request_ids"), (["zzz"], "unknown request"),
                       (["a", "a"], "twice"), ([["a"]], "hashable")):
        w.bad(f"materialize({ids!r})", lambda: m.materialize(ids), SSMStateError, match)

    # -- preempt / resume ----------------------------------------------------------------------------------------
    saved = m.preempt("b")  # a valid blob to corrupt
    free = m.pool.num_free

    def blob(tensors=None, cursors=None, layout_=None) -> SavedState:
        return SavedState(layout_ or saved.layout, saved.tensors if tensors is None else tensors,
                          saved.cursors if cursors is None else cursors)

    def with_cursor(row: int, value: int) -> SavedState:
        cur = saved.cursors.clone()
        cur[row, 0] = value
        return blob(cursors=cur)

    def with_tensor(layer: int, name: str, value: Any) -> SavedState:
        layers = [dict(t) for t in saved.tensors]
        if value is None:
            del layers[layer][name]
        else:
            layers[layer][name] = value
        return blob(tensors=tuple(layers))

    state_name = "checkpoint" if replay else "state"
    st0 = saved.tensors[0][state_name]
    other_layout = getattr(PageLayout, scheme)(g, SpecConfig(spec.num_speculative_tokens, window=spec.window + 1))
    blobs = [
        ("not a SavedState", "zzz", "SavedState"), ("other layout", blob(layout_=other_layout), "layout"),
        ("fewer layers", blob(tensors=saved.tensors[:1]), "layers"),
        ("extra layer", blob(tensors=saved.tensors + saved.tensors[:1]), "layers"),
        ("tensors None", SavedState(saved.layout, None, saved.cursors), "tensors"),
        ("layer not a dict", blob(tensors=(saved.tensors[0], [1])), "layer 1"),
        ("state shape", with_tensor(1, state_name, st0[:, :-1]), state_name),
        ("state dtype", with_tensor(1, state_name, st0.double()), state_name),
        ("state not a tensor", with_tensor(1, state_name, 0.0), state_name),
        ("missing conv", with_tensor(0, "conv", None), "conv"),
        ("extra key", with_tensor(0, "junk", st0), "junk"),
        ("cursor shape", blob(cursors=saved.cursors[:3]), "cursors"),
        ("cursor dtype", blob(cursors=saved.cursors.long()), "cursors"),
        ("cursors not a tensor", blob(cursors=saved.cursors.tolist()), "cursors"),
        ("pending", with_cursor(2, 1), "pending"),
        ("conv_shift", with_cursor(3, -1), "conv_shift"),
        ("conv_shift", with_cursor(3, layout.conv_width), "conv_shift"),
    ]
    if replay:
        blobs += [("ring_start", with_cursor(0, -7), "ring_start"), ("ring_start", with_cursor(0, spec.ring_len),
                                                                      "ring_start"),
                  ("num_committed", with_cursor(1, 999), "num_committed"),
                  ("num_committed", with_cursor(1, -1), "num_committed"),
                  ("x_ring shape", with_tensor(0, "x_ring", saved.tensors[0]["x_ring"][:, :, :-1]), "x_ring"),
                  ("dt_ring dtype", with_tensor(0, "dt_ring", saved.tensors[0]["dt_ring"].half()), "dt_ring")]
    else:
        blobs += [("state_slot", with_cursor(0, layout.pages_per_request), "state_slot"),
                  ("state_slot", with_cursor(0, -1), "state_slot")]
    for what, b, match in blobs:
        w.bad(f"resume({what})", lambda: m.resume("b", b), SSMStateError, match)
        assert m.pool.num_free == free, what
    w.bad("resume(unhashable)", lambda: m.resume(["b"], saved), SSMStateError, "hashable")
    w.bad("resume(admitted)", lambda: m.resume("a", saved), LifecycleError, "already admitted")
    m.resume("b", saved)

    # -- an open step --------------------------------------------------------------------------------------------
    plan = m.begin_step(["a", "b"], [T, 1], pad_to=3)
    L = plan.total_tokens
    inp = layer_inputs(m, L, gen)
    x, dt, B, C, A = inp["x"], inp["dt"], inp["B"], inp["C"], inp["A"]
    xBC, wt, bias = inp["xBC"], inp["w"], inp["b"]
    m.conv(0, plan, xBC, wt, bias)
    m.verify(0, plan, x, dt, B, C, A)
    w.bad("begin_step(open)", lambda: m.begin_step(["a"], 1), LifecycleError, "still open")
    w.bad("begin_step_from_tensors(open)", lambda: m.begin_step_from_tensors(pg, cu1, 1, 1), LifecycleError,
          "still open")
    w.bad("materialize_pages(open)", lambda: m.materialize_pages(pg), LifecycleError, "open")
    for verb, args in (("release", ("a",)), ("preempt", ("b",)), ("materialize", (["a"],)),
                       ("read_state", ("a", 0)), ("read_conv", ("a", 0)), ("write_state", ("b", 0, S))):
        w.bad(f"{verb}(in the open step)", lambda: getattr(m, verb)(*args), LifecycleError, "open step")
    vargs = (x, dt, B, C, A)
    for p, match, exc in ((None, "StepPlan", SSMStateError), ("plan", "StepPlan", SSMStateError)):
        w.bad(f"verify(plan={p!r})", lambda: m.verify(1, p, *vargs), exc, match)
        w.bad(f"conv(plan={p!r})", lambda: m.conv(1, p, xBC, wt), exc, match)
        w.bad(f"commit(plan={p!r})", lambda: m.commit(p, 0), exc, match)
        w.bad(f"rollback(plan={p!r})", lambda: m.rollback(p), exc, match)
    for layer in (-1, g.num_layers, 1.5, True, None, "1"):
        w.bad(f"verify(layer={layer!r})", lambda: m.verify(layer, plan, *vargs), SSMStateError, "layer")
        w.bad(f"conv(layer={layer!r})", lambda: m.conv(layer, plan, xBC, wt), SSMStateError, "layer")
    w.bad("verify(layer twice)", lambda: m.verify(0, plan, *vargs), LifecycleError, "already verified")
    w.bad("conv(layer twice)", lambda: m.conv(0, plan, xBC, wt), LifecycleError, "already ran")
    for i, name in enumerate(("x", "dt", "B", "C", "A")):
        t = vargs[i]
        for bad_t, what in ((t[:-1], "shape"), (t.double(), "dtype"), (t.tolist(), "Tensor"),
                            (torch.zeros(t.shape, device=meta, dtype=t.dtype), "meta")):
            args = list(vargs)
            args[i] = bad_t
            w.bad(f"verify({name} {what})", lambda: m.verify(1, plan, *args), ShapeError, name)
    for bad_A in (-A, torch.where(torch.arange(H, device=dev) == 0, float("nan"), A)):
        w.bad("verify(A > 0 or NaN)", lambda: m.verify(1, plan, x, dt, B, C, bad_A), SSMStateError, "A")
    for name, bad_t in (("D", A[:-1]), ("dt_bias", A.double()), ("z", x[:, :1]), ("out", x[:-1]),
                        ("out", x.double())):
        w.bad(f"verify({name} bad)", lambda: m.verify(1, plan, *vargs, **{name: bad_t}), ShapeError, name)
    w.bad("verify(out is x)", lambda: m.verify(1, plan, *vargs, out=x), ShapeError, "overlaps x")
    z = torch.randn_like(x)
    w.bad("verify(out is z)", lambda: m.verify(1, plan, *vargs, z=z, out=z), ShapeError, "overlaps z")
    buf = torch.zeros(x.numel() + 1, dtype=x.dtype, device=dev)
    x2, o2 = buf[:-1].view(x.shape), buf[1:].view(x.shape)  # one element apart: overlapping, not equal
    x2.copy_(x)
    w.bad("verify(out shares memory with x)", lambda: m.verify(1, plan, x2, dt, B, C, A, out=o2), ShapeError,
          "overlaps x")
    w.bad("conv(activation)", lambda: m.conv(1, plan, xBC, wt, activation="relu"), SSMStateError, "activation")
    for name, bad in (("xBC", xBC[:-1]), ("xBC", xBC.double()), ("weight", wt[:, :-1]), ("weight", "w")):
        w.bad(f"conv({name} bad)", lambda: m.conv(1, plan, bad if name == "xBC" else xBC,
                                                   bad if name == "weight" else wt), ShapeError, name)
    w.bad("conv(bias bad)", lambda: m.conv(1, plan, xBC, wt, bias[:-1]), ShapeError, "bias")
    w.bad("conv(out bad)", lambda: m.conv(1, plan, xBC, wt, out=xBC[:-1]), ShapeError, "out")
    w.bad("conv(out is xBC)", lambda: m.conv(1, plan, xBC, wt, out=xBC), ShapeError, "overlaps xBC")
    w.bad("commit(layer 1 not verified)", lambda: m.commit(plan, 0), LifecycleError, "not verified")
    w.bad("rollback(layer 1 not verified)", lambda: m.rollback(plan), LifecycleError,
          "not verified" if replay else "overwrote its source state")
    m.verify(1, plan, *vargs)
    w.bad("commit(conv partly)", lambda: m.commit(plan, [1, 1]), LifecycleError, "conv")
    m.conv(1, plan, xBC, wt, bias)
    low = 1 if not replay else 0
    for acc, match in (([T + 1, 1], "out of range"), ([1, 2], "out of range"), ([-1, 1], "out of range"),
                       ([1], "entries"), ([1, 1, 1, 1], "entries"), ([1.5, 1], "ints"), (1.5, "ints"),
                       (None, "ints"), (True, "ints"), ([True, True], "ints"), ("1", "ints"), ([[1, 1]], "ints"),
                       (torch.tensor([1.0, 1.0]), "ints"), (torch.tensor([[1, 1]]), "ints"),
                       (np.array([1.0, 1.0]), "ints"), (T + 1, "out of range")):
        w.bad(f"commit({acc!r:.40})", lambda: m.commit(plan, acc), SSMStateError, match)
    if not replay:
        w.bad("commit(native 0)", lambda: m.commit(plan, [0, 1]), SSMStateError, "out of range")
    m.commit(plan, [T, 1])  # the plan is then stale
    w.bad("commit(committed)", lambda: m.commit(plan, 0), LifecycleError, "already committed")
    w.bad("rollback(committed)", lambda: m.rollback(plan), LifecycleError, "already committed")
    w.bad("verify(committed)", lambda: m.verify(0, plan, *vargs), LifecycleError, "already committed")
    plan2 = m.begin_step(["a"], 1)
    w.bad("commit(not the open step)", lambda: m.commit(plan, 0), LifecycleError, "already committed|not the open")
    w.bad("commit(no verify, a > 0)", lambda: m.commit(plan2, [1]), LifecycleError, "verified")
    m.rollback(plan2)

    # -- a full pool ---------------------------------------------------------------------------------------------
    saved = m.preempt("b")
    while m.can_admit():
        m.admit(object())
    w.bad("admit(full)", lambda: m.admit("full"), CapacityError, "full")
    w.bad("resume(full)", lambda: m.resume("b", saved), CapacityError, "full")

    if w.failures:
        raise AssertionError(f"{len(w.failures)} of {w.tried} bad calls failed:\n" + "\n".join(w.failures))
    return {"tried": w.tried, "typed_unchanged": w.ok}
