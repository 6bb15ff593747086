"""``ssmstate`` command line: ``plan`` (capacity report), ``presets``, ``gpus``.

Every failure the user can cause (unknown preset, bad size, TP not dividing the
model, a budget too small for one request, a bad plot file name) prints one line
to stderr and exits 2. The planner and torch are imported only when a command
needs them, so ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

from ssmstate.errors import SSMStateError
from ssmstate.gpus import DEFAULT_GPU, GPUS, format_size

if TYPE_CHECKING:
    from ssmstate.planner import CapacityPlan, SchemeCapacity

PROG = "ssmstate"
#: File types ``--plot`` writes (matplotlib's raster and vector backends).
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "webp", "tif", "tiff")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "nvfp4")

LEGEND = """\
legend:
  vLLM native      vLLM's own Mamba2 speculative decoding: 1 + K full state pages per request
  vLLM ReplaySSM   vLLM's built-in ReplaySSM (FlashInfer): 1 page, conv window k - 1 + K; only while W <= 16
  ssmstate         this library's replay page: 1 page, conv window k - 1 + T, any W
  K = draft tokens per step, T = 1 + K tokens verified per step, W = ring history (tokens kept for replay),
  R = W + T ring rows; context length = tokens per request the attention KV is reserved for"""


class UsageError(SSMStateError):
    """A command-line value that cannot be parsed."""


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("ssmstate")
    except (ImportError, PackageNotFoundError):
        from ssmstate import __version__
        return __version__


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{plan,presets,gpus}")
    sub.required = True

    plan = sub.add_parser(
        "plan", help="how many concurrent requests a deployment holds: vLLM native vs vLLM ReplaySSM vs ssmstate",
        description="How many concurrent requests one GPU holds with vLLM: total memory x --gpu-utilization, "
                    "less the model weights and vLLM's runtime reserve (activations, sampler, CUDA graphs), "
                    "is shared by the requests' Mamba state and attention KV. Compares vLLM's native spec "
                    "decode (1 + K state pages), vLLM's built-in ReplaySSM and ssmstate's replay page.",
        epilog=LEGEND, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("--model", default="nemotron-h-8b", help="preset name or config.json path (default: %(default)s)")
    mem = plan.add_mutually_exclusive_group()
    mem.add_argument("--gpu-memory", help="memory of one GPU, e.g. 80GiB or 141GB")
    mem.add_argument("--gpu", help=f"GPU name: {', '.join(GPUS)} (default: {DEFAULT_GPU})")
    plan.add_argument("--gpu-utilization", type=float, default=0.9,
                      help="vLLM's --gpu-memory-utilization: share of the GPU for weights, runtime reserve, "
                           "state and KV together (default: %(default)s)")
    plan.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default: %(default)s)")
    plan.add_argument("--num-speculative-tokens", "-k", type=int, default=3,
                      help="K, draft tokens per step (default: %(default)s)")
    plan.add_argument("--window", type=int, default=None,
                      help="ring history W for the replay schemes (default: 16, or 1 + max K if larger)")
    plan.add_argument("--state-dtype", default="float32",
                      help="SSM state (checkpoint) dtype: float32, bf16, fp16, int8 or fp8 (default: %(default)s)")
    plan.add_argument("--builtin-state-dtype", default=None,
                      help="state dtype of vLLM's built-in schemes (default: --state-dtype; float32 when that is "
                           "8-bit, which vLLM does not hold)")
    plan.add_argument("--act-dtype", default="bfloat16", help="activation/ring/KV dtype (default: %(default)s)")
    plan.add_argument("--max-model-len", type=int, default=None,
                      help="context length: tokens per request the attention KV is reserved for "
                           "(default: the model's maximum)")
    plan.add_argument("--no-attention", action="store_true", help="charge Mamba state only, no attention KV")
    model = plan.add_argument_group("weights and runtime reserve (what vLLM takes before the KV cache)")
    model.add_argument("--weight-dtype", default="bf16", choices=WEIGHT_DTYPES,
                       help="weights of the projection matrices (default: %(default)s)")
    model.add_argument("--weights-memory", metavar="SIZE",
                       help="weights per GPU as measured (vLLM's 'Model loading took'), instead of the count")
    model.add_argument("--reserve-memory", metavar="SIZE",
                       help="runtime reserve as measured, instead of the model of vLLM's profile run")
    model.add_argument("--kv-cache-memory", metavar="SIZE",
                       help="the state + KV budget itself (vLLM's 'Available KV cache memory'); "
                            "weights, reserve and --gpu-utilization are then not used")
    model.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="tokens of vLLM's profile forward pass (default: vllm serve's for the GPU, "
                            "8192 on an H100/H200, 16384 from 160 GiB)")
    model.add_argument("--max-num-seqs", type=int, default=None,
                       help="rows of vLLM's profile sampler pass (default: vllm serve's, 1024 on an H100/H200)")
    model.add_argument("--cuda-graph-memory", metavar="SIZE", default="512MiB",
                       help="vLLM's CUDA-graph estimate (default: %(default)s)")
    model.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: no CUDA-graph reserve")
    model.add_argument("--non-torch-memory", metavar="SIZE", default="512MiB",
                       help="CUDA context and library workspaces outside PyTorch (default: %(default)s)")
    plan.add_argument("--vllm-compatible", action="store_true",
                      help="also print vLLM 0.33.0's 'Maximum concurrency' arithmetic (padded pages, groups)")
    plan.add_argument("--block-size", type=int, default=None, help="vLLM starting attention block size (default: 16)")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.add_argument("--sweep-k", metavar="KS", help="sweep K, e.g. 0..8 or 1,2,4")
    plan.add_argument("--plot", metavar="OUT.png",
                      help="with --sweep-k: plot max concurrency vs K (needs matplotlib; "
                           f"{', '.join(PLOT_FORMATS[:4])}, ...)")

    sub.add_parser("presets", help="list the bundled model presets")
    sub.add_parser("gpus", help="list the known GPU memory sizes")
    return parser


# -- rendering -------------------------------------------------------------------

def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)).rstrip()

    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(r) for r in rows)])


def describe_dtypes(plan: CapacityPlan) -> str:
    from ssmstate.dtypes import dtype_name

    g, b = plan.geometry, plan.builtin_geometry
    builtin = "" if b is None or b.state_dtype == g.state_dtype else f" (vLLM's built-in: {dtype_name(b.state_dtype)})"
    return (f"state {dtype_name(g.state_dtype)}{builtin}, act {dtype_name(g.act_dtype)}, "
            f"conv {dtype_name(g.conv_state_dtype)}")


def _shape(plan: CapacityPlan, sweep: list[int] | None) -> str:
    s = plan.spec
    if sweep is None:
        return f"K={s.num_speculative_tokens} draft tokens (T={s.num_tokens}), W={s.window} (R={s.ring_len})"
    ks = (f"K in {sweep[0]}..{sweep[-1]}" if sweep == list(range(sweep[0], sweep[-1] + 1))
          else f"K in {{{', '.join(map(str, sweep))}}}")
    return f"{ks}, W={s.window}"


def _budget_lines(plan: CapacityPlan) -> list[str]:
    """The memory breakdown: GPU x utilization - weights - reserve = state + KV budget."""
    where = plan.gpu if plan.gpu else "a GPU"
    if plan.weights is None or plan.reserve is None:
        return [f"state + attention KV budget (given): {format_size(plan.budget_bytes)} on {where}"]
    w, r = plan.weights, plan.reserve
    weights_note = ("measured" if w.measured else
                    f"{w.weight_dtype}, {w.num_parameters / 1e9:.2f} B parameters counted from the config")
    if r.measured:
        reserve_note = "measured"
    else:
        reserve_note = (f"profile peak {format_size(max(r.activation_bytes, r.sampler_bytes))} "
                        f"(forward over {r.max_num_batched_tokens} tokens {format_size(r.activation_bytes)}, "
                        f"sampler over {min(r.max_num_seqs, r.max_num_batched_tokens)} rows "
                        f"{format_size(r.sampler_bytes)}) + non-torch {format_size(r.non_torch_bytes)}"
                        f" + CUDA graphs {format_size(r.cuda_graph_bytes)}")
    rows = [
        ("GPU memory", format_size(plan.gpu_memory), where),
        (f"x gpu-utilization {plan.gpu_utilization:g}", format_size(plan.requested_bytes), "what vLLM may use"),
        ("- model weights", format_size(w.total_bytes), weights_note),
        ("- runtime reserve", format_size(r.total_bytes), reserve_note),
        ("= request state + attention KV", format_size(plan.budget_bytes), ""),
    ]
    width = max(len(a) for a, _, _ in rows)
    vwidth = max(len(b) for _, b, _ in rows)
    return [f"  {a.ljust(width)}  {b.rjust(vwidth)}  {c}".rstrip() for a, b, c in rows]


def _headline(plan: CapacityPlan, sweep: list[int] | None = None) -> str:
    where = plan.gpu if plan.gpu else "a GPU"
    g = plan.geometry
    attn = (f"{plan.num_attention_layers} attention layers, KV reserved for a context length of "
            f"{plan.max_model_len} tokens ({format_size(plan.attention_bytes_per_token)}/token)"
            if plan.count_attention else "attention KV not charged")
    lines = [
        f"{plan.model} on {where}, TP {plan.tp_size}, {_shape(plan, sweep)}",
        f"{g.num_layers} Mamba layers ({describe_dtypes(plan)}); {attn}",
        "memory per GPU:",
        *_budget_lines(plan),
    ]
    return "\n".join(lines)


def _schemes(plan: CapacityPlan) -> list[tuple[str, SchemeCapacity | None]]:
    return [("vLLM native", plan.native), ("vLLM ReplaySSM", plan.vllm_replayssm), ("ssmstate", plan.replay)]


def _cell(cap: SchemeCapacity | None, text: str) -> str:
    return "n/a" if cap is None else text


def _vs_native(plan: CapacityPlan, cap: SchemeCapacity | None) -> str:
    if cap is None:
        return "n/a"
    return f"{cap.max_concurrency / plan.native.max_concurrency:.2f}x"


def _mamba_wording(plan: CapacityPlan) -> str:
    """``"3.66x smaller"`` / ``"1.07x larger"``: ssmstate's Mamba state per request against native."""
    ratio = plan.mamba_bytes_ratio
    if ratio >= 1:
        return f"{ratio:.2f}x smaller"
    return f"{1 / ratio:.2f}x larger"


