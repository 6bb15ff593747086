"""Verify-kernel benchmark on one GPU: ssmstate Triton ReplaySSM vs FlashInfer, in one process run.

Nemotron-H Mamba geometry per layer and TP rank (H=128, P=64, N=128, G=8), fp32
state, bf16 inputs. For each (T, W) and batch it times, with CUDA graphs:

* ours (``ssmstate.ops.triton.replay_verify``): every row non-flush
  (``c = min(W - T, W // 2)`` history rows), every row flush
  (``c = min(W, W - T + 2)``), and "amortized" = ``(1 - f) nf + f fl`` with
  ``f`` the steady-state flush fraction of the commit rule under a realistic
  acceptance pattern (each draft accepted with probability 0.7, stop at the
  first rejection); also a measured "mixed" batch whose rows carry cursors drawn
  from that steady state, and "one_flush", one flush row among non-flush rows;
* FlashInfer ``checkpointing_ssu`` on the same pages (the layout is shared),
  algorithm "auto" (two-kernel when batch*H >= SMs, scratch from
  ``allocate_checkpointing_ssu_scratch``), "monolith", and autotuned
  (``flashinfer.autotune``), W <= 16 only (FlashInfer's limit);
* the native scheme: FlashInfer ``selective_state_update`` reading one state
  and writing T states per request (1 + K pages per request).

L2 (50 MB on the H200): each timed graph replays the kernel over several
disjoint page sets (distinct pages, same inputs) whose total footprint is at
least 4x the L2 size, so every call streams cold pages, as a real step does when
60+ layers run between two visits of a layer's pages. The sets are cycled to at
least 16 calls per graph (a graph's own launch, several µs, would otherwise add a
few µs to each of as few as two calls). Times are per call (graph replay time /
calls in it), the median of several replays.

Effective bandwidth = modelled DRAM bytes / time. The bytes model (per row,
printed with the table) counts what must move at least once: the checkpoint
read (+ write on flush), the c history ring rows read, the q window inputs read
(x, B, C, dt), q ring rows written, q outputs written; native: one state read,
T states written, inputs and outputs. Sizes come from :class:`PageLayout`.

Run (repo root): ``python benchmarks/bench_verify.py --out verify.json``.
FlashInfer columns appear when ``import flashinfer`` works; otherwise they are
skipped and the table says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/progress.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402
from ssmstate.layout import SCALE_NAME  # noqa: E402
from ssmstate.backends.flashinfer_tune import time_us  # noqa: E402

from progress import progress  # noqa: E402  (benchmarks/progress.py: tqdm on a terminal, plain lines in a log)

H, P, N, G = 128, 64, 128, 8
DEV = "cuda"
SMOKE = False  # --cpu-smoke: the whole script on CPU under the Triton interpreter, toy sizes, timings meaningless
ACCEPT_P = 0.7
#: launches tried by --sweep: every named launch shape of the TMA kernel (``launch_table.json``) and the portable
#: kernel's streamed one, each as :func:`ssmstate.ops.triton.override` takes it (a shape the batch cannot take, such
#: as the split launches past 1,024 rows, is recorded as failed)
SWEEP = [{"shape": s} for s in ("latency", "one_head", "split", "pipelined", "ldg_stream")]


def split_config(cfg: dict | None, default_rc: int) -> tuple[dict | None, bool]:
    """A sweep config's launch override keys and whether it passes row cursors (its ``ROW_CURSORS`` key, a
    benchmark key: ``replay_verify(row_cursors=...)``, not a launch key; ``--row-cursors`` when absent)."""
    if cfg is None or "ROW_CURSORS" not in cfg:
        return cfg, bool(default_rc)
    rest = {k: v for k, v in cfg.items() if k != "ROW_CURSORS"}
    return rest or None, bool(cfg["ROW_CURSORS"])


def log(*a):
    print(*a, flush=True)


def load_flashinfer(skip: bool):
    """``(flashinfer, version)``, or ``(None, None)`` when ``skip`` or not importable. Points FlashInfer's JIT at the
    toolkit holding ``nvcc`` (``CUDA_HOME``) and at sm_90a unless the environment says otherwise."""
    nvcc = shutil.which("nvcc")
    if nvcc and "CUDA_HOME" not in os.environ:
        os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    if skip:
        return None, None
    try:
        import flashinfer
        import flashinfer.mamba  # noqa: F401
    except Exception as exc:
        log(f"flashinfer not importable ({exc!r}); FlashInfer columns skipped")
        return None, None
    return flashinfer, flashinfer.__version__


# -- timing -----------------------------------------------------------------------------


def time_calls(fns, reps: int, min_calls: int = 16) -> float:
    """Median µs per call of ``fns`` (one call each, in order, repeated to at least ``min_calls`` calls) replayed as
    one CUDA graph: the graph's own launch (several µs) is spread over many calls, as over a model's layers."""
    if SMOKE:
        t0 = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - t0) * 1e6 / len(fns)
    for f in fns:  # an eager call of each first (compiles, autotuning), outside the graph's warm-up
        f()
    torch.cuda.synchronize()
    return time_us(fns, reps, min_calls)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written, TB/s (median of 5)."""
    if SMOKE:
        return 0.01
    n = 2 * 1024 ** 3 // 4
    a = torch.empty(n, dtype=torch.float32, device=DEV).normal_()
    b = torch.empty_like(a)
    for _ in range(2):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 / statistics.median(ts) / 1e12


