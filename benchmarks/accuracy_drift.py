"""Drift of a narrow checkpoint against the fp32 path: state and output error over many verify steps.

One :class:`~ssmstate.StateManager` per checkpoint dtype (fp32, bf16, fp16, fp8_e4m3fn, int8; the narrow
ones with and without stochastic rounding), every one fed the same inputs: each step verifies a window of
T = 1 + K tokens for every request and commits a random number of them (1..T, uniform), so the ring
flushes into the checkpoint at the real cadence (W = 16, K = 3: a flush every 4 to 16 steps). The fp32
manager is the reference. Quantization enters at each flush; the SSM's decay (``exp(A * dt)``) forgets it,
so the error should settle at a level set by the dtype and the slowest head's memory, not grow.

Reported per dtype:

* output error: ``||y - y_fp32|| / ||y_fp32||`` over all of a step's outputs, the mean over the 100 steps
  before each sample point (and the worst step overall);
* state error: ``||S - S_fp32|| / ||S_fp32||`` of the full state (checkpoint + committed ring rows,
  ``read_state``) over the batch, at each sample point (CPU mode; on the GPU the output error only);
* growth: the least-squares slope of the output error over the second half of the run, per 1,000 steps,
  relative to its mean there (0: flat; 1: the error would double every 1,000 steps).

Inputs follow Mamba2's initialization: ``A = -U(1, 16)`` per head, ``dt = softplus(dt_raw + dt_bias)``
with ``softplus(dt_bias)`` log-uniform in [1e-3, 1e-1] per head and ``dt_raw ~ N(0, 0.5)``; x, B, C are
N(0, 1) values rounded to bf16 (Nemotron-H's activations), held in fp32 activation tensors by default
(``--act-dtype``) so the outputs compared are fp32, not rounded to bf16. Every run has the same rings and
inputs: they differ in the checkpoint alone.

CPU, reference backend (a few heads at Nemotron-H's head dim 64 and state 128, to keep CPU time short)::

    python benchmarks/accuracy_drift.py --json docs/results/accuracy_drift_cpu.json

GPU (Triton backend, Nemotron-H-8B's 128 heads and 8 groups, batch 64, 1,000 steps, output error only)::

    python benchmarks/accuracy_drift.py --device cuda --backend triton --heads 128 --groups 8 --batch 64 \\
        --steps 1000 --json docs/results/accuracy_drift_gpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.dtypes import dtype_name, to_dtype  # noqa: E402

DTYPES = ("bf16", "fp16", "fp8", "int8")
SAMPLES = (100, 1000, 5000, 10000)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--heads", type=int, default=8, help="H (Nemotron-H-8B: 128)")
    ap.add_argument("--groups", type=int, default=1, help="G (Nemotron-H-8B: 8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--state", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--act-dtype", default="fp32", help="x/B/C, rings and outputs (values are bf16-rounded)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    ap.add_argument("--no-sr", action="store_true", help="skip the stochastic-rounding runs")
    ap.add_argument("--no-state", action="store_true", help="skip the state read-back (output error only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


def runs(args: argparse.Namespace) -> list[tuple[str, torch.dtype, bool]]:
    """(label, checkpoint dtype, stochastic rounding) for every run; fp32 (the reference) first."""
    out = [("fp32", torch.float32, False)]
    for name in args.dtypes:
        dt = to_dtype(name)
        out.append((name, dt, False))
        if not args.no_sr:
            out.append((f"{name}+sr", dt, True))
    return out


def make_manager(args: argparse.Namespace, dtype: torch.dtype, sr: bool) -> StateManager:
    g = Mamba2Geometry(num_heads=args.heads, head_dim=args.head_dim, state_size=args.state, n_groups=args.groups,
                       conv_kernel=4, num_layers=1, state_dtype=dtype, act_dtype=to_dtype(args.act_dtype))
    layout = PageLayout.replay(g, SpecConfig(args.K, window=args.window))
    kw = {"stochastic_rounding": True, "seed": args.seed} if sr else {}
    m = StateManager(layout, args.batch + 1, device=args.device, backend=args.backend, max_batch=args.batch, **kw)
    for i in range(args.batch):
        m.admit(i)
    return m


def head_params(args: argparse.Namespace, gen: torch.Generator) -> dict[str, torch.Tensor]:
    H = args.heads
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    return {"A": -torch.empty(H).uniform_(1.0, 16.0, generator=gen),
            "dt_bias": dt0 + torch.log(-torch.expm1(-dt0)),  # softplus^-1(dt0)
            "D": torch.ones(H)}


def step_inputs(args: argparse.Namespace, gen: torch.Generator, L: int) -> dict[str, torch.Tensor]:
    H, P, N, G = args.heads, args.head_dim, args.state, args.groups
    act = to_dtype(args.act_dtype)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(act)

    return {"x": r(L, H, P), "dt": torch.randn(L, H, generator=gen) * 0.5, "B": r(L, G, N), "C": r(L, G, N)}


def rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """||a - b|| / ||b|| as a 0-dim fp64 tensor on the device (no sync)."""
    a, b = a.double(), b.double()
    return (a - b).norm() / b.norm().clamp_min(1e-30)


def read_states(m: StateManager, batch: int) -> torch.Tensor:
    return torch.stack([m.read_state(i, 0) for i in range(batch)])


def drive(args: argparse.Namespace) -> dict:
    """Run every dtype side by side; per-step output errors stay on the device until the end."""
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    params = {k: v.to(dev) for k, v in head_params(args, gen).items()}
    table = runs(args)
    managers = [make_manager(args, dt, sr) for _, dt, sr in table]
    T, B = 1 + args.K, args.batch
    L = T * B
    ids = list(range(B))
    out_err = torch.zeros((len(table), args.steps), dtype=torch.float64, device=dev)
    state_err: dict[str, dict[int, float]] = {label: {} for label, _, _ in table}
    samples = sorted({s for s in SAMPLES if s <= args.steps} | {args.steps})
    act = to_dtype(args.act_dtype)
    outs = [torch.empty((L, args.heads, args.head_dim), dtype=act, device=dev) for _ in table]
    t0 = time.time()
    for step in range(args.steps):
        inp = {k: v.to(dev) for k, v in step_inputs(args, gen, L).items()}
        accepted = torch.randint(1, T + 1, (B,), generator=gen, dtype=torch.int32).to(dev)
        for m, out in zip(managers, outs):
            plan = m.begin_step(ids, T)
            m.verify(0, plan, inp["x"], inp["dt"], inp["B"], inp["C"], params["A"], D=params["D"],
                     dt_bias=params["dt_bias"], out=out)
            m.commit(plan, accepted)
        for i in range(1, len(table)):
            out_err[i, step] = rel(outs[i], outs[0])
        if (step + 1) % max(1, args.steps // 10) == 0:
            print(f"step {step + 1}/{args.steps}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        if step + 1 in samples and not args.no_state:
            ref_state = read_states(managers[0], B)
            for (label, _, _), m in zip(table, managers):
                state_err[label][step + 1] = float(rel(read_states(m, B), ref_state))
    for m in managers:
        m.raise_device_errors()
    seconds = time.time() - t0
    return {"table": table, "out_err": out_err.cpu(), "state_err": state_err, "samples": samples,
            "seconds": seconds}


def growth(errs: torch.Tensor) -> float:
    """Least-squares slope of the error over the second half of the run, per 1,000 steps, over its mean."""
    half = errs[errs.shape[0] // 2:]
    if half.numel() < 2 or float(half.mean()) == 0.0:
        return 0.0
    x = torch.arange(half.numel(), dtype=torch.float64)
    x = x - x.mean()
    slope = float((x * (half - half.mean())).sum() / (x * x).sum())
    return slope * 1000.0 / float(half.mean())


def summarize(args: argparse.Namespace, raw: dict) -> dict:
    rows = []
    for i, (label, dt, sr) in enumerate(raw["table"]):
        if i == 0:
            continue
        e = raw["out_err"][i]
        out_at = {s: float(e[max(0, s - 100): s].mean()) for s in raw["samples"]}
        rows.append({"run": label, "dtype": dtype_name(dt), "stochastic_rounding": sr,
                     "output_err": out_at, "output_err_max": float(e.max()),
                     "state_err": raw["state_err"][label], "growth_per_1k_steps": growth(e)})
    return {
        "command": "python benchmarks/accuracy_drift.py " + " ".join(sys.argv[1:]),
        "device": str(torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"),
        "backend": args.backend, "torch": torch.__version__,
        "geometry": {"heads": args.heads, "groups": args.groups, "head_dim": args.head_dim, "state": args.state,
                     "act_dtype": dtype_name(to_dtype(args.act_dtype))},
        "batch": args.batch, "steps": args.steps, "window": args.window, "K": args.K, "seed": args.seed,
        "seconds": round(raw["seconds"], 1), "rows": rows,
    }


def markdown(result: dict) -> str:
    samples = list(result["rows"][0]["output_err"]) if result["rows"] else []
    head = ["run"] + [f"output err @{s}" for s in samples] + ["worst step"]
    has_state = any(r["state_err"] for r in result["rows"])
    if has_state:
        head += [f"state err @{s}" for s in samples]
    head += ["growth / 1k steps"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in result["rows"]:
        cells = [r["run"]] + [f"{r['output_err'][s]:.2e}" for s in samples] + [f"{r['output_err_max']:.2e}"]
        if has_state:
            cells += [f"{r['state_err'].get(s, float('nan')):.2e}" for s in samples]
        cells += [f"{r['growth_per_1k_steps']:+.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = summarize(args, drive(args))
    print(markdown(result))
    print(f"\n{result['steps']} steps, batch {result['batch']}, {result['geometry']}, W={args.window}, K={args.K}, "
          f"{result['backend']} on {result['device']}: {result['seconds']} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