def render_plan(plan: CapacityPlan) -> str:
    schemes = _schemes(plan)
    ctx = f" (context {plan.max_model_len})" if plan.count_attention else ""
    rows = [
        ("state pages per request", *(_cell(c, str(c.pages_per_request)) if c else "n/a" for _, c in schemes)),
        ("one page, all Mamba layers", *(_cell(c, format_size(c.page_bytes)) if c else "n/a" for _, c in schemes)),
        ("Mamba state per request", *(_cell(c, format_size(c.mamba_allocated_bytes_per_request)) if c else "n/a"
                                      for _, c in schemes)),
        (f"attention KV per request{ctx}", *(_cell(c, format_size(c.attention_bytes_per_request)) if c else "n/a"
                                            for _, c in schemes)),
        ("total per request", *(_cell(c, format_size(c.total_bytes_per_request)) if c else "n/a" for _, c in schemes)),
        ("max concurrent requests", *(_cell(c, str(c.max_concurrency)) if c else "n/a" for _, c in schemes)),
        ("vs vLLM native", *(_vs_native(plan, c) for _, c in schemes)),
    ]
    out = [_headline(plan), "", _table(rows, ("", *(name for name, _ in schemes))), ""]
    if plan.vllm_replayssm is None:
        out.append(f"vLLM ReplaySSM: n/a, it needs 1 + K <= W <= 16 (here 1 + K = {plan.spec.num_tokens})")
    elif plan.vllm_replayssm_window != plan.spec.window:
        out.append(f"vLLM ReplaySSM planned at its largest W = {plan.vllm_replayssm_window}")
    out.append(f"ssmstate vs vLLM native: {plan.concurrency_ratio:.2f}x the requests; "
               f"Mamba state {_mamba_wording(plan)} per request")
    b = plan.builtin_geometry
    if plan.vllm_replayssm is not None and plan.replayssm_bytes_ratio is not None and b is not None \
            and b.state_dtype != plan.geometry.state_dtype:  # an fp32/bf16 page is vLLM's within one conv column
        out.append(f"ssmstate vs vLLM ReplaySSM: Mamba state per request {plan.replayssm_bytes_ratio:.2f}x "
                   f"({plan.replay.mamba_bytes_per_request:,} B vs {plan.vllm_replayssm.mamba_bytes_per_request:,} B), "
                   f"{plan.replay.max_concurrency / plan.vllm_replayssm.max_concurrency:.2f}x the requests")
    vn, vr, vv = plan.vllm_native, plan.vllm_replay, plan.vllm_vllm_replayssm
    if vn is not None and vr is not None:
        vs = [vn, vv, vr]

        def col(f: Any) -> tuple[str, ...]:
            return tuple("n/a" if v is None else f(v) for v in vs)

        bs = lambda v: "-" if v.block_size is None else str(v.block_size)  # noqa: E731
        vrows = [
            ("Mamba page / layer", *col(lambda v: format_size(v.mamba_page_bytes))),
            ("attention block size", *col(bs)),
            ("padded page (padding)", *col(lambda v: f"{format_size(v.page_bytes)} ({100 * v.padding_fraction:.2f}%)")),
            ("groups attn + Mamba (size)",
             *col(lambda v: f"{v.num_attention_groups} + {v.num_mamba_groups} ({v.group_size})")),
            ("Mamba blocks / request", *col(lambda v: str(v.mamba_blocks_per_request))),
            ("attention blocks / request", *col(lambda v: str(v.attention_blocks_per_request))),
            ("blocks / request (all groups)", *col(lambda v: str(v.blocks_per_request))),
            ("num_blocks", *col(lambda v: str(v.num_blocks))),
            ("max concurrency", *col(lambda v: f"{v.max_concurrency:.2f}x")),
        ]
        out += ["", f"vLLM 0.33.0-compatible: 'Maximum concurrency for {plan.max_model_len} tokens per request' "
                    f"(KV-cache memory {format_size(vn.available_memory)})",
                "", _table(vrows, ("", "vLLM native", "vLLM ReplaySSM", "ssmstate")), "",
                f"vLLM figure, ssmstate / native: {plan.vllm_ratio:.2f}x"]
    out += ["", LEGEND]
    return "\n".join(out)


