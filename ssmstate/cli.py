"""``ssmstate`` command line: ``plan`` (capacity report), ``presets``, ``gpus``.

Every failure the user can cause (unknown preset, bad size, TP not dividing the
model, a budget too small for one request) prints one line to stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ssmstate.errors import SSMStateError
from ssmstate.geometry import load_model, preset_names
from ssmstate.gpus import GPUS, format_size
from ssmstate.dtypes import dtype_name
from ssmstate.planner import DEFAULT_GPU, CapacityPlan, plan_capacity, sweep_k

PROG = "ssmstate"


class UsageError(SSMStateError):
    """A command-line value that cannot be parsed."""


def parse_k_range(text: str) -> list[int]:
    """``"0..8"`` (inclusive), ``"1,2,4"`` or ``"3"`` -> a list of K values."""
    try:
        if ".." in text:
            lo, hi = (int(part) for part in text.split("..", 1))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"bad --sweep-k {text!r}; use a range like 0..8 or a list like 1,2,4") from None
    if not ks or min(ks) < 0:
        raise UsageError(f"bad --sweep-k {text!r}: K values must be >= 0 and the range non-empty")
    return ks


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Recurrent-state capacity tools for hybrid Mamba2 models.")
    sub = parser.add_subparsers(dest="command", metavar="{plan,presets,gpus}")
    sub.required = True

    plan = sub.add_parser("plan", help="max concurrency, native (1+K pages) vs replay (1 page)",
                          description="How many concurrent requests fit on one GPU, native vs replay state.")
    plan.add_argument("--model", default="nemotron-h-8b", help="preset name or config.json path (default: %(default)s)")
    mem = plan.add_mutually_exclusive_group()
    mem.add_argument("--gpu-memory", help="memory of one GPU, e.g. 80GiB or 141GB")
    mem.add_argument("--gpu", help=f"GPU name: {', '.join(GPUS)} (default: {DEFAULT_GPU})")
    plan.add_argument("--gpu-utilization", type=float, default=0.9,
                      help="share of the GPU for state + KV (default: %(default)s)")
    plan.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default: %(default)s)")
    plan.add_argument("--num-speculative-tokens", "-k", type=int, default=3, help="K (default: %(default)s)")
    plan.add_argument("--window", type=int, default=None, help="replay window W (default: 16, or 1+max K if larger)")
    plan.add_argument("--state-dtype", default="float32", help="SSM state dtype (default: %(default)s)")
    plan.add_argument("--act-dtype", default="bfloat16", help="activation/ring/KV dtype (default: %(default)s)")
    plan.add_argument("--max-model-len", type=int, default=None, help="tokens per request (default: the model's)")
    plan.add_argument("--no-attention", action="store_true", help="charge Mamba state only, no attention KV")
    plan.add_argument("--vllm-compatible", action="store_true",
                      help="also print vLLM 0.33.0's 'Maximum concurrency' arithmetic (padded pages, groups)")
    plan.add_argument("--block-size", type=int, default=None, help="vLLM starting attention block size (default: 16)")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.add_argument("--sweep-k", metavar="KS", help="sweep K, e.g. 0..8 or 1,2,4")
    plan.add_argument("--plot", metavar="OUT.png", help="plot max concurrency vs K (needs matplotlib)")

    sub.add_parser("presets", help="list the bundled model presets")
    sub.add_parser("gpus", help="list the known GPU memory sizes")
    return parser


# -- rendering -------------------------------------------------------------------

def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))

    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(r) for r in rows)])


def describe_dtypes(plan: CapacityPlan) -> str:
    g = plan.geometry
    return f"state {dtype_name(g.state_dtype)}, act {dtype_name(g.act_dtype)}, conv {dtype_name(g.conv_state_dtype)}"


def _headline(plan: CapacityPlan, sweep: list[int] | None = None) -> str:
    where = plan.gpu if plan.gpu else "a GPU"
    s = plan.spec
    shape = (f"K={s.num_speculative_tokens} (T={s.num_tokens}), W={s.window} (R={s.ring_len})" if sweep is None
             else f"K in {sweep[0]}..{sweep[-1]}" if sweep == list(range(sweep[0], sweep[-1] + 1))
             else f"K in {{{', '.join(map(str, sweep))}}}") + ("" if sweep is None else f", W={s.window}")
    lines = [
        f"{plan.model} on {where}: {format_size(plan.gpu_memory)} x {plan.gpu_utilization:g} = "
        f"{format_size(plan.budget_bytes)} for state + KV, TP {plan.tp_size}, {shape}",
        f"{plan.geometry.num_layers} Mamba layers, {describe_dtypes(plan)}; "
        + (f"{plan.num_attention_layers} attention layers charged at {plan.max_model_len} tokens "
           f"({format_size(plan.attention_bytes_per_token)}/token)" if plan.count_attention
           else "attention KV not charged"),
    ]
    return "\n".join(lines)


def render_plan(plan: CapacityPlan) -> str:
    n, r = plan.native, plan.replay
    rows = [
        ("pages per request", str(n.pages_per_request), str(r.pages_per_request)),
        ("page (all Mamba layers)", format_size(n.page_bytes), format_size(r.page_bytes)),
        ("Mamba state / request", format_size(n.mamba_allocated_bytes_per_request),
         format_size(r.mamba_allocated_bytes_per_request)),
        ("attention KV / request", format_size(n.attention_bytes_per_request),
         format_size(r.attention_bytes_per_request)),
        ("total / request", format_size(n.total_bytes_per_request), format_size(r.total_bytes_per_request)),
        (f"max concurrency @ {plan.max_model_len}" if plan.count_attention else "max concurrency",
         str(n.max_concurrency), str(r.max_concurrency)),
    ]
    out = [_headline(plan), "", _table(rows, ("", "native", "replay")), "",
           f"replay / native: {plan.concurrency_ratio:.2f}x concurrency; "
           f"Mamba state {plan.mamba_bytes_ratio:.2f}x smaller per request"]
    vn, vr = plan.vllm_native, plan.vllm_replay
    if vn is not None and vr is not None:
        bs = lambda v: "-" if v.block_size is None else str(v.block_size)  # noqa: E731
        vrows = [
            ("Mamba page / layer", format_size(vn.mamba_page_bytes), format_size(vr.mamba_page_bytes)),
            ("attention block size", bs(vn), bs(vr)),
            ("padded page (padding)", f"{format_size(vn.page_bytes)} ({100 * vn.padding_fraction:.2f}%)",
             f"{format_size(vr.page_bytes)} ({100 * vr.padding_fraction:.2f}%)"),
            ("groups attn + Mamba (size)", f"{vn.num_attention_groups} + {vn.num_mamba_groups} ({vn.group_size})",
             f"{vr.num_attention_groups} + {vr.num_mamba_groups} ({vr.group_size})"),
            ("Mamba blocks / request", str(vn.mamba_blocks_per_request), str(vr.mamba_blocks_per_request)),
            ("attention blocks / request", str(vn.attention_blocks_per_request), str(vr.attention_blocks_per_request)),
            ("blocks / request (all groups)", str(vn.blocks_per_request), str(vr.blocks_per_request)),
            ("num_blocks", str(vn.num_blocks), str(vr.num_blocks)),
            ("max concurrency", f"{vn.max_concurrency:.2f}x", f"{vr.max_concurrency:.2f}x"),
        ]
        out += ["", f"vLLM 0.33.0-compatible: 'Maximum concurrency for {plan.max_model_len} tokens per request' "
                    f"(KV-cache memory {format_size(vn.available_memory)})",
                "", _table(vrows, ("", "native", "replay")), "",
                f"vLLM replay / native: {plan.vllm_ratio:.2f}x"]
    return "\n".join(out)


def render_sweep(plans: list[CapacityPlan]) -> str:
    vllm = plans[0].vllm_native is not None
    header = ("K", "native pages", "native / req", "native conc", "replay / req", "replay conc", "ratio")
    if vllm:
        header += ("vLLM native", "vLLM replay")
    rows = []
    for p in plans:
        row = (str(p.num_speculative_tokens), str(p.native.pages_per_request),
               format_size(p.native.total_bytes_per_request), str(p.native.max_concurrency),
               format_size(p.replay.total_bytes_per_request), str(p.replay.max_concurrency),
               f"{p.concurrency_ratio:.2f}x")
        if p.vllm_native is not None and p.vllm_replay is not None:
            row += (f"{p.vllm_native.max_concurrency:.2f}x", f"{p.vllm_replay.max_concurrency:.2f}x")
        rows.append(row)
    ks = [p.num_speculative_tokens for p in plans]
    return "\n".join([_headline(plans[0], ks), "", _table(rows, header)])


def plot_sweep(plans: list[CapacityPlan], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'ssmstate[plot]'") from None
    ks = [p.num_speculative_tokens for p in plans]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [p.native.max_concurrency for p in plans], "o-", label="native (1+K pages)")
    ax.plot(ks, [p.replay.max_concurrency for p in plans], "s-", label="replay (1 page)")
    vllm = [(p.vllm_native, p.vllm_replay) for p in plans]
    if all(vn is not None and vr is not None for vn, vr in vllm):
        ax.plot(ks, [vn.max_concurrency for vn, _ in vllm], "o--", label="vLLM native")  # type: ignore[union-attr]
        ax.plot(ks, [vr.max_concurrency for _, vr in vllm], "s--", label="vLLM replay")  # type: ignore[union-attr]
    ax.set_xlabel("draft tokens K")
    ax.set_ylabel("max concurrent requests")
    ax.set_title(f"{plans[0].model}, {format_size(plans[0].budget_bytes)} budget, TP {plans[0].tp_size}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_presets() -> str:
    rows = []
    for name in preset_names():
        m = load_model(name)
        a = m.attention
        rows.append((name, str(m.num_mamba_layers), "0" if a is None else str(a.num_layers),
                     f"{m.num_heads}x{m.head_dim}", str(m.state_size), str(m.n_groups),
                     "-" if a is None else f"{a.num_kv_heads}x{a.head_dim}", str(m.max_model_len)))
    return _table(rows, ("preset", "Mamba", "attn", "H x P", "N", "G", "KV heads x dim", "max len"))


def render_gpus() -> str:
    rows = [(g.name, format_size(g.total_bytes), str(g.total_bytes), g.basis, g.source) for g in GPUS.values()]
    return _table(rows, ("gpu", "memory", "bytes", "basis", "source"))


# -- entry point -----------------------------------------------------------------

def _run_plan(args: argparse.Namespace) -> str:
    kwargs = dict(
        gpu_memory=args.gpu_memory, gpu=args.gpu, gpu_utilization=args.gpu_utilization, tp_size=args.tp,
        state_dtype=args.state_dtype, act_dtype=args.act_dtype, max_model_len=args.max_model_len,
        count_attention=not args.no_attention, vllm_compatible=args.vllm_compatible, block_size=args.block_size,
    )
    if args.window is not None:
        kwargs["window"] = args.window
    if args.sweep_k is None and args.plot is None:
        k = args.num_speculative_tokens
        window = kwargs.pop("window", max(16, 1 + k) if isinstance(k, int) else 16)
        plan = plan_capacity(args.model, num_speculative_tokens=k, window=window, **kwargs)
        return json.dumps(plan.to_dict(), indent=2) if args.json else render_plan(plan)
    ks = parse_k_range(args.sweep_k or "0..8")
    plans = sweep_k(args.model, ks, **kwargs)
    if args.plot:
        plot_sweep(plans, args.plot)
    if args.json:
        return json.dumps([p.to_dict() for p in plans], indent=2)
    text = render_sweep(plans)
    return text + (f"\nplot written to {args.plot}" if args.plot else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input)."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    try:
        if args.command == "presets":
            print(render_presets())
        elif args.command == "gpus":
            print(render_gpus())
        else:
            print(_run_plan(args))
    except (SSMStateError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