# -- acceptance model -------------------------------------------------------------------


def draw_accepted(rng: random.Random, T: int) -> int:
    a = 1
    while a < T and rng.random() < ACCEPT_P:
        a += 1
    return a


def steady_state(T: int, W: int, rows: int, seed: int = 0) -> tuple[list[int], float]:
    """Committed-row counts of ``rows`` independent requests after a long run, and the flush fraction."""
    rng = random.Random(seed)
    flushes = total = 0
    cs = []
    for _ in range(max(rows, 1)):
        c = 0
        for step in range(400):
            flushed = c + T > W
            if step >= 100:
                flushes += flushed
                total += 1
            a = draw_accepted(rng, T)
            c = a if flushed else c + a
        cs.append(c)
    return cs, flushes / total


# -- bytes model -------------------------------------------------------------------------


def bytes_model(layout: PageLayout, c: float, q: int, flush_frac: float) -> dict[str, float]:
    """Bytes per row per call (see the module docstring)."""
    g = layout.geometry
    specs = {t.name: t for t in layout.tensors}
    R = layout.spec.ring_len
    S = specs["checkpoint"].nbytes
    ring_row = (specs["x_ring"].nbytes + specs["B_ring"].nbytes + specs["dt_ring"].nbytes) / R
    s_act = torch.empty((), dtype=g.act_dtype).element_size()
    Hh, Pp, Nn, Gg = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    tok_in = Hh * Pp * s_act + 2 * Gg * Nn * s_act + Hh * s_act  # x, B, C, dt
    tok_out = Hh * Pp * s_act
    base = S + c * ring_row + q * (tok_in + tok_out + ring_row)
    return {
        "nonflush": base,
        "flush": base + S,
        "amortized": base + flush_frac * S,
        "native": (1 + q) * S + q * (tok_in + tok_out),
        "state": S,
    }


# -- one (T, W) configuration ---------------------------------------------------------------


