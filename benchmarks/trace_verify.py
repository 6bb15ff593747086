"""Where a verify call's time goes: per-program timelines of the Triton TMA verify kernel on one GPU.

For each batch and scenario (every row non-flush, every row flush, the steady-state mixed batch of
``bench_verify.py``, and an empty batch of padding rows) it

* times the call as ``bench_verify.py`` does (CUDA graph over several disjoint page sets, cold pages), and
* replays the traced build (``replay_verify(trace=...)``: ``%globaltimer`` and ``%clock64`` stamps per program) in
  the same kind of graph, each call with its own trace buffer, and reports from the last replay, as medians over
  the graph's calls (the first one skipped where there are more than two):

  - ``period``: from one call's first program start to the next call's: the traced call's time;
  - ``span`` per launch: its first program start to its last program end; ``gap``: from a call's last program
    end to the next call's first program start (launch latency and ramp, nothing running);
  - per program (median / 90th percentile over the launch's programs): ``ramp`` (its start after the launch's
    first), ``rank`` (persistent launches: loading and ranking the rows), ``lead`` (from there to its first
    segment), per segment (a run of one row's heads: ``cursor`` from its start to its cursors, ``gram`` to its
    Gram, ``heads`` to its last head, per head), ``segs``, ``busy`` (its start to its end) and ``tail`` (its end
    before the launch's last).

With ``--chain 1`` (or ``2``) each call is a layer instead: our ``conv_update`` on the call's pages, then the traced
verify reading x, B and C as views of the conv's output, as ``bench_layer_chain.py`` runs them; ``2`` launches both
as programmatic dependents (``pdl=True``), so a verify program starts while the conv runs and its ``seg0_cursor``
holds its wait for the conv. ``period`` is then a layer's time and ``after_cursor`` (per program: its cursors known,
after the wait and the C rows' load, to its end) the part of the verify that follows the conv.

Durations inside a program come from ``%clock64`` converted with the program's own ns per cycle (its
``%globaltimer`` span over its cycle span), cross-program times from ``%globaltimer``. A traced build is not the
timed build (each stamp waits for its value): compare ``period`` with the untraced ``us`` to see what the
stamps cost.

Run (repo root, GPU): ``python benchmarks/trace_verify.py --batches 1,32,256 --out trace.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_layer_chain as blc  # noqa: E402
import bench_verify as bv  # noqa: E402
from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402
from ssmstate.ops.triton import verify as trk  # noqa: E402

SLOTS = trk.TRACE_SLOTS  # stamps per program
SEGS = trk.TRACE_SEGS  # segments whose stamps a program keeps (later ones reuse the last)


def replay_graph(fns, reps: int = 3) -> None:
    """Capture ``fns`` as one CUDA graph and replay it ``reps`` times (warm builds first)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()


def pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(q * len(vals)))]


def launch_stats(tr: torch.Tensor) -> dict | None:
    """One launch's programs (``tr``: (programs, SLOTS, 2) int64, host) as the module docstring's metrics, ns (and
    the launch's first start and last end, ``%globaltimer`` ns)."""
    g, k = tr[..., 0].double(), tr[..., 1].double()
    ran = g[:, 0] > 0
    if not bool(ran.any()):
        return None
    g, k = g[ran], k[ran]
    start, end = float(g[:, 0].min()), float(g[:, SLOTS - 1].max())
    span_g, span_k = g[:, SLOTS - 1] - g[:, 0], k[:, SLOTS - 1] - k[:, 0]
    long = span_g > 2000  # programs long enough for a coarse global timer: their ns per cycle
    rate = float((span_g[long] / span_k[long]).median()) if bool(long.any()) else 1 / 1.98
    d = lambda a, b: ((k[:, b] - k[:, a]) * rate).tolist()  # noqa: E731  (cycles between two slots, as ns)
    segs = g[:, SLOTS - 2]
    out: dict = {"programs": int(ran.sum()), "start": start, "end": end, "span": end - start, "ns_per_cycle": rate,
                 "ramp": (g[:, 0] - start).tolist(), "busy": d(0, SLOTS - 1), "tail": (end - g[:, SLOTS - 1]).tolist(),
                 "segs": segs.tolist()}
    ranked = bool((k[:, 1] > 0).any())
    if ranked:
        out["rank"] = d(0, 1)
    first = k[:, 2] > 0  # programs that started a segment
    if bool(first.any()):
        out["lead"] = ((k[first, 2] - k[first, 1 if ranked else 0]) * rate).tolist()  # to the first segment's start
        out["after_cursor"] = ((k[first, SLOTS - 1] - k[first, 3]) * rate).tolist()  # first cursors known to its end
    for s in range(SEGS):
        b = 2 + 5 * s
        has = (segs > s) & (k[:, b + 3] > 0) if s < SEGS - 1 else (segs >= SEGS) & (k[:, b + 3] > 0)
        if not bool(has.any()):
            continue
        kk = k[has]
        nh = g[has][:, b + 4].clamp(min=1)
        name = f"seg{s}" if s < SEGS - 1 else "seg_last"
        out[f"{name}_cursor"] = ((kk[:, b + 1] - kk[:, b]) * rate).tolist()
        out[f"{name}_gram"] = ((kk[:, b + 2] - kk[:, b + 1]) * rate).tolist()
        out[f"{name}_heads"] = ((kk[:, b + 3] - kk[:, b + 2]) * rate).tolist()
        out[f"{name}_per_head"] = ((kk[:, b + 3] - kk[:, b + 2]) * rate / nh).tolist()
        out[f"{name}_nh"] = nh.tolist()
    return out


