"""Tuning the FlashInfer backend: profile the calls ``verify`` really makes, then keep the fastest algorithm.

FlashInfer's autotuner keys its tactic cache on every JIT argument (the dtypes of x, dt, D/dt_bias and A), on
which optional tensors are present (D, z, dt_bias, state indices, ``cu_seqlens``) and on the batch bucket. A
profile call that differs from the served one in any of these (say D and dt_bias left out while the model passes
both) tunes an entry no real call ever finds, and those calls fall back to FlashInfer's heuristic. So the profile
calls here go through :meth:`FlashInferBackend.verify` itself, with inputs shaped like a runner's
(:class:`CallShape`: the vLLM plugin's by default), on a private cache.

FlashInfer tunes only dense calls (every row ``T`` tokens); varlen calls always take its heuristic (two-kernel when
``rows * H >= SMs``). So after its autotuner has run, each batch size is timed, cold pages, on each algorithm it
can take: dense ``"auto"`` (the tuned tactic), ``"monolith"`` and ``"two-kernel"``; varlen ``"monolith"`` and
``"two-kernel"``. The fastest is what verify passes for that form and batch from then on.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import attrs
import torch

from ssmstate.cache import StateCache
from ssmstate.errors import BackendUnavailableError
from ssmstate.dtypes import is_quantized
from ssmstate.layout import PageLayout
from ssmstate.plan import StepPlan

if TYPE_CHECKING:
    from ssmstate.backends.flashinfer import FlashInferBackend

Tensor = torch.Tensor

#: algorithms a form can take; "auto" on a dense call is FlashInfer's tuned tactic
CANDIDATES = {"dense": ("auto", "monolith", "two-kernel"), "varlen": ("monolith", "two-kernel")}


@attrs.frozen
class CallShape:
    """What a runner's verify calls carry beyond the layout (FlashInfer keys its JIT build and tactics on it).

    Attributes:
        D, dt_bias: dtype of the (H,) parameter, or None when the runner passes none.
        dt: dtype of the raw dt (tokens, H).
        gate: the runner passes z.
        packed: x, B and C are views of one (tokens, conv_dim) conv output, split as the model splits it (their
            token stride is the conv width, as in the vLLM plugin); False: each is contiguous.
    """

    D: torch.dtype | None
    dt_bias: torch.dtype | None
    dt: torch.dtype
    gate: bool = False
    packed: bool = True

    @classmethod
    def vllm(cls, layout: PageLayout) -> "CallShape":
        """The vLLM plugin's decode calls: D and dt_bias model-dtype parameters, dt a model-dtype slice of the
        projection, x/B/C views of the conv output, no z (Nemotron-H gates in its norm)."""
        act = layout.geometry.act_dtype
        return cls(D=act, dt_bias=act, dt=act, gate=False, packed=True)


@attrs.define
class Probe:
    """A batch of ``rows`` rows on ``sets`` disjoint page sets of a private cache, and one verify input set."""

    rows: int
    form: str
    plans: list[StepPlan]
    inputs: dict[str, Tensor | None]


def plan_for(pages: Tensor, lengths: Sequence[int]) -> StepPlan:
    """A step plan over ``pages`` (rows,) int32 on the device with host lengths ``lengths``."""
    host = pages.cpu()
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return StepPlan(step_id=0, request_ids=tuple(range(len(lengths))), num_tokens=tuple(lengths),
                    page_ids=pages, page_table=pages[:, None], cu_seqlens=cu.to(pages.device),
                    page_ids_host=host, page_table_host=host[:, None], cu_seqlens_host=cu,
                    max_seqlen=max(lengths), total_tokens=int(cu[-1]))


def lengths_for(form: str, rows: int, T: int) -> list[int]:
    """Dense: every row T tokens. Varlen: the same but the last row one token short (what makes a call varlen)."""
    if form == "dense" or T == 1:
        return [T] * rows
    return [T] * (rows - 1) + [T - 1]


def make_inputs(layout: PageLayout, call: CallShape, tokens: int, device: torch.device,
                gen: torch.Generator) -> dict[str, Tensor | None]:
    """Random verify inputs for ``tokens`` tokens shaped as ``call`` says (see :class:`CallShape`)."""
    g = layout.geometry
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    act = g.act_dtype

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    if call.packed:
        co = rnd(tokens, H * P + 2 * G * N, scale=0.3).to(act)
        x, B, C = torch.split(co, [H * P, G * N, G * N], dim=-1)
        x, B, C = x.view(tokens, H, P), B.view(tokens, G, N), C.view(tokens, G, N)
    else:
        x = rnd(tokens, H, P).to(act)
        B, C = rnd(tokens, G, N, scale=0.3).to(act), rnd(tokens, G, N, scale=0.3).to(act)
    return {
        "x": x, "B": B, "C": C, "dt": rnd(tokens, H, scale=0.5).to(call.dt),
        "A": -(torch.rand(H, generator=gen) + 0.5).to(device),
        "D": None if call.D is None else rnd(H).to(call.D),
        "dt_bias": None if call.dt_bias is None else (torch.rand(H, generator=gen) * 0.1).to(device).to(call.dt_bias),
        "z": rnd(tokens, H, P).to(act) if call.gate else None,
        "out": torch.empty(tokens, H, P, dtype=act, device=device),
    }


def private_cache(layout: PageLayout, sizes: Sequence[int], device: torch.device, l2_bytes: int,
                  gen: torch.Generator) -> tuple[StateCache, dict[int, int]]:
    """A one-layer cache with enough disjoint page sets per batch size that a timed round reads cold pages
    (at least 4x ``l2_bytes``), with cursors spread over the ring and the window (flush and non-flush rows)."""
    one = attrs.evolve(layout, geometry=attrs.evolve(layout.geometry, num_layers=1))
    page = max(one.layer_page_bytes, 1)
    sets = {b: max(2, math.ceil(4 * l2_bytes / (b * page))) if l2_bytes else 1 for b in sizes}
    pages = 1 + max(sets[b] * b for b in sizes)
    cache = StateCache(one, pages, device)
    s = one.spec
    cache.ring_start.copy_(torch.randint(0, s.ring_len, (pages,), generator=gen, dtype=torch.int32))
    cache.num_committed.copy_(torch.randint(0, s.window + 1, (pages,), generator=gen, dtype=torch.int32))
    cache.ring_start[0] = cache.num_committed[0] = 0
    return cache, sets


def probe(layout: PageLayout, call: CallShape, form: str, rows: int, sets: int, device: torch.device,
          gen: torch.Generator) -> Probe:
    """Plans over ``sets`` disjoint page sets (pages 1..) of ``rows`` rows each, and inputs for them."""
    T = layout.spec.num_tokens
    lengths = lengths_for(form, rows, T)
    plans = [plan_for(torch.arange(1 + j * rows, 1 + (j + 1) * rows, dtype=torch.int32, device=device), lengths)
             for j in range(sets)]
    return Probe(rows, form, plans, make_inputs(layout, call, sum(lengths), device, gen))


def time_us(fns: Sequence[Callable[[], object]], reps: int = 10, min_calls: int = 16) -> float:
    """Median µs per call of ``fns`` (cycled to at least ``min_calls`` calls) replayed as one CUDA graph."""
    fns = list(fns) * max(1, -(-min_calls // len(fns)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    return statistics.median(times)


def fastest(times: dict[str, float]) -> str:
    """The algorithm with the least time; a tie goes to the earlier candidate (``"auto"`` first)."""
    return min(times, key=lambda a: (times[a], list(times).index(a)))


def tune(backend: "FlashInferBackend", layout: PageLayout, device: torch.device, sizes: Sequence[int],
         cache: Any, call: CallShape, seed: int, reps: int) -> list[dict[str, Any]]:
    """:meth:`FlashInferBackend.tune` after its checks: autotune, then time every candidate per form and size."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cuda = device.type == "cuda"
    l2 = (getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 << 20) if cuda else 0
    priv, sets = private_cache(layout, sizes, device, l2, gen)
    report: list[dict[str, Any]] = []
    try:
        with backend.forcing("auto"), backend.autotune(sizes, cache), tuner_warnings() as warned:
            for bs in sizes:  # profiled by FlashInfer under the key the served calls look up
                backend.run_probe(priv, probe(layout, call, "dense", bs, 1, device, gen), 0)
        if cuda:
            torch.cuda.synchronize(device)
        # an 8-bit checkpoint runs checkpointing_ssu's monolithic kernel only: nothing else to time
        candidates = {f: ("monolith",) for f in CANDIDATES} if is_quantized(layout.geometry.state_dtype) else CANDIDATES
        for bs in sizes:
            for form, algos in candidates.items():
                pr = probe(layout, call, form, bs, sets[bs], device, gen)
                times, failed = {}, {}
                for algo in algos:
                    with backend.forcing(algo):
                        try:
                            times[algo] = time_us([lambda j=j: backend.run_probe(priv, pr, j)
                                                   for j in range(len(pr.plans))], reps)
                        except Exception as exc:  # not capturable in a CUDA graph here: never chosen
                            failed[algo] = repr(exc)[:300]
                if not times:
                    raise BackendUnavailableError(f"no checkpointing_ssu algorithm ran in a CUDA graph at batch {bs} "
                                                  f"({form}): {failed}")
                entry = {"form": form, "batch": bs, "us": times, "chosen": fastest(times),
                         **({"failed": failed} if failed else {})}
                if form == "dense" and cuda:
                    with backend.forcing("auto"):
                        tactic, miss = tuned_tactic(lambda: backend.run_probe(priv, pr, 0))
                    entry["auto_runs"] = describe_tactic(tactic)
                    if tactic is None:  # why FlashInfer's tuner handed this call no tactic
                        entry["tuner_miss"] = miss
                        if warned:
                            entry["tuner_warnings"] = warned[:4]
                report.append(entry)
    finally:
        backend.release(priv)
    return report