class Pool:
    """Pages in the shared layout, filled with random data, plus inputs for the largest batch. The layout's state
    dtype decides the checkpoint: an 8-bit one holds random fp32 states encoded (codes in ``ck``, decode scales in
    ``scale``); any other is drawn in its own dtype, ``scale`` None."""

    def __init__(self, layout: PageLayout, pages: int, max_batch: int, seed: int):
        torch.manual_seed(seed)
        dev = DEV
        self.layout = layout
        T, R = layout.spec.num_tokens, layout.spec.ring_len
        specs = {t.name: t for t in layout.tensors}
        ck = specs["checkpoint"]
        if SCALE_NAME in specs:
            from ssmstate.ops import quant
            self.ck, self.scale = quant.encode(torch.empty((pages, *ck.shape), device=dev).normal_(0, 0.1), ck.dtype)
        else:
            self.ck, self.scale = torch.empty((pages, *ck.shape), dtype=ck.dtype, device=dev).normal_(0, 0.1), None
        self.xr = torch.empty((pages, *specs["x_ring"].shape), dtype=specs["x_ring"].dtype, device=dev).normal_()
        self.Br = torch.empty((pages, *specs["B_ring"].shape), dtype=specs["B_ring"].dtype, device=dev).normal_()
        self.dtr = torch.rand((pages, *specs["dt_ring"].shape), device=dev) * 0.1
        self.rs = torch.randint(0, R, (pages,), dtype=torch.int32, device=dev)
        self.nc = torch.zeros(pages, dtype=torch.int32, device=dev)
        self.pend = torch.zeros(pages, dtype=torch.int32, device=dev)
        self.cs = torch.zeros(pages, dtype=torch.int32, device=dev)
        L = max_batch * T
        act = layout.geometry.act_dtype
        self.x = torch.randn(L, H, P, device=dev, dtype=act)
        self.dt = (torch.randn(L, H, device=dev) * 0.5).to(act)
        self.B = torch.randn(L, G, N, device=dev, dtype=act)
        self.C = torch.randn(L, G, N, device=dev, dtype=act)
        self.out = torch.empty(L, H, P, device=dev, dtype=act)
        self.A = -torch.rand(H, device=dev) * 2 - 0.5
        self.D = torch.randn(H, device=dev)
        self.dt_bias = torch.rand(H, device=dev) * 0.1

    def nbytes_per_page(self) -> int:
        own = (self.ck, self.xr, self.Br, self.dtr) + (() if self.scale is None else (self.scale,))
        return sum(t[0].numel() * t.element_size() for t in own)

    def batch_sets(self, b: int, T: int, nsets: int):
        """``cu_seqlens`` of ``b`` rows of ``T`` tokens, ``nsets`` disjoint page sets of ``b`` pages (pages 1..), and
        each set's row cursors (as ``StepPlan.row_cursors``: gathered per step, outside the timed graphs; see
        :meth:`set_committed`)."""
        cu = torch.arange(0, b * T + 1, T, dtype=torch.int32, device=DEV)
        sets = [torch.arange(1 + j * b, 1 + (j + 1) * b, dtype=torch.int32, device=DEV) for j in range(nsets)]
        return cu, sets, [torch.zeros((2, b), dtype=torch.int32, device=DEV) for _ in sets]

    def set_committed(self, sets, rcs, cs: list[int]) -> None:
        """Row i of every set gets ``cs[i]`` committed rows; the sets' row cursors are gathered again."""
        for ids, rc in zip(sets, rcs):
            self.nc[ids.long()] = torch.tensor(cs, dtype=torch.int32, device=DEV)
            rc.copy_(torch.stack((self.rs[ids.long()], self.nc[ids.long()])))