def summarize(calls: list[dict]) -> dict:
    """Medians over calls of each launch metric's (median, p90) over programs, in µs."""
    res: dict = {}
    for j in (0, 1):
        per = [c[j] for c in calls if c[j] is not None]
        if not per:
            continue
        lr: dict = {"programs": per[0]["programs"], "span_us": statistics.median(p["span"] for p in per) / 1e3,
                    "ns_per_cycle": statistics.median(p["ns_per_cycle"] for p in per)}
        for key in per[0]:
            if isinstance(per[0][key], list):
                scale = 1.0 if key.endswith("_nh") or key == "segs" else 1e-3
                lr[key] = {"p50": statistics.median(pct(p[key], 0.5) for p in per if key in p) * scale,
                           "p90": statistics.median(pct(p[key], 0.9) for p in per if key in p) * scale}
        res[f"launch{j}"] = lr
    return res


def run_point(pool, layout, b: int, scen: str, cs: list[int], cfg, args) -> dict:
    T, W, R = layout.spec.num_tokens, layout.spec.window, layout.spec.ring_len
    page_bytes = layout.layer_page_bytes
    nsets = max(2, math.ceil(4 * args.l2 / (b * page_bytes)))
    L = b * T
    cu = torch.arange(0, L + 1, T, dtype=torch.int32, device="cuda")
    if scen == "empty":
        sets = [torch.zeros(b, dtype=torch.int32, device="cuda") for _ in range(nsets)]
    else:
        sets = [torch.arange(1 + j * b, 1 + (j + 1) * b, dtype=torch.int32, device="cuda") for j in range(nsets)]
        for ids in sets:
            pool.nc[ids.long()] = torch.tensor(cs, dtype=torch.int32, device="cuda")
    x, dt, B, C, out = pool.x[:L], pool.dt[:L], pool.B[:L], pool.C[:L], pool.out[:L]
    conv = None
    if args.chain:  # a layer per call: the conv, then the verify reading its output (bench_layer_chain's layer)
        from ssmstate.ops.triton import conv as tcv

        win, shift, xBC, cw, cb, co = blc.conv_buffers(pool.ck.shape[0], L, T)
        x, B, C = blc.xbc_views(co)
        conv = lambda ids: tcv.conv_update(win, shift, xBC, cw, cb, ids, cu, co, pdl=args.chain == 2)  # noqa: E731
    progs = max(bv.H * (bv.P // 64) * b, 16 * args.sms)  # the one-head grid, or persistent launches' programs
    traces = torch.zeros(nsets, 2, progs, SLOTS, 2, dtype=torch.int64, device="cuda")
    launch_cfg, use_rc = bv.split_config(cfg, args.row_cursors)  # as bench_verify: row cursors by default
    rcs = [torch.stack((pool.rs[ids.long()], pool.nc[ids.long()])) if use_rc else None for ids in sets]

    def call(i, ids, traced):
        def run():
            if conv is not None:
                conv(ids)
            trk.replay_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, pool.A, B, C, ids, cu, W,
                              out, D=pool.D, dt_bias=pool.dt_bias, config=launch_cfg,
                              trace=traces[i] if traced else None, row_cursors=rcs[i], pdl=args.chain == 2)
        return run

    row = {"batch": b, "scenario": scen, "T": T, "W": W, "page_sets": nsets, "config": cfg, "chain": args.chain,
           "heuristic": trk.verify_config(b, bv.H, bv.P, bv.N, R, T, torch.device("cuda"), bv.G)}
    row["us"] = bv.time_calls([call(i, ids, False) for i, ids in enumerate(sets)], args.reps)
    replay_graph([call(i, ids, True) for i, ids in enumerate(sets)])
    traces.zero_()
    replay_graph([call(i, ids, True) for i, ids in enumerate(sets)], reps=1)
    host = traces.cpu()
    calls = [[launch_stats(host[i, j]) for j in (0, 1)] for i in range(nsets)]
    starts = [min(st["start"] for st in c if st is not None) for c in calls]
    ends = [max(st["end"] for st in c if st is not None) for c in calls]
    row["period_us"] = statistics.median(starts[i + 1] - starts[i] for i in range(nsets - 1)) / 1e3
    row["gap_us"] = statistics.median(starts[i + 1] - ends[i] for i in range(nsets - 1)) / 1e3
    row.update(summarize(calls[1:] if nsets > 2 else calls))
    return row


def fmt(v) -> str:
    if isinstance(v, dict):
        return f"{v['p50']:.2f}/{v['p90']:.2f}"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="trace.json")
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--scenarios", default="nonflush,flush,mixed,empty")
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--W", type=int, default=16)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--config", action="append", default=[],
                    help="JSON launch config (repeatable; default: heuristic); a ROW_CURSORS key as in bench_verify")
    ap.add_argument("--row-cursors", type=int, default=1, choices=(0, 1),
                    help="pass each row's cursors gathered per step (StepPlan.row_cursors; 1) or not (0)")
    ap.add_argument("--chain", type=int, default=0, choices=(0, 1, 2),
                    help="0 the verify alone; 1 each call a layer (our conv, then the verify on its output); 2 that "
                         "layer with both launched as programmatic dependents (pdl)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("trace_verify.py needs a CUDA GPU")
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    args.l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    args.sms = props.multi_processor_count
    T, W = args.T, args.W
    geom = Mamba2Geometry(num_heads=bv.H, head_dim=bv.P, state_size=bv.N, n_groups=bv.G, conv_kernel=4, num_layers=1,
                          state_dtype=torch.float32, act_dtype=torch.bfloat16)
    layout = PageLayout.replay(geom, SpecConfig(T - 1, window=W))
    batches = [int(v) for v in args.batches.split(",")]
    nsets = {b: max(2, math.ceil(4 * args.l2 / (b * layout.layer_page_bytes))) for b in batches}
    pool = bv.Pool(layout, 1 + max(nsets[b] * b for b in batches), max(batches), seed=T * 100 + W)
    c_nf, c_fl = min(W - T, W // 2), min(W, W - T + 2)
    configs = [json.loads(c) for c in args.config] or [None]
    rows = []
    for b in batches:
        mixed, _ = bv.steady_state(T, W, b, seed=b)
        cs = {"nonflush": [c_nf] * b, "flush": [c_fl] * b, "mixed": mixed, "empty": [0] * b}
        for cfg in configs:
            for scen in args.scenarios.split(","):
                row = run_point(pool, layout, b, scen, cs[scen], cfg, args)
                rows.append(row)
                print(f"b={b} {scen} {cfg or 'heuristic'}: {row['us']:.2f} us untraced, traced period "
                      f"{row['period_us']:.2f}, gap {row['gap_us']:.2f}", flush=True)
                for j in ("launch0", "launch1"):
                    if j in row:
                        print("  " + j + " " + " ".join(f"{k}={fmt(v)}" for k, v in row[j].items()), flush=True)
                with open(args.out, "w") as fh:
                    json.dump({"gpu": props.name, "T": T, "W": W, "rows": rows, "seconds": time.time() - t0}, fh,
                              indent=1)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