def tuned_tactic(run: Callable[[], object]) -> tuple[Any, str | None]:
    """``(tactic, None)``: the tactic FlashInfer's tuner hands the ``checkpointing_ssu`` call ``run`` makes; on a
    miss (FlashInfer then runs its heuristic) ``(None, why)``, ``why`` from :func:`key_mismatch` (the call's key
    against the tuner's stored ones)."""
    from flashinfer.autotuner import AutoTuner

    tuner = AutoTuner.get()
    found: list[tuple] = []
    search = tuner.search_cache

    def watched(*a: Any, **k: Any) -> Any:
        res = search(*a, **k)
        found.append((res, a, k))
        return res

    tuner.search_cache = watched
    try:
        run()
    finally:
        del tuner.search_cache  # the class's method again
    if not found:
        return None, "the call did not ask FlashInfer's tuner (not a tuned form)"
    res, args, kwargs = found[-1]
    if res[0]:
        return res[2], None
    try:  # FlashInfer's private key and cache: diagnostics only
        op, runners, shapes, config = args[:4]
        inputs = args[4] if len(args) > 4 else kwargs.get("inputs")
        extras = runners[0].get_cache_key_extras(inputs) if inputs is not None else ()
        served = AutoTuner._get_cache_key(op, runners[0], shapes, config, extras)
        stored = tuner._winner_cache() if hasattr(tuner, "_winner_cache") else tuner.profiling_cache
        why = key_mismatch(served, list(stored))
        failed_tactics = getattr(getattr(tuner, "stats", None), "failed_tactics", {})
        failed = {runner: len(tactics) for runner, tactics in failed_tactics.items() if runner.startswith(f"{op}::")}
        return None, why + (f"; tactics that failed while profiling: {failed}" if failed else "")
    except Exception as exc:  # another FlashInfer: say so, never fail the tune over it
        return None, f"miss (its key not readable here: {exc!r:.200})"