def bench_config(T: int, W: int, batches: list[int], fi, args, l2: int, copy_tbps: float) -> list[dict]:
    import attrs

    from ssmstate.ops import triton as trk

    geom = Mamba2Geometry(num_heads=H, head_dim=P, state_size=N, n_groups=G, conv_kernel=4, num_layers=1,
                          state_dtype=torch.float32, act_dtype=torch.bfloat16)
    layout = PageLayout.replay(geom, SpecConfig(T - 1, window=W))
    R = layout.spec.ring_len
    page_bytes = layout.layer_page_bytes
    sets_for = {b: max(2, math.ceil(4 * l2 / (b * page_bytes))) for b in batches}
    pages = 1 + max(sets_for[b] * b for b in batches)
    pool = Pool(layout, pages, max(batches), seed=T * 100 + W)
    log(f"\n== T={T} W={W} R={R}: pool {pages} pages x {page_bytes / 2**20:.2f} MiB "
        f"= {pages * page_bytes / 2**30:.2f} GiB")
    c_nf, c_fl = min(W - T, W // 2), min(W, W - T + 2)
    _, flush_frac = steady_state(T, W, 256)
    use_fi = fi is not None and W <= 16 and (args.fi_configs is None or f"{T}:{W}" in args.fi_configs.split(","))
    rows = []
    for b in batches:
        nsets = sets_for[b]
        L = b * T
        cu, sets, rcs = pool.batch_sets(b, T, nsets)
        x, dt, B, C, out = pool.x[:L], pool.dt[:L], pool.B[:L], pool.C[:L], pool.out[:L]
        row = {"T": T, "W": W, "batch": b, "page_sets": nsets, "c_nonflush": c_nf, "c_flush": c_fl,
               "flush_fraction": flush_frac}

        def ours(j, cfg=None):
            cfg, use_rc = split_config(cfg, args.row_cursors)

            def call():
                with trk.override(**(cfg or {})):
                    trk.replay_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, pool.A, B, C,
                                      sets[j], cu, W, out, D=pool.D, dt_bias=pool.dt_bias,
                                      row_cursors=rcs[j] if use_rc else None)
            return call

        def set_c(cs):
            pool.set_committed(sets, rcs, cs)

        mixed_cs, _ = steady_state(T, W, b, seed=b)
        # mixed_flush_first: the same rows with the flush rows first (row order = launch order): how much of the
        # mixed batch's time is its tail of long flush programs (ours only)
        flush_first = sorted(mixed_cs, key=lambda c: c + T <= W)
        # one_flush: one flush row (the last in launch order) among non-flush rows: what a step with a single flush
        # row costs against one whose rows all flush, the trade-off of folding every row's history together
        scen = {"nonflush": [c_nf] * b, "flush": [c_fl] * b, "mixed": mixed_cs, "mixed_flush_first": flush_first,
                "one_flush": [c_nf] * (b - 1) + [c_fl]}
        cfg_used = None
        set_c(scen["nonflush"])
        aligned = trk.common.rows_aligned(pool.xr, pool.Br, x, B)
        row["heuristic"] = attrs.asdict(trk.verify.verify_launch(pool.ck, x, B, C, R, G, T, b, aligned=aligned))
        row["ours_default_nonflush_us"] = time_calls([ours(j) for j in range(nsets)], args.reps)
        if args.sweep:
            # every candidate on both routes; ours_* below use the fastest non-flush candidate
            for name in ("flush", "mixed"):
                set_c(scen[name])
                row[f"ours_default_{name}_us"] = time_calls([ours(j) for j in range(nsets)], args.reps)
            results = [{"config": {"shape": row["heuristic"]["shape"]}, "default": True,
                        "nonflush_us": row["ours_default_nonflush_us"], "flush_us": row["ours_default_flush_us"],
                        "mixed_us": row["ours_default_mixed_us"]}]
            log(f"  sweep b={b} default {row['heuristic']}: nonflush {row['ours_default_nonflush_us']:.2f} us, "
                f"flush {row['ours_default_flush_us']:.2f} us, mixed {row['ours_default_mixed_us']:.2f} us")
            for cfg in SWEEP:
                res = {"config": cfg}
                try:
                    for name in ("nonflush", "flush", "mixed"):
                        set_c(scen[name])
                        res[f"{name}_us"] = time_calls([ours(j, cfg) for j in range(nsets)], args.reps)
                except Exception as exc:  # a candidate that does not compile or launch is recorded and skipped
                    res["error"] = repr(exc)[:300]
                    log(f"  sweep b={b} {cfg}: failed {res['error']:.200}")
                    results.append(res)
                    continue
                log(f"  sweep b={b} {cfg}: nonflush {res['nonflush_us']:.2f} us, flush {res['flush_us']:.2f} us, "
                    f"mixed {res['mixed_us']:.2f} us")
                results.append(res)
            ok = [r for r in results if "error" not in r]
            row["sweep_results"] = results
            for name in ("nonflush", "flush"):
                win = min(ok, key=lambda r: r[f"{name}_us"])
                row[f"sweep_best_{name}"] = {"config": win["config"], "us": win[f"{name}_us"],
                                             "default": bool(win.get("default"))}
                log(f"  sweep b={b} best {name}: {win['config']} {win[f'{name}_us']:.2f} us")
            best = row["sweep_best_nonflush"]
            cfg_used = None if best["default"] else best["config"]
            row["config_used"] = best["config"]
        else:
            row["config_used"] = row["heuristic"]
        for name, cs in scen.items():
            set_c(cs)
            row[f"ours_{name}_us"] = time_calls([ours(j, cfg_used) for j in range(nsets)], args.reps)
        # the per-step row-cursor gather (StepPlan.row_cursors; once per step, not per layer): the manager's
        # index_select over the cursors into a persistent buffer
        cur2 = torch.stack((pool.rs, pool.nc)).t()
        gbuf = torch.zeros((b, 2), dtype=torch.int32, device=DEV)
        row["ours_gather_us"] = time_calls(
            [lambda ids=ids: torch.index_select(cur2, 0, ids, out=gbuf) for ids in sets], args.reps)
        # commit: one single-program launch per step (accepted = pending = 0 keeps it idempotent)
        acc = torch.zeros(b, dtype=torch.int32, device=DEV)
        err = torch.zeros(1, dtype=torch.int32, device=DEV)
        row["ours_commit_us"] = time_calls(
            [lambda ids=ids: trk.replay_commit(pool.rs, pool.nc, pool.pend, pool.cs, ids, acc, W, R, True, err)
             for ids in sets], args.reps)
        f = row["flush_fraction"]
        row["ours_amortized_us"] = (1 - f) * row["ours_nonflush_us"] + f * row["ours_flush_us"]
        if use_fi:
            try:
                fi_bench(fi, pool, layout, b, sets, scen, set_c, row, args)
            except Exception as exc:  # keep ours when FlashInfer breaks
                row["fi_error"] = repr(exc)[:400]
                log("  flashinfer failed:", row["fi_error"])
            try:
                native_bench(fi, layout, b, row, args, l2)
            except Exception as exc:
                row["native_error"] = repr(exc)[:400]
                log("  native failed:", row["native_error"])
        bm_nf = bytes_model(layout, c_nf, T, 0)
        bm_fl = bytes_model(layout, c_fl, T, 1)
        mean_c = sum(mixed_cs) / len(mixed_cs)
        bm_mix = bytes_model(layout, mean_c, T, sum(c + T > W for c in mixed_cs) / b)
        row["bytes_per_row"] = {"nonflush": bm_nf["nonflush"], "flush": bm_fl["flush"],
                                "mixed": bm_mix["amortized"], "native": bm_nf["native"]}
        for key, bkey, tkey in (("nonflush", "nonflush", "ours_nonflush_us"), ("flush", "flush", "ours_flush_us"),
                                ("mixed", "mixed", "ours_mixed_us")):
            row[f"ours_{key}_TBps"] = b * row["bytes_per_row"][bkey] / (row[tkey] * 1e-6) / 1e12
        row["ours_nonflush_frac_of_copy"] = row["ours_nonflush_TBps"] / copy_tbps
        for algo in ("auto", "monolith", "tuned"):
            k = f"fi_nonflush_{algo}_us"
            if k in row:
                row[f"fi_nonflush_{algo}_TBps"] = b * bm_nf["nonflush"] / (row[k] * 1e-6) / 1e12
        fis = [row[k] for k in ("fi_nonflush_auto_us", "fi_nonflush_monolith_us", "fi_nonflush_tuned_us") if k in row]
        if fis:
            row["fi_nonflush_best_us"] = min(fis)
            row["speedup_nonflush_vs_fi_best"] = row["fi_nonflush_best_us"] / row["ours_nonflush_us"]
            fls = [row[k] for k in ("fi_flush_auto_us", "fi_flush_monolith_us", "fi_flush_tuned_us") if k in row]
            if fls:
                row["fi_flush_best_us"] = min(fls)
                row["fi_amortized_best_us"] = (1 - f) * row["fi_nonflush_best_us"] + f * row["fi_flush_best_us"]
                row["speedup_amortized_vs_fi_best"] = row["fi_amortized_best_us"] / row["ours_amortized_us"]
            mxs = [row[k] for k in ("fi_mixed_auto_us", "fi_mixed_monolith_us", "fi_mixed_tuned_us") if k in row]
            if mxs and "ours_mixed_us" in row:  # the same measured mixed batch: tails included on both sides
                row["fi_mixed_best_us"] = min(mxs)
                row["speedup_mixed_vs_fi_best"] = row["fi_mixed_best_us"] / row["ours_mixed_us"]
        if "native_us" in row:
            row["native_TBps"] = b * bm_nf["native"] / (row["native_us"] * 1e-6) / 1e12
            row["speedup_amortized_vs_native"] = row["native_us"] / row["ours_amortized_us"]
            if "ours_mixed_us" in row:
                row["speedup_mixed_vs_native"] = row["native_us"] / row["ours_mixed_us"]
        log("  " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                               if k != "bytes_per_row"}))
        rows.append(row)
    del pool
    if not SMOKE:
        torch.cuda.empty_cache()
    return rows


