"""Max concurrency on real allocations: native (1 + K pages) vs replay (1 page).

For each scheme this allocates a real :class:`~ssmstate.StateManager` pool
inside a memory budget (``PageLayout.max_pages(budget)`` pages, null page
included), admits requests until the pool refuses with ``CapacityError``, then
runs one full verify step (conv + verify for every layer, then commit) with
every admitted request, to show they really fit and work. The measured count
is printed next to the planner's figure (``plan_capacity(..., count_attention=False)``,
Mamba state only: attention KV is not allocated here); the script exits 1 if
they differ, if an output is not finite, or if the commit left a wrong cursor.

Examples::

    # CPU, scaled down (2 of the 24 Mamba layers, 256 MiB); an int8 checkpoint pool (native runs at fp32,
    # the planner's figure for vLLM's built-in scheme, which holds no 8-bit state)
    python benchmarks/max_concurrency.py --num-layers 2 --budget 256MiB
    python benchmarks/max_concurrency.py --num-layers 2 --budget 256MiB --state-dtype int8
    # H200
    python benchmarks/max_concurrency.py --device cuda --budget 100GiB --model nemotron-h-8b
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):  # the package, and benchmarks/progress.py when loaded as a module
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from ssmstate import CapacityError, PageLayout, StateManager  # noqa: E402
from ssmstate.geometry import load_model  # noqa: E402
from ssmstate.gpus import format_size, parse_size  # noqa: E402
from ssmstate.planner import CapacityPlan, plan_capacity  # noqa: E402

from progress import progress  # noqa: E402  (benchmarks/progress.py)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def run_scheme(layout: PageLayout, budget: int, device: torch.device, backend: str, chunk: int | None,
               seed: int) -> dict[str, Any]:
    """Allocate, admit until refused, run one verify step over everyone; return the measurements."""
    g, spec = layout.geometry, layout.spec
    T = spec.num_tokens
    num_pages = layout.max_pages(budget)
    before = _allocated(device)
    t0 = time.perf_counter()
    mgr = StateManager(layout, num_pages, device=device, backend=backend, max_batch=max(1, num_pages))
    _sync(device)
    alloc_s = time.perf_counter() - t0
    after = _allocated(device)
    cache_bytes = mgr.cache.nbytes

    # -- admit until the pool refuses ---------------------------------------------------
    expected_upper = (num_pages - 1) // layout.pages_per_request + 1
    bar = progress(expected_upper, f"{layout.scheme}: admit")
    admitted: list[int] = []
    refused_with: str | None = None
    t0 = time.perf_counter()
    while True:
        try:
            mgr.admit(len(admitted))
        except CapacityError as exc:
            refused_with = str(exc)
            break
        admitted.append(len(admitted))
        bar.update(1)
    _sync(device)
    admit_s = time.perf_counter() - t0
    bar.close()
    n = len(admitted)

    # -- one verify step with every admitted request ------------------------------------
    gen = torch.Generator(device="cpu").manual_seed(seed)
    H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
    Dc, k = g.conv_dim_per_rank, g.conv_kernel
    act = g.act_dtype

    def rand(*shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    A = -torch.rand(H, generator=gen).add(0.5).to(device)
    D = rand(H)
    dt_bias = rand(H, scale=0.5)
    conv_w = rand(Dc, k, scale=0.5)
    conv_b = rand(Dc, scale=0.1)
    rows = n if chunk is None else max(1, min(chunk, n))
    tokens = rows * T
    x = rand(tokens, H, P, dtype=act)
    dt = rand(tokens, H, scale=0.5)
    Bm = rand(tokens, G, N, scale=0.3, dtype=act)
    Cm = rand(tokens, G, N, scale=0.3, dtype=act)
    xBC = rand(tokens, Dc, dtype=act)
    y = torch.empty((tokens, H, P), dtype=act, device=device)
    conv_out = torch.empty((tokens, Dc), dtype=act, device=device)
    finite = torch.ones((), dtype=torch.bool, device=device)
    accepted_all = torch.randint(1, T + 1, (n,), generator=gen, dtype=torch.int32)
    cursors_ok = True
    num_chunks = 0
    bar = progress(n * g.num_layers, f"{layout.scheme}: verify {n} requests x {g.num_layers} layers")
    t0 = time.perf_counter()
    for lo in range(0, n, rows):
        ids = admitted[lo: lo + rows]
        m = len(ids)
        L = m * T
        plan = mgr.begin_step(ids, T)
        for layer in range(g.num_layers):
            mgr.conv(layer, plan, xBC[:L], conv_w, conv_b, "silu", out=conv_out[:L])
            mgr.verify(layer, plan, x[:L], dt[:L], Bm[:L], Cm[:L], A, D=D, dt_bias=dt_bias, out=y[:L])
            finite &= torch.isfinite(y[:L]).all() & torch.isfinite(conv_out[:L]).all()
            bar.update(m)
        accepted = accepted_all[lo: lo + m]
        mgr.commit(plan, accepted.tolist())
        first_pages = torch.tensor([mgr.page_of(i) for i in ids], dtype=torch.long, device=device)
        if layout.scheme == "replay":
            got = mgr.cache.num_committed[first_pages].cpu()
            cursors_ok &= bool(torch.equal(got, accepted))
        else:
            got = mgr.cache.state_slot[first_pages].cpu()
            cursors_ok &= bool(torch.equal(got, accepted - 1))
        num_chunks += 1
    _sync(device)
    step_s = time.perf_counter() - t0
    bar.close()
    mgr.raise_device_errors()
    result = {
        "scheme": layout.scheme,
        "state_dtype": str(g.state_dtype).removeprefix("torch."),
        "num_pages": num_pages,
        "pages_per_request": layout.pages_per_request,
        "allocated_bytes_per_page": layout.allocated_bytes_per_page,
        "cache_bytes": cache_bytes,
        "cache_bytes_within_budget": cache_bytes <= budget,
        # One more page would not fit: the pool is the largest the budget allows.
        "pool_is_maximal": budget - cache_bytes < layout.allocated_bytes_per_page,
        "device_bytes_allocated": None if before is None else after - before,  # type: ignore[operator]
        "admitted": n,
        "refused_with": refused_with,
        "step_rows": n,
        "step_tokens": n * T,
        "step_chunks": num_chunks,
        "outputs_finite": bool(finite.item()),
        "cursors_ok": cursors_ok,
        "alloc_seconds": alloc_s,
        "admit_seconds": admit_s,
        "step_seconds": step_s,
    }
    del mgr, plan, x, dt, Bm, Cm, xBC, y, conv_out
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, total_memory=props.total_memory)
        try:
            query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = out.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="nemotron-h-8b", help="preset or config.json (default: %(default)s)")
    parser.add_argument("--num-layers", type=int, default=None, help="override the number of Mamba layers")
    parser.add_argument("--num-heads", type=int, default=None,
                        help="override H (with --head-dim etc.: a custom geometry)")
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--state-size", type=int, default=None)
    parser.add_argument("--n-groups", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget", default=None, help="memory budget (default: 256MiB on CPU, 100GiB on CUDA)")
    parser.add_argument("--num-speculative-tokens", "-k", type=int, default=3)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--state-dtype", default="float32")
    parser.add_argument("--act-dtype", default="bfloat16")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--backend", default="reference", help="reference, triton or flashinfer")
    parser.add_argument("--chunk", type=int, default=None, help="rows per verify step (default: all in one batch)")
    parser.add_argument("--schemes", default="replay,native")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("max_concurrency: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    budget = parse_size(args.budget or ("100GiB" if device.type == "cuda" else "256MiB"))
    cfg = load_model(args.model)
    overrides = {"num_mamba_layers": args.num_layers, "num_heads": args.num_heads, "head_dim": args.head_dim,
                 "state_size": args.state_size, "n_groups": args.n_groups}
    cfg = attrs.evolve(cfg, **{k: v for k, v in overrides.items() if v is not None})
    plan: CapacityPlan = plan_capacity(
        cfg, kv_cache_memory=budget, tp_size=args.tp,
        num_speculative_tokens=args.num_speculative_tokens, window=args.window, state_dtype=args.state_dtype,
        act_dtype=args.act_dtype, count_attention=False,
    )
    info = _device_info(device)
    print(f"{cfg.name}: {plan.geometry.num_layers} Mamba layers, H={plan.geometry.heads_per_rank} "
          f"P={plan.geometry.head_dim} N={plan.geometry.state_size} G={plan.geometry.groups_per_rank}, "
          f"K={args.num_speculative_tokens} W={args.window}, budget {format_size(budget)} on {info.get('name')}",
          file=sys.stderr)
    measured: dict[str, dict[str, Any]] = {}
    ok = True
    for scheme in [s.strip() for s in args.schemes.split(",") if s.strip()]:
        geometry = plan.geometry if scheme == "replay" else (plan.builtin_geometry or plan.geometry)
        layout = PageLayout(scheme, geometry, plan.spec)  # type: ignore[arg-type]
        r = run_scheme(layout, budget, device, args.backend, args.chunk, args.seed)
        r["planned"] = plan.scheme(scheme).max_concurrency
        r["equal"] = r["admitted"] == r["planned"]
        ok &= (r["equal"] and r["outputs_finite"] and r["cursors_ok"] and r["cache_bytes_within_budget"]
               and r["pool_is_maximal"])
        measured[scheme] = r

    rows = [("scheme", "state", "pages/req", "bytes/req", "pool pages", "pool bytes", "planned", "measured", "step s",
             "ok")]
    for s, r in measured.items():
        cap = plan.scheme(s)
        rows.append((s, r["state_dtype"], str(cap.pages_per_request), format_size(cap.mamba_allocated_bytes_per_request),
                     str(r["num_pages"]), format_size(r["cache_bytes"]), str(r["planned"]), str(r["admitted"]),
                     f"{r['step_seconds']:.1f}",
                     "yes" if r["equal"] and r["outputs_finite"] and r["cursors_ok"] else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    ratio = None
    if "native" in measured and "replay" in measured and measured["native"]["admitted"]:
        ratio = measured["replay"]["admitted"] / measured["native"]["admitted"]
        print(f"measured replay / native: {ratio:.2f}x (planner {plan.concurrency_ratio:.2f}x)")

    report = {
        "command": " ".join(["max_concurrency.py", *(sys.argv[1:] if argv is None else argv)]),
        "env": info,
        "backend": args.backend,
        "model": cfg.name,
        "geometry": plan.geometry.describe(),
        "num_speculative_tokens": args.num_speculative_tokens,
        "window": args.window,
        "budget_bytes": budget,
        "plan": plan.to_dict(),
        "measured": measured,
        "measured_ratio": ratio,
        "all_equal_and_working": ok,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if not ok:
        print("max_concurrency: FAILED: measured != planned, or a step did not work", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