#: the fields of FlashInfer's tuner key (``ProfilingCacheKey``) besides the op
KEY_FIELDS = ("runner_class_name", "runner_hash", "nearest_profile", "extras")


def key_mismatch(served: Any, stored: Sequence[Any], limit: int = 600) -> str:
    """Why ``served`` (a tuner key: ``custom_op`` and :data:`KEY_FIELDS`) matches none of ``stored``: how many
    entries its op has, and where the closest one differs (the positions of a tuple field that differ, with both
    values)."""
    same = [key for key in stored if key.custom_op == served.custom_op]
    if not same:
        return f"no tuned entry for {served.custom_op} (of {len(stored)} in the tuner): its profiling stored none"

    def differs(key: Any) -> list[str]:
        return [f for f in KEY_FIELDS if getattr(key, f) != getattr(served, f)]

    best = min(same, key=lambda key: len(differs(key)))
    parts = []
    for f in differs(best):
        was, now = getattr(best, f), getattr(served, f)
        if isinstance(was, tuple) and isinstance(now, tuple) and len(was) == len(now):
            at = [i for i, (x, y) in enumerate(zip(was, now)) if x != y]
            parts.append(f"{f}[{','.join(map(str, at))}]: stored {[was[i] for i in at]} served {[now[i] for i in at]}")
        else:
            parts.append(f"{f}: stored {was!r} served {now!r}")
    if not parts:
        return f"{len(same)} tuned entries for {served.custom_op}, one with this key: rejected on lookup (policy)"
    return f"{len(same)} tuned entries for {served.custom_op}; the closest differs in " + "; ".join(parts)[:limit]