def fi_caller(pool: Pool, b: int, T: int, W: int, out: torch.Tensor | None = None):
    """``call(ids, algorithm) -> fn``: FlashInfer's checkpointing_ssu on the pool's pages for ``b`` rows of ``T``
    tokens, as every FlashInfer figure of these benchmarks calls it (the pool's decode scales with an 8-bit
    checkpoint; ``out``: (b * T, H, P), default the pool's; algorithm ``"tuned"``: none given, the autotuner's)."""
    from flashinfer.mamba import allocate_checkpointing_ssu_scratch, checkpointing_ssu

    L = b * T
    act = pool.x.dtype
    x = pool.x[:L].view(b, T, H, P)
    dt = pool.dt[:L].view(b, T, H, 1).expand(b, T, H, P)
    Bm, Cm = pool.B[:L].view(b, T, G, N), pool.C[:L].view(b, T, G, N)
    ov = (pool.out[:L] if out is None else out).view(b, T, H, P)
    A = pool.A[:, None, None].expand(H, P, N)
    D = pool.D.to(act)[:, None].expand(H, P)
    dtb = pool.dt_bias.to(act)[:, None].expand(H, P)
    scratch = allocate_checkpointing_ssu_scratch(b, H, T, W, act, torch.device(DEV))
    scale = {} if pool.scale is None else {"state_scale": pool.scale}

    def call(ids, algo):
        kw = {} if algo == "tuned" else {"algorithm": algo}
        return lambda: checkpointing_ssu(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, A, Bm, Cm, ov,
                                         D=D, dt_bias=dtb, dt_softplus=True, state_batch_indices=ids, pad_slot_id=0,
                                         cb_scaled=scratch[0], cumAdt_vec=scratch[1], cb_old=scratch[2], **scale,
                                         **kw)
    return call