def render_sweep(plans: list[CapacityPlan], failed: dict[int, str] | None = None) -> str:
    vllm = plans[0].vllm_native is not None
    header = ("K", "native pages", "native / req", "native reqs", "vLLM ReplaySSM reqs", "ssmstate / req",
              "ssmstate reqs", "ssmstate / native")
    if vllm:
        header += ("vLLM fig. native", "vLLM fig. ssmstate")
    rows = []
    for p in plans:
        vr = p.vllm_replayssm
        row = (str(p.num_speculative_tokens), str(p.native.pages_per_request),
               format_size(p.native.total_bytes_per_request), str(p.native.max_concurrency),
               "n/a" if vr is None else str(vr.max_concurrency),
               format_size(p.replay.total_bytes_per_request), str(p.replay.max_concurrency),
               f"{p.concurrency_ratio:.2f}x")
        if p.vllm_native is not None and p.vllm_replay is not None:
            row += (f"{p.vllm_native.max_concurrency:.2f}x", f"{p.vllm_replay.max_concurrency:.2f}x")
        rows.append(row)
    ks = [p.num_speculative_tokens for p in plans] + sorted(failed or {})
    out = [_headline(plans[0], sorted(ks)), "", _table(rows, header)]
    for k, reason in sorted((failed or {}).items()):
        out.append(f"K={k} does not fit: {reason}")
    out += ["", LEGEND]
    return "\n".join(out)


