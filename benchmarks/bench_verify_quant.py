"""8-bit checkpoint verify benchmark on one GPU: ssmstate Triton on int8 / fp8_e4m3fn checkpoints against our fp32
path and against FlashInfer's own int8 / fp8 ``checkpointing_ssu``, in one process.

Nemotron-H Mamba geometry per layer and TP rank (H=128, P=64, N=128, G=8), bf16 inputs, T=4, W=16 (FlashInfer's
window limit), batches 1..256. Every figure is the non-flush verify (every row ``c = W // 2`` history rows, the
common step: flushes are one step in several), plus the flush verify for reference, timed as
``benchmarks/bench_verify.py`` times (CUDA graphs of at least 16 calls cycling over disjoint page sets of at least
4x the L2 size: every call streams cold pages; the median of the replays):

* ``ours_fp32``: our verify on an fp32 checkpoint (its heuristic launch);
* ``ours_int8`` / ``ours_fp8``: our verify on the 8-bit checkpoint with its (pages, H, P) decode scales (the
  heuristic's launch), and with ``--sweep`` every named launch shape on both routes (``ours_sweep_nonflush_us``,
  ``ours_sweep_flush_us``), so the launch table can be set from data;
* ``fi_int8`` / ``fi_fp8``: FlashInfer's checkpointing_ssu on the same bytes and scales, its best algorithm per
  batch: "monolith", "auto" and "two-kernel" are each tried and the fastest kept (FlashInfer 0.7.2 runs 1-byte
  states in its monolithic kernel only: the two-kernel split takes 2- and 4-byte states, so that attempt is
  recorded as refused).

Targets (issue "8-bit checkpoints"): ours 8-bit >= 2x ours fp32 at batch >= 64, >= 1.0x FlashInfer 8-bit at every
batch.

Run (repo root): ``python benchmarks/bench_verify_quant.py --out verify_quant.json`` (FlashInfer columns when
``import flashinfer`` works; its 8-bit builds JIT-compile on first use). ``--cpu-smoke`` runs it on CPU under the
Triton interpreter at toy sizes (timings meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_verify as bv  # noqa: E402
from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402

DTYPES = {"fp32": torch.float32, "int8": torch.int8, "fp8": torch.float8_e4m3fn}
FI_ALGOS = ("monolith", "auto", "two-kernel")
#: --sweep: every named launch shape, and the one-head launch under other register caps (its 96 spill on 8-bit tiles)
SWEEP = [{"shape": s} for s in ("latency", "one_head", "pipelined", "split", "ldg", "ldg_stream")] + [
    {"shape": "one_head", "maxnreg": 128}, {"shape": "one_head", "maxnreg": 0}, {"shape": "split", "PROGS": 4},
    {"shape": "split", "maxnreg": 0}]


def label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def layout_of(dtype: torch.dtype, T: int, W: int) -> PageLayout:
    geom = Mamba2Geometry(num_heads=bv.H, head_dim=bv.P, state_size=bv.N, n_groups=bv.G, conv_kernel=4,
                          num_layers=1, state_dtype=dtype, act_dtype=torch.bfloat16)
    return PageLayout.replay(geom, SpecConfig(T - 1, window=W))


def bench_dtype(name: str, T: int, W: int, batches: list[int], fi, args, l2: int) -> dict[int, dict]:
    """Every batch's figures for one checkpoint dtype: ours (heuristic, and the sweep) and FlashInfer's."""
    from ssmstate.ops import triton as trk

    layout = layout_of(DTYPES[name], T, W)
    page_bytes = layout.layer_page_bytes
    sets_for = {b: max(2, math.ceil(4 * l2 / (b * page_bytes))) for b in batches}
    pages = 1 + max(sets_for[b] * b for b in batches)
    pool = bv.Pool(layout, pages, max(batches), seed=T * 100 + W)
    bv.log(f"\n== {name}: pool {pages} pages x {page_bytes / 2**20:.2f} MiB = {pages * page_bytes / 2**30:.2f} GiB")
    c_nf, c_fl = W // 2, W
    out: dict[int, dict] = {}
    for b in batches:
        nsets = sets_for[b]
        L = b * T
        cu = torch.arange(0, L + 1, T, dtype=torch.int32, device=bv.DEV)
        sets = [torch.arange(1 + j * b, 1 + (j + 1) * b, dtype=torch.int32, device=bv.DEV) for j in range(nsets)]
        x, dt, B, C, o = pool.x[:L], pool.dt[:L], pool.B[:L], pool.C[:L], pool.out[:L]
        row: dict = {"page_sets": nsets, "page_bytes": page_bytes}

        def ours(ids, cfg=None):
            def call():
                with trk.override(**(cfg or {})):
                    trk.replay_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, pool.A, B, C,
                                      ids, cu, W, o, D=pool.D, dt_bias=pool.dt_bias, checkpoint_scale=pool.scale)
            return call

        def timed(fn_of, cs: int) -> float:
            pool.nc[1:] = cs
            return bv.time_calls([fn_of(ids) for ids in sets], args.reps)

        row["ours_nonflush_us"] = timed(ours, c_nf)
        row["ours_flush_us"] = timed(ours, c_fl)
        if args.sweep and name != "fp32":
            for route, cs in (("nonflush", c_nf), ("flush", c_fl)):
                sweep = {}
                for cfg in SWEEP:
                    try:
                        sweep[label(cfg)] = timed(lambda ids, cfg=cfg: ours(ids, cfg), cs)
                    except Exception as exc:  # a shape this batch cannot take (split past its row limit) is recorded
                        sweep[label(cfg)] = repr(exc)[:200]
                row[f"ours_sweep_{route}_us"] = sweep
        if fi is not None and name != "fp32":
            fi_rows(fi, pool, layout, b, sets, o, row, args, c_nf)
        bv.log(f"  {name} b={b}: " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                                                for k, v in row.items()}))
        out[b] = row
    del pool
    if not bv.SMOKE:
        torch.cuda.empty_cache()
    return out


def fi_rows(fi, pool: bv.Pool, layout: PageLayout, b: int, sets, o, row: dict, args, c_nf: int) -> None:
    """FlashInfer's checkpointing_ssu on the pool's bytes and scales, each algorithm; the fastest is its figure."""
    call = bv.fi_caller(pool, b, layout.spec.num_tokens, layout.spec.window, out=o)

    pool.nc[1:] = c_nf
    times = {}
    for algo in FI_ALGOS:
        try:
            times[algo] = bv.time_calls([call(ids, algo) for ids in sets], args.reps)
        except Exception as exc:  # two-kernel refuses 1-byte states
            times[algo] = repr(exc)[:200]
    row["fi_nonflush_us_by_algorithm"] = times
    ok = {a: t for a, t in times.items() if isinstance(t, float)}
    if ok:
        best = min(ok, key=ok.get)
        row["fi_nonflush_best_us"], row["fi_best_algorithm"] = ok[best], best
        row["speedup_vs_fi"] = ok[best] / row["ours_nonflush_us"]


def append_rows(path: str, batches: list[int], fi, args, l2: int, bench) -> None:
    """``benchmarks/bench_verify.py --quant``: the 8-bit table after its own, the rows added to its JSON at
    ``path`` as ``quant_rows``; ``bench``: that script's module (its device, geometry and timing settings)."""
    global bv
    bv = bench
    quant = run_all(list(DTYPES), batches, fi, args, l2)
    with open(path) as fh:
        res = json.load(fh)
    with open(path, "w") as fh:
        json.dump(dict(res, quant_rows=quant), fh, indent=1)