#: the scenarios FlashInfer is timed on (mixed_flush_first is ours only)
FI_SCENARIOS = ("nonflush", "flush", "mixed", "one_flush")


def fi_bench(fi, pool: Pool, layout: PageLayout, b: int, sets, scen, set_c, row: dict, args) -> None:
    call = fi_caller(pool, b, layout.spec.num_tokens, layout.spec.window)
    for name in FI_SCENARIOS:
        set_c(scen[name])
        for algo in ("auto", "monolith"):
            row[f"fi_{name}_{algo}_us"] = time_calls([call(ids, algo) for ids in sets], args.reps)
    set_c(scen["nonflush"])
    t0 = time.time()
    with fi.autotune(True):
        call(sets[0], "tuned")()
    torch.cuda.synchronize()
    row["fi_autotune_s"] = time.time() - t0
    for name in FI_SCENARIOS:
        set_c(scen[name])
        row[f"fi_{name}_tuned_us"] = time_calls([call(ids, "tuned") for ids in sets], args.reps)


def native_bench(fi, layout: PageLayout, b: int, row: dict, args, l2: int) -> None:
    from flashinfer.mamba import selective_state_update

    T = layout.spec.num_tokens
    act = layout.geometry.act_dtype
    S = H * P * N * 4
    nsets = max(2, math.ceil(4 * l2 / (b * T * S)))
    st = torch.empty(1 + nsets * b * T, H, P, N, device=DEV).normal_(0, 0.1)
    x = torch.randn(b, T, H, P, device=DEV, dtype=act)
    dt = (torch.randn(b, T, H, 1, device=DEV) * 0.5).to(act).expand(b, T, H, P)
    Bm = torch.randn(b, T, G, N, device=DEV, dtype=act)
    Cm = torch.randn(b, T, G, N, device=DEV, dtype=act)
    out = torch.empty(b, T, H, P, device=DEV, dtype=act)
    A = (-torch.rand(H, device=DEV) * 2 - 0.5)[:, None, None].expand(H, P, N)
    D = torch.randn(H, device=DEV, dtype=act)[:, None].expand(H, P)
    dtb = (torch.rand(H, device=DEV) * 0.1).to(act)[:, None].expand(H, P)
    acc = torch.full((b,), min(2, T), device=DEV, dtype=torch.int32)
    tables = [torch.arange(1 + j * b * T, 1 + (j + 1) * b * T, device=DEV, dtype=torch.int32).view(b, T)
              for j in range(nsets)]
    fns = [lambda tbl=tbl: selective_state_update(st, x, dt, A, Bm, Cm, D, dt_bias=dtb, dt_softplus=True,
                                                  state_batch_indices=tbl, dst_state_batch_indices=tbl,
                                                  num_accepted_tokens=acc, out=out, cache_steps=T)
           for tbl in tables]
    row["native_us"] = time_calls(fns, args.reps)
    row["native_page_sets"] = nsets
    del st