def _check_plot_path(path: str) -> None:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        raise UsageError(f"--plot {path!r}: unknown file type {ext or '(none)'!r}; use one of {', '.join(PLOT_FORMATS)}")


def plot_sweep(plans: list[CapacityPlan], path: str) -> None:
    _check_plot_path(path)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib "
                         "(or pip install -e '.[plot]' in the checkout)") from None
    ks = [p.num_speculative_tokens for p in plans]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [p.native.max_concurrency for p in plans], "o-", label="vLLM native (1+K pages)")
    vr = [(p.num_speculative_tokens, p.vllm_replayssm) for p in plans if p.vllm_replayssm is not None]
    if vr:
        ax.plot([k for k, _ in vr], [c.max_concurrency for _, c in vr], "^-", label="vLLM ReplaySSM (W<=16)")
    ax.plot(ks, [p.replay.max_concurrency for p in plans], "s-", label="ssmstate (1 page)")
    ax.set_xlabel("draft tokens K")
    ax.set_ylabel("max concurrent requests")
    ax.set_title(f"{plans[0].model}, {format_size(plans[0].budget_bytes)} for state + KV, TP {plans[0].tp_size}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--plot {path!r}: {exc}") from None
    finally:
        plt.close(fig)


def render_presets() -> str:
    from ssmstate.geometry import load_model, preset_names

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
    from ssmstate.planner import plan_capacity, sweep_k_fitting

    if args.plot is not None and args.sweep_k is None:
        raise UsageError("--plot draws a sweep: give --sweep-k too (e.g. --sweep-k 0..8)")
    if args.plot is not None:
        _check_plot_path(args.plot)
    kwargs: dict[str, Any] = dict(
        gpu_memory=args.gpu_memory, gpu=args.gpu, gpu_utilization=args.gpu_utilization, tp_size=args.tp,
        state_dtype=args.state_dtype, act_dtype=args.act_dtype, max_model_len=args.max_model_len,
        count_attention=not args.no_attention, vllm_compatible=args.vllm_compatible, block_size=args.block_size,
        weight_dtype=args.weight_dtype, weights_memory=args.weights_memory, reserve_memory=args.reserve_memory,
        kv_cache_memory=args.kv_cache_memory, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, cuda_graph_memory=0 if args.enforce_eager else args.cuda_graph_memory,
        non_torch_memory=args.non_torch_memory, builtin_state_dtype=args.builtin_state_dtype,
    )
    if args.window is not None:
        kwargs["window"] = args.window
    if args.sweep_k is None:
        k = args.num_speculative_tokens
        window = kwargs.pop("window", max(16, 1 + k))
        plan = plan_capacity(args.model, num_speculative_tokens=k, window=window, **kwargs)
        return json.dumps(plan.to_dict(), indent=2) if args.json else render_plan(plan)
    ks = parse_k_range(args.sweep_k)
    plans, failed = sweep_k_fitting(args.model, ks, **kwargs)
    if not plans:
        k, reason = next(iter(failed.items()))
        raise UsageError(f"no K of --sweep-k {args.sweep_k} fits; K={k}: {reason}")
    if args.plot:
        plot_sweep(plans, args.plot)
    if args.json:
        return json.dumps({"plans": [p.to_dict() for p in plans],
                           "not_fitting": {str(k): reason for k, reason in failed.items()}}, indent=2)
    text = render_sweep(plans, failed)
    return text + (f"\nplot written to {args.plot}" if args.plot else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input)."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error (or --help / --version)
        return int(exc.code or 0)
    try:
        if args.command == "presets":
            print(render_presets())
        elif args.command == "gpus":
            print(render_gpus())
        else:
            print(_run_plan(args))
    except (SSMStateError, OSError, ValueError) as exc:
        message = " ".join(str(exc).split())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