def warm(name: str) -> None:
    """One FlashInfer call on a one-row pool of ``name`` checkpoints: its JIT build, cached for later processes."""
    fi, _ = bv.load_flashinfer(False)
    if fi is None:
        sys.exit("flashinfer is not importable")
    layout = layout_of(DTYPES[name], 4, 16)
    pool = bv.Pool(layout, 3, 1, seed=0)
    ids = [torch.tensor([1], dtype=torch.int32, device=bv.DEV)]
    args = argparse.Namespace(reps=1)
    fi_rows(fi, pool, layout, 1, ids, pool.out[:4], {"ours_nonflush_us": 1.0}, args, 8)
    torch.cuda.synchronize()
    bv.log(f"flashinfer {name} built")


def print_table(res: dict) -> None:
    bv.log(f"\nnon-flush verify, us per call (T=4, W=16, H={bv.H} P={bv.P} N={bv.N} G={bv.G}, bf16 inputs, "
           "cold pages):")
    hdr = (f"{'batch':>5} | {'fp32':>7} | {'int8':>7} {'x fp32':>6} {'FI int8':>8} {'x FI':>5} | "
           f"{'fp8':>7} {'x fp32':>6} {'FI fp8':>8} {'x FI':>5}")
    bv.log(hdr)
    bv.log("-" * len(hdr))
    fp32 = res.get("fp32", {})

    def f(v, w=7):
        return f"{v:>{w}.2f}" if isinstance(v, float) else f"{'-':>{w}}"

    for b in sorted(fp32):
        base = fp32[b]["ours_nonflush_us"]
        cells = []
        for name in ("int8", "fp8"):
            r = res.get(name, {}).get(b, {})
            us = r.get("ours_nonflush_us")
            cells.append(f"{f(us)} {f(base / us if us else None, 6)} {f(r.get('fi_nonflush_best_us'), 8)} "
                         f"{f(r.get('speedup_vs_fi'), 5)}")
        bv.log(f"{b:>5} | {f(base)} | {cells[0]} | {cells[1]}")
    bv.log("x fp32 = ours fp32 / ours 8-bit; x FI = FlashInfer 8-bit (its fastest algorithm) / ours 8-bit")
    for name in ("int8", "fp8"):
        for b, r in sorted(res.get(name, {}).items()):
            for route in ("nonflush", "flush"):
                if f"ours_sweep_{route}_us" not in r:
                    continue
                times = r[f"ours_sweep_{route}_us"]
                best = min(((v, k) for k, v in times.items() if isinstance(v, float)), default=(None, None))
                sweep = ", ".join(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: failed" for k, v in times.items())
                bv.log(f"sweep {name} {route} b={b} (heuristic {r[f'ours_{route}_us']:.2f}, best {best[1]}): {sweep}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="verify_quant.json")
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,8,32,64,128,256; --cpu-smoke: 1,2)")
    ap.add_argument("--dtypes", default="fp32,int8,fp8")
    ap.add_argument("--reps", type=int, default=None, help="timed replays per figure (default 15)")
    ap.add_argument("--sweep", action="store_true", help="also time every named launch shape on the 8-bit pools")
    ap.add_argument("--sweep-configs", default=None,
                    help="JSON list of launch overrides (ssmstate.ops.triton.override keys) to sweep instead of SWEEP "
                         "(implies --sweep)")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, Triton interpreter, toy sizes (CI smoke test)")
    ap.add_argument("--warm", default=None, choices=("int8", "fp8"),
                    help="only JIT-compile FlashInfer's checkpointing_ssu for this 8-bit state (the specialisation "
                         "this benchmark and tests/gpu/test_quant_gpu.py call: dense T=4 W=16, bf16 x/B/C/dt/D/"
                         "dt_bias) and exit; a build takes minutes of one core, so start both in the background first")
    args = ap.parse_args()
    if args.warm:
        warm(args.warm)
        return
    global SWEEP
    if args.sweep_configs:
        SWEEP = json.loads(args.sweep_configs)
        args.sweep = True
    t0 = time.time()
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        bv.DEV, bv.SMOKE, bv.H, bv.P, bv.N, bv.G = "cpu", True, 4, 16, 16, 2
        args.no_flashinfer = True
    elif not torch.cuda.is_available():
        sys.exit("bench_verify_quant.py needs a CUDA GPU")
    batches = [int(b) for b in (args.batches or ("1,2" if args.cpu_smoke else "1,8,32,64,128,256")).split(",")]
    args.reps = args.reps or (1 if args.cpu_smoke else 15)
    fi, fi_version = bv.load_flashinfer(args.no_flashinfer)
    if bv.SMOKE:
        name, l2 = "cpu (Triton interpreter smoke run)", 0
    else:
        props = torch.cuda.get_device_properties(0)
        name, l2 = props.name, getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    env = {"gpu": name, "l2_bytes": l2, "torch": torch.__version__, "flashinfer": fi_version,
           "command": " ".join(sys.argv)}
    bv.log(json.dumps(env))

    def save(res: dict) -> None:  # after every dtype: a run cut short still leaves its results
        with open(args.out, "w") as fh:
            json.dump({"env": env, "results": res, "seconds": time.time() - t0}, fh, indent=1)

    run_all(args.dtypes.split(","), batches, fi, args, l2, save)
    bv.log(f"wrote {args.out} in {time.time() - t0:.1f}s")


def run_all(dtypes: list[str], batches: list[int], fi, args, l2: int, save=None) -> dict[str, dict]:
    """The 8-bit table: each dtype's rows (T=4, W=16), printed; ``args`` needs ``reps`` and ``sweep``;
    ``save(results)`` after each dtype. ``benchmarks/bench_verify.py --quant`` calls this after its own table."""
    res: dict[str, dict] = {}
    for dname in dtypes:
        res[dname] = bench_dtype(dname, 4, 16, batches, fi, args, l2)
        if save is not None:
            save(res)
    print_table(res)
    return res


if __name__ == "__main__":
    main()