@contextlib.contextmanager
def tuner_warnings() -> Iterator[list[str]]:
    """The distinct messages FlashInfer's autotuner logs inside the block, in order: its warnings (a shape outside
    the tuned buckets) and the debug lines that say why a tactic failed while profiling (FlashInfer logs those at
    debug level only; its own handlers keep printing what they printed before). Nothing where its logger is not
    there."""
    import logging

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()[:300]
            why = "[Autotuner]" in msg and ("fail" in msg.lower() or "skip" in msg.lower())
            if (record.levelno >= logging.WARNING or why) and msg not in seen:
                seen.append(msg)

    try:
        from flashinfer.jit.core import logger
    except Exception:  # noqa: BLE001  (no FlashInfer logger: nothing to keep)
        yield seen
        return
    level = logger.getEffectiveLevel()
    others = [(h, h.level) for h in logger.handlers]
    for h, lv in others:  # what they printed before, no more
        h.setLevel(max(lv, level))
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    # FlashInfer builds its logger outside logging's registry, so setLevel does not clear the logger's cache of
    # enabled levels: clear it here, or its debug lines stay dropped
    getattr(logger, "_cache", {}).clear()
    try:
        yield seen
    finally:
        logger.setLevel(old)
        getattr(logger, "_cache", {}).clear()
        logger.removeHandler(handler)
        for h, lv in others:
            h.setLevel(lv)


def describe_tactic(tactic: Any) -> str:
    """FlashInfer's ``(stages, CTAs/SM, precompute heads/CTA, d_split)`` tactic in words."""
    if tactic is None:
        return "heuristic (no tuned tactic)"
    if not isinstance(tactic, tuple) or len(tactic) != 4:
        return f"tactic {tactic!r}"
    stages, ctas, heads, d_split = tactic
    if stages == ctas == heads == 0:
        return f"monolith, d_split={d_split}"
    return f"two-kernel, {stages} stages, {ctas} CTAs/SM, {heads} precompute heads/CTA, d_split={d_split}"


@contextlib.contextmanager
def autotune(batch_sizes: Sequence[int] | None = None,
             cache: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Run FlashInfer's autotuner on the ``checkpointing_ssu`` calls made inside the block.

    FlashInfer tunes only dense calls (uniform ``q = T`` batches) made with
    ``algorithm="auto"`` and the scratch trio, which this backend always passes.
    It profiles on private buffers (cold L2, CUDA graphs); one call at the largest
    batch covers the smaller ``batch_sizes`` buckets. Run this before capturing
    CUDA graphs; outside the block, dense calls use the tuned tactic.

    Args:
        batch_sizes: the row counts the runner will use (its CUDA-graph buckets);
            None keeps FlashInfer's default buckets (powers of two, ...).
        cache: optional JSON file: tactics are loaded from it and saved back.
    """
    from ssmstate.backends.flashinfer import import_flashinfer

    import_flashinfer()
    import flashinfer

    buckets = None if batch_sizes is None else tuple(sorted({int(b) for b in batch_sizes}))
    with flashinfer.autotune(True, cache=None if cache is None else os.fspath(cache), tuning_buckets=buckets):
        yield