# -- report ------------------------------------------------------------------------------


def print_table(rows: list[dict], copy_tbps: float, have_fi: bool) -> None:
    log(f"\ncopy bandwidth (read + write): {copy_tbps:.2f} TB/s")
    if not have_fi:
        log("FlashInfer not importable: FlashInfer and native columns skipped")
    hdr = (f"{'T':>2} {'W':>3} {'batch':>5} | {'nf us':>7} {'TB/s':>5} {'%cp':>4} | {'fl us':>7} {'TB/s':>5} | "
           f"{'mix us':>7} {'amort':>7} {'fl%':>4} | {'FI auto':>7} {'FI mono':>7} {'FI tune':>7} {'vsFI':>5} "
           f"{'vsFIam':>6} {'FI mix':>7} {'vsFImx':>6} | {'native':>8} {'vsNat':>5} {'vsNmx':>5}")
    log(hdr)
    log("-" * len(hdr))

    def f(row, k, w=7, p=2):
        v = row.get(k)
        return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

    for r in rows:
        log(f"{r['T']:>2} {r['W']:>3} {r['batch']:>5} | {f(r, 'ours_nonflush_us')} {f(r, 'ours_nonflush_TBps', 5)} "
            f"{100 * r['ours_nonflush_frac_of_copy']:>4.0f} | {f(r, 'ours_flush_us')} {f(r, 'ours_flush_TBps', 5)} | "
            f"{f(r, 'ours_mixed_us')} {f(r, 'ours_amortized_us')} {100 * r['flush_fraction']:>4.0f} | "
            f"{f(r, 'fi_nonflush_auto_us')} {f(r, 'fi_nonflush_monolith_us')} {f(r, 'fi_nonflush_tuned_us')} "
            f"{f(r, 'speedup_nonflush_vs_fi_best', 5)} {f(r, 'speedup_amortized_vs_fi_best', 6)} "
            f"{f(r, 'fi_mixed_best_us')} {f(r, 'speedup_mixed_vs_fi_best', 6)} | "
            f"{f(r, 'native_us', 8)} {f(r, 'speedup_amortized_vs_native', 5)} {f(r, 'speedup_mixed_vs_native', 5)}")
    log("nf/fl: every row non-flush / flush; mix: measured batch at steady-state cursors; amort = (1-f) nf + f fl "
        "with f = fl% (acceptance p=0.7 per draft); vsFI = FI best nf / ours nf; vsFIam = same, amortized; "
        "FI mix = FI best on the same mixed batch, vsFImx = FI mix / ours mix; vsNat = native / ours amortized; "
        "vsNmx = native / ours mix. TB/s from the bytes model below.")
    for r in rows:
        if "sweep_results" not in r:
            continue
        log(f"sweep T={r['T']} W={r['W']} batch={r['batch']} (us nonflush / flush):")
        for res in r["sweep_results"]:
            c = res["config"]
            tag = (" ".join(f"{k}={v}" for k, v in c.items())
                   + (" (heuristic)" if res.get("default") else ""))
            got = (f"{res['nonflush_us']:8.2f} {res['flush_us']:8.2f}" if "error" not in res
                   else f"failed: {res['error'][:80]}")
            log(f"  {tag:<60} {got}")
    seen = set()
    for r in rows:
        key = (r["T"], r["W"])
        if key in seen:
            continue
        seen.add(key)
        bm = r["bytes_per_row"]
        log(f"bytes per row T={r['T']} W={r['W']}: nonflush {bm['nonflush'] / 1e6:.3f} MB (c={r['c_nonflush']}), "
            f"flush {bm['flush'] / 1e6:.3f} MB (c={r['c_flush']}), native {bm['native'] / 1e6:.3f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="verify.json")
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,8,32,64,128,256; --cpu-smoke: 1,2)")
    ap.add_argument("--configs", default=None, help="T:W pairs (default 4:16,2:16,8:16,4:32,8:32; --cpu-smoke: 4:16)")
    ap.add_argument("--reps", type=int, default=None, help="timed replays per figure (default 15; --cpu-smoke: 1)")
    ap.add_argument("--sweep", action="store_true",
                    help="time our named launch shapes (SWEEP) per point on both routes (sweep_results, "
                         "sweep_best_nonflush / sweep_best_flush) and report ours with the fastest non-flush one "
                         "(the built-in heuristic is reported too, as ours_default_nonflush_us)")
    ap.add_argument("--sweep-configs", default=None,
                    help="JSON list of launch overrides (ssmstate.ops.triton.override keys) to sweep instead of SWEEP "
                         "(implies --sweep)")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--quant", action="store_true", help="also the 8-bit table (benchmarks/bench_verify_quant.py)")
    ap.add_argument("--row-cursors", type=int, default=1, choices=(0, 1),
                    help="ours reads each row's cursors from a per-step gather (StepPlan.row_cursors, as the manager "
                         "passes them; 1) or at its page (0); a sweep config's ROW_CURSORS key overrides it")
    ap.add_argument("--fi-configs", default=None,
                    help="T:W pairs that also run FlashInfer (default: every pair with W <= 16); FlashInfer "
                         "JIT-compiles checkpointing_ssu once per T, minutes each")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script end to end on CPU under TRITON_INTERPRET=1 at toy sizes (CI smoke test; "
                         "T=4 W=16, batches 1 and 2, the reference-checked Triton kernels interpreted; timings "
                         "meaningless; under a minute)")
    args = ap.parse_args()
    t0 = time.time()
    global DEV, SMOKE, H, P, N, G, SWEEP
    if args.sweep_configs:
        SWEEP = json.loads(args.sweep_configs)
        args.sweep = True
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, SMOKE, H, P, N, G = "cpu", True, 4, 16, 16, 2
        args.no_flashinfer = True
    elif not torch.cuda.is_available():
        sys.exit("bench_verify.py needs a CUDA GPU")
    smoke_or = (lambda smoke, full: smoke if args.cpu_smoke else full)  # noqa: E731
    args.batches = args.batches or smoke_or("1,2", "1,8,32,64,128,256")
    args.configs = args.configs or smoke_or("4:16", "4:16,2:16,8:16,4:32,8:32")
    args.reps = args.reps or smoke_or(1, 15)
    fi, fi_version = load_flashinfer(args.no_flashinfer)
    import triton
    if SMOKE:
        name, sms, l2 = "cpu (Triton interpreter smoke run)", 1, 0  # no L2 to defeat: two page sets per batch
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
        l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    env = {"gpu": name, "sms": sms, "l2_bytes": l2, "torch": torch.__version__,
           "triton": triton.__version__, "flashinfer": fi_version, "python": platform.python_version(),
           "cuda_home": os.environ.get("CUDA_HOME"), "command": " ".join(sys.argv)}
    log(json.dumps(env))
    copy_tbps = copy_bandwidth()
    log(f"copy bandwidth {copy_tbps:.2f} TB/s")
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict] = []

    def save() -> None:  # after every (T, W): a run cut short still leaves its results
        res = {"env": env, "copy_TBps": copy_tbps, "geometry": {"H": H, "P": P, "N": N, "G": G,
               "state": "float32", "act": "bfloat16"}, "accept_p": ACCEPT_P, "sweep": SWEEP if args.sweep else None,
               "rows": rows, "seconds": time.time() - t0}
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)

    pairs = args.configs.split(",")
    bar = progress(len(pairs), "bench_verify (T:W pairs)")
    for pair in pairs:
        T, W = (int(v) for v in pair.split(":"))
        rows += bench_config(T, W, batches, fi, args, l2, copy_tbps)
        save()
        bar.update(1)
    bar.close()
    print_table(rows, copy_tbps, fi is not None)
    if args.quant:  # the 8-bit table, its rows saved beside the others ("quant_rows")
        __import__("bench_verify_quant").append_rows(args.out, batches, fi, args, l2, sys.modules[__name__])
    log(f"wrote {args.out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
