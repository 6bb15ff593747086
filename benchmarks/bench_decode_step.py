"""The state work of a whole decode step of a real model, one CUDA graph per step, on one GPU.

A step is, for every Mamba layer of the model, the conv update and the verify of the step's rows, then the commit
of the accepted counts: what a speculative-decoding runner adds to the model's matmuls. Geometries: Nemotron-H-8B
(24 Mamba layers, H=128, P=64, N=128, G=8) and Nemotron 3 Nano 30B-A3B (23 layers, H=64), both from
``ssmstate.geometry`` presets, fp32 state, bf16 activations, MTP K=3 (T=4), window W=16. Variants:

* ``ours``: ``StateManager.conv_verify`` per layer as the vLLM plugin calls it ("triton" backend, default options: the
  launch table picks the fused kernel or the conv + verify pair, and for the pair programmatic dependent launch)
  + commit;
* ``ours_fused``: ``StateManager.conv_verify`` forced onto the fused layer kernel + commit (the TMA verify kernel
  with its conv; extras: ``ours_fused_pdl`` launched as programmatic dependents, ``ours_fused_portable`` the portable
  fused kernel);
* ``ours_unfused``: ``StateManager.conv`` then ``verify`` per layer ("triton", no PDL) + commit;
* ``vllm_pair``: vLLM's built-in ReplaySSM pair: vLLM's Triton ``causal_conv1d_update`` on its own conv state
  (``(blocks, K + k - 1, conv_dim)`` stored, passed transposed, ``num_accepted_tokens`` = the last step's counts)
  then FlashInfer ``checkpointing_ssu`` on the shared pages with the algorithm ``FlashInferBackend.tune()`` measured
  fastest for the batch, + the commit (one Triton launch);
* ``fi_backend``: our "flashinfer" backend as a runner uses it: ``conv`` (vLLM's kernel on the replay window) and
  ``verify`` (tuned ``checkpointing_ssu``) + commit;
* ``native``: vLLM's native speculative scheme: vLLM's conv + FlashInfer ``selective_state_update`` reading the
  last accepted token's state and writing T states per request (1 + K pages per request).

Acceptance and flushes: each row's accepted count (bonus included) is drawn per step as MTP K=3 acceptance is
usually modelled: each draft accepted with probability 0.7, stopping at the first rejection (a in 1..4, mean
2.53). The commits are real (on the device, inside the graph), so ring cursors evolve as in serving and flush rows
(``c + T > W``) occur at their natural cadence; warm-up steps reach the steady state before timing. The flush
fraction seen is reported. Every variant replays the same draws.

Cold pages: twice the L2's size of scratch is written before every step (outside the timing), and within a step
each layer's pages are read once, after ``b x (layers - 1) x page bytes`` of other layers' pages. The native
variant keeps only as many distinct per-layer state tensors as keep that distance above 4 x L2 (its states, 4
pages per request per layer, would not fit the GPU otherwise) and cycles the layers over them.

Time: CUDA events around each graph replay (the per-step host work, ``begin_step``'s small uploads and the count
uploads, is outside), median over the timed steps. Bytes per step: what each variant must move at least (state
and ring reads/writes at the measured flush fraction and history depth, conv windows, the step's inputs and
outputs, and for the unfused pair the conv output's round trip); the fraction of copy bandwidth compares
bytes/time with a 2 GiB device-to-device copy timed in the same process.

Run (repo root, GPU): ``python benchmarks/bench_decode_step.py --json decode_step.json``. FlashInfer variants need
``import flashinfer`` (tools/fi_env.sh), vLLM's conv an installed vLLM or its kernel sources
(``SSMSTATE_VLLM_KERNELS``, tests/gpu/copy_vllm_kernels.py). ``--cpu-smoke`` runs the ours variants end to end on
CPU under the Triton interpreter at toy sizes (timings meaningless). ``--warm MODEL:KERNEL`` only JIT-builds one
FlashInfer kernel (``ckpt`` or ``ssu``) for a model, for a background prebuild. ``--launch JSON`` captures the
variants on our Triton backend under a verify launch override (``ssmstate.ops.triton.override`` keys), to time a
launch the table does not pick over a whole step; the JSON records it. ``--launches '{"NAME": {...}}'`` with a
variant ``ours@NAME`` times a launch beside the table's own and vLLM's pair in the same process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_verify as bv  # noqa: E402  (copy bandwidth, FlashInfer loading, the acceptance draw)
from progress import progress  # noqa: E402

MODELS = ("nemotron-h-8b", "nemotron-3-nano-30b-a3b")
VARIANTS = ("ours", "ours_fused", "ours_unfused", "vllm_pair", "fi_backend", "native")
#: more variants ``--variants`` takes: ours with programmatic dependent launch, and the two cross pairs that split
#: a gap between ours and vLLM's pair into its conv and verify parts (vLLM's conv + our verify; our conv + FlashInfer)
EXTRA = ("ours_fused_pdl", "ours_fused_portable", "ours_unfused_pdl",
         "diag_vllmconv_oursverify", "diag_oursconv_fiverify")
K, W = 3, 16
log = bv.log
#: --launch: a verify launch override (ssmstate.ops.triton.override keys) for every variant on the "triton" backend
LAUNCH: dict = {}
#: --launches: named overrides; a variant ``VARIANT@NAME`` is VARIANT run under NAME's, so two launches are timed in
#: one process (e.g. ``ours@late`` beside ``ours`` and ``vllm_pair``)
LAUNCHES: dict[str, dict] = {}


def split_variant(variant: str) -> tuple[str, dict]:
    """``(variant, override)`` of a ``VARIANT@NAME`` name: the variant run and its launch (``--launch`` with
    NAME's fields over it)."""
    base, _, name = variant.partition("@")
    return base, {**LAUNCH, **LAUNCHES[name]} if name else dict(LAUNCH)


def on_triton(variant: str) -> bool:
    """Whether a variant's verify runs on our "triton" backend (the one a launch override applies to)."""
    return variant.startswith(("ours", "diag_vllmconv"))


def load_vllm_conv():
    """vLLM's Triton ``causal_conv1d_update``: from ``SSMSTATE_VLLM_KERNELS`` (the kernel sources behind the
    shim) when set, else an installed vLLM; None when neither works."""
    kernels = os.environ.get("SSMSTATE_VLLM_KERNELS")
    try:
        if kernels and "vllm" not in sys.modules:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                                            "gpu"))
            import vllm_kernel_shim

            vllm_kernel_shim.load(kernels)
        from ssmstate.backends.flashinfer_conv import import_vllm_conv

        return import_vllm_conv()
    except Exception as exc:
        log(f"vLLM's conv not importable ({exc!r:.200}); vLLM-conv variants skipped")
        return None


def geometry(model: str):
    from ssmstate import Mamba2Geometry
    from ssmstate.geometry import load_model

    if bv.SMOKE:
        return Mamba2Geometry(num_heads=4, head_dim=16, state_size=16, n_groups=2, conv_kernel=4, num_layers=2,
                              state_dtype=torch.float32, act_dtype=torch.bfloat16)
    return load_model(model).mamba_geometry(state_dtype=torch.float32, act_dtype=torch.bfloat16)


# -- the step's inputs, shared by every variant --------------------------------------------------------------


class Inputs:
    """Static per-step inputs (one set for every layer: they come fresh from the layer's projection, L2-warm)."""

    def __init__(self, g, rows: int, T: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        dev, act = bv.DEV, g.act_dtype
        H, P, Dc, k = g.heads_per_rank, g.head_dim, g.conv_dim_per_rank, g.conv_kernel
        L = rows * T
        self.xBC = (torch.randn(L, Dc, generator=gen) * 0.5).to(dev, act)
        self.dt = (torch.randn(L, H, generator=gen) * 0.5).to(dev, act)
        self.A = (-torch.rand(H, generator=gen) * 2 - 0.5).to(dev)
        self.D = torch.randn(H, generator=gen).to(dev, act)
        self.dt_bias = (torch.rand(H, generator=gen) * 0.1).to(dev, act)
        self.weight = (torch.randn(Dc, k, generator=gen) * 0.3).to(dev, act)
        self.bias = (torch.randn(Dc, generator=gen) * 0.1).to(dev, act)
        self.conv_out = torch.empty(L, Dc, device=dev, dtype=act)
        self.y = torch.empty(L, H, P, device=dev, dtype=act)


_SCRUB: list[torch.Tensor] = []


def scrub_l2(l2: int) -> None:
    """Write twice the L2's size of scratch before a step, so the step starts with nothing of its own in L2."""
    if bv.SMOKE or not l2:
        return
    if not _SCRUB:
        _SCRUB.append(torch.empty(2 * l2 // 4 + 1, dtype=torch.float32, device=bv.DEV))
    _SCRUB[0].zero_()


def draws(rows: int, steps: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[bv.draw_accepted(rng, K + 1) for _ in range(rows)] for _ in range(steps)]


def cursor_stats(acc: list[list[int]], warm: int) -> tuple[float, float]:
    """Flush fraction and mean history depth c of the timed steps, replaying the commit rule on the host."""
    T = K + 1
    c = [0] * len(acc[0])
    fl = deep = n = 0
    for s, row in enumerate(acc):
        for r, a in enumerate(row):
            flush = c[r] + T > W
            if s >= warm:
                fl += flush
                deep += 0 if flush else c[r]
                n += 1
            c[r] = a if flush else c[r] + a
    return fl / n, deep / n


# -- manager-driven variants (one CUDA graph per step: DecodeStepGraph) -----------------------------------------


def manager_step(variant: str, g, rows: int, inp: Inputs, fi_backend, vconv, l2: int):
    """``(run(accepted, previous) -> µs, cleanup)`` for a variant driven through a StateManager."""
    variant, launch = split_variant(variant)
    from ssmstate import PageLayout, SpecConfig, StateManager
    from ssmstate.ops import triton as trk
    from ssmstate.ops.reference import split_xbc
    from ssmstate.ops.triton import override

    T = K + 1
    layout = PageLayout.replay(g, SpecConfig(K, window=W))
    name = "triton" if on_triton(variant) else "flashinfer"
    opts = {"pdl": True} if variant.endswith("_pdl") else None
    m = StateManager(layout, rows + 1, device=bv.DEV, backend=name, max_batch=rows, backend_options=opts)
    if name == "flashinfer":
        m.backend = fi_backend
    conv_by = ("vllm" if variant in ("vllm_pair", "diag_vllmconv_oursverify")
               else "ops" if variant == "diag_oursconv_fiverify" else "manager")
    ids = [f"r{i}" for i in range(rows)]
    for r in ids:
        m.admit(r)
    H, P, N, Gg, Dc = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank
    acc = torch.zeros(rows, dtype=torch.int32, device=bv.DEV)
    prev = torch.ones(rows, dtype=torch.int32, device=bv.DEV)
    vstate = None
    if conv_by == "vllm":  # vLLM's own conv state: (blocks, K + k - 1, conv_dim), passed transposed
        vstate = [torch.zeros(rows + 1, K + g.conv_kernel - 1, Dc, device=bv.DEV, dtype=g.act_dtype).transpose(1, 2)
                  for _ in range(g.num_layers)]

    def body(plan):
        for lay in range(g.num_layers):
            if variant == "ours":  # as the vLLM plugin runs a layer: the launch table picks fused or pair, and PDL
                m.conv_verify(lay, plan, inp.xBC, inp.dt, inp.A, inp.weight, inp.bias, D=inp.D, dt_bias=inp.dt_bias,
                              out=inp.y)
                continue
            if variant.startswith("ours_fused"):  # the fused kernel is off by default (launch table): force it
                fused = {"MAX_ROWS": 1 << 20, **({"TMA": 0} if variant == "ours_fused_portable" else {})}
                with override(fused=fused):
                    m.conv_verify(lay, plan, inp.xBC, inp.dt, inp.A, inp.weight, inp.bias, D=inp.D,
                                  dt_bias=inp.dt_bias, out=inp.y)
                continue
            if conv_by == "vllm":
                co = vconv(inp.xBC, vstate[lay], inp.weight, inp.bias, "silu", conv_state_indices=plan.page_ids,
                           num_accepted_tokens=prev, query_start_loc=plan.cu_seqlens, max_query_len=T,
                           out=inp.conv_out)
            elif conv_by == "ops":  # our Triton conv on the replay window, outside the manager (diagnostic)
                co = trk.conv_update(m.cache.layers[lay]["conv"], m.cache.conv_shift, inp.xBC, inp.weight, inp.bias,
                                     plan.page_ids, plan.cu_seqlens, inp.conv_out)
            else:
                co = m.conv(lay, plan, inp.xBC, inp.weight, inp.bias, out=inp.conv_out)
            x, B, C = split_xbc(co, H, P, Gg, N)
            m.verify(lay, plan, x, inp.dt, B, C, inp.A, D=inp.D, dt_bias=inp.dt_bias, out=inp.y)

    def launch_override():  # the graph keeps the launches chosen while it is captured
        return override(**launch) if launch and name == "triton" else contextlib.nullcontext()

    if bv.SMOKE:
        def run(a: torch.Tensor, p: torch.Tensor) -> float:
            t0 = time.perf_counter()
            plan = m.begin_step(ids, T)
            with launch_override():
                body(plan)
            m.commit(plan, a.tolist())
            return (time.perf_counter() - t0) * 1e6
        return run, lambda: None

    from ssmstate.cuda_graph import DecodeStepGraph

    dsg = DecodeStepGraph(m, rows, T, body, acc)
    acc.fill_(1)
    with launch_override():
        dsg.capture(ids)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(a: torch.Tensor, p: torch.Tensor) -> float:
        acc.copy_(a, non_blocking=True)
        prev.copy_(p, non_blocking=True)
        scrub_l2(l2)
        dsg.step(ids, timing=(e0, e1))
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3

    def cleanup() -> None:
        nonlocal m, dsg
        if name == "flashinfer":
            fi_backend.release(m.cache)
        del dsg, m
    return run, cleanup


# -- native scheme (raw calls, one CUDA graph per step) ------------------------------------------------------------


def native_step(g, rows: int, inp: Inputs, fi, vconv, l2: int):
    from flashinfer.mamba import selective_state_update

    from ssmstate.ops.reference import split_xbc

    T = K + 1
    H, P, N, Gg, Dc = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank
    per_layer = rows * T * H * P * N * 4
    distinct = min(g.num_layers, max(1, -(-4 * l2 // max(1, per_layer)) + 1))
    states = [torch.empty(1 + rows * T, H, P, N, device=bv.DEV).normal_(0, 0.1) for _ in range(distinct)]
    convs = [torch.zeros(rows + 1, K + g.conv_kernel - 1, Dc, device=bv.DEV, dtype=g.act_dtype).transpose(1, 2)
             for _ in range(distinct)]
    table = torch.arange(1, 1 + rows * T, dtype=torch.int32, device=bv.DEV).view(rows, T)
    blocks = torch.arange(1, rows + 1, dtype=torch.int32, device=bv.DEV)
    cu = torch.arange(0, rows * T + 1, T, dtype=torch.int32, device=bv.DEV)
    prev = torch.ones(rows, dtype=torch.int32, device=bv.DEV)
    A3 = inp.A[:, None, None].expand(H, P, N)
    D2, b2 = inp.D[:, None].expand(H, P), inp.dt_bias[:, None].expand(H, P)
    dt4 = inp.dt.view(rows, T, H, 1).expand(rows, T, H, P)
    y4 = inp.y.view(rows, T, H, P)

    def step() -> None:
        for lay in range(g.num_layers):
            j = lay % distinct
            co = vconv(inp.xBC, convs[j], inp.weight, inp.bias, "silu", conv_state_indices=blocks,
                       num_accepted_tokens=prev, query_start_loc=cu, max_query_len=T, out=inp.conv_out)
            x, B, C = split_xbc(co, H, P, Gg, N)
            selective_state_update(states[j], x.view(rows, T, H, P), dt4, A3, B.view(rows, T, Gg, N),
                                   C.view(rows, T, Gg, N), D2, dt_bias=b2, dt_softplus=True,
                                   state_batch_indices=table, dst_state_batch_indices=table, pad_slot_id=0,
                                   num_accepted_tokens=prev, out=y4, cache_steps=T)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(a: torch.Tensor, p: torch.Tensor) -> float:
        prev.copy_(p, non_blocking=True)
        scrub_l2(l2)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3
    return run, lambda: None


# -- bytes model -------------------------------------------------------------------------------------------------


def bytes_per_step(variant: str, g, rows: int, flush_frac: float, mean_c: float) -> float:
    """Bytes a variant must move per step, all layers (see the module docstring)."""
    from ssmstate import PageLayout, SpecConfig

    T = K + 1
    layout = PageLayout.replay(g, SpecConfig(K, window=W))
    specs = {t.name: t for t in layout.tensors}
    act = torch.empty((), dtype=g.act_dtype).element_size()
    H, P, Dc, KW = g.heads_per_rank, g.head_dim, g.conv_dim_per_rank, g.conv_kernel - 1
    S = specs["checkpoint"].nbytes
    R = layout.spec.ring_len
    ring_row = (specs["x_ring"].nbytes + specs["B_ring"].nbytes + specs["dt_ring"].nbytes) / R
    io = T * (Dc + H + H * P) * act  # xBC and dt in, y out
    if variant == "native":
        conv = Dc * (KW + (KW + K)) * act  # history read, window written (vLLM's K + k - 1 columns)
        per_row = S + T * S + io + conv
    else:
        conv = Dc * (KW + (KW + T)) * act
        per_row = S + flush_frac * S + (1 - flush_frac) * mean_c * ring_row + T * ring_row + io + conv
        if not variant.startswith("ours_fused"):
            per_row += 2 * T * Dc * act  # the conv output written, then read back by the verify
    return per_row * rows * g.num_layers


# -- one model -----------------------------------------------------------------------------------------------------


def bench_model(model: str, batches: list[int], variants: list[str], args, fi, vconv, l2: int,
                copy_tbps: float, save) -> list[dict]:
    from ssmstate import PageLayout, SpecConfig, StateManager

    g = geometry(model)
    layout = PageLayout.replay(g, SpecConfig(K, window=W))
    log(f"\n== {model}: {g.num_layers} Mamba layers, H={g.heads_per_rank} P={g.head_dim} N={g.state_size} "
        f"G={g.groups_per_rank}, page {layout.page_bytes / 2**20:.1f} MiB per request")
    fi_backend = None
    if fi is not None and any(v in variants for v in ("vllm_pair", "fi_backend", "diag_oursconv_fiverify")):
        fi_backend = StateManager(layout, 2, device=bv.DEV, backend="flashinfer", max_batch=1).backend
    rows_out = []
    steps = args.warm_steps + args.steps
    for b in batches:
        acc = draws(b, steps, seed=b)
        flush_frac, mean_c = cursor_stats(acc, args.warm_steps)
        row = {"model": model, "batch": b, "layers": g.num_layers, "flush_fraction": flush_frac,
               "mean_history_rows": mean_c}
        if fi_backend is not None:  # tuned batch by batch, so a run cut short keeps complete batches
            t0 = time.time()
            try:
                row["fi_tune"] = fi_backend.tune(layout, bv.DEV, [b], reps=args.tune_reps)
            except Exception as exc:  # record it and go on to the next batch when FlashInfer's tuning breaks
                row["fi_tune_error"] = repr(exc)[:400]
                log(f"  {model} b={b} FlashInfer tune failed: {row['fi_tune_error']}")
                rows_out.append(row)
                save(rows_out)
                continue
            row["fi_tune_s"] = time.time() - t0
            row["fi_algorithm"] = fi_backend.algorithm_for("dense", b)
            for r in row["fi_tune"]:
                log(f"  tune {r['form']:>6} batch {b:>3}: " + " ".join(f"{a} {us:.2f} us" for a, us in r["us"].items())
                    + f" -> {r['chosen']}" + (f" (auto runs: {r['auto_runs']})" if "auto_runs" in r else "")
                    + (f" [tuner miss: {r['tuner_miss']}]" if "tuner_miss" in r else ""))
        inp = Inputs(g, b, K + 1)
        acc_t = [torch.tensor(a, dtype=torch.int32).pin_memory() if not bv.SMOKE else torch.tensor(a, dtype=torch.int32)
                 for a in acc]
        first = torch.ones(b, dtype=torch.int32)
        for v in variants:
            why = skip_reason(v, fi, vconv)
            if why is None and split_variant(v)[0] in EXTRA and args.extra_batches and b not in args.extra_batches:
                why = "not run at this batch (--extra-batches)"
            if why:
                row[f"{v}_skipped"] = why
                continue
            try:
                if v == "native":
                    run, cleanup = native_step(g, b, inp, fi, vconv, l2)
                else:
                    run, cleanup = manager_step(v, g, b, inp, fi_backend, vconv, l2)
                times = [run(acc_t[s], acc_t[s - 1] if s else first) for s in range(steps)]
                cleanup()
            except Exception as exc:  # keep the other variants when one breaks
                row[f"{v}_error"] = repr(exc)[:400]
                log(f"  {model} b={b} {v} failed: {row[f'{v}_error']}")
                continue
            us = statistics.median(times[args.warm_steps:])
            nbytes = bytes_per_step(v, g, b, flush_frac, mean_c)
            row[f"{v}_us"] = us
            if "@" in v:
                row[f"{v}_launch"] = split_variant(v)[1]
            row[f"{v}_bytes"] = nbytes
            row[f"{v}_frac_of_copy"] = nbytes / (us * 1e-6) / 1e12 / copy_tbps
            if not bv.SMOKE:
                torch.cuda.empty_cache()
        base = row.get("vllm_pair_us")
        for v in variants:
            if base and f"{v}_us" in row:
                row[f"{v}_vs_vllm_pair"] = base / row[f"{v}_us"]
        log("  " + json.dumps({k: (round(x, 3) if isinstance(x, float) else x) for k, x in row.items()}))
        rows_out.append(row)
        save(rows_out)  # after every batch: a run cut short keeps what it measured
    return rows_out


def skip_reason(variant: str, fi, vconv) -> str | None:
    from ssmstate import StateManager

    variant, name = variant.partition("@")[::2]
    if name and name not in LAUNCHES:
        return f"no launch {name!r} in --launches"
    if name and not on_triton(variant):
        return "a launch applies to the variants on our Triton backend only"
    if variant not in VARIANTS + EXTRA:
        return f"unknown variant (choose from {', '.join(VARIANTS + EXTRA)})"
    if variant.startswith("ours_fused") and not hasattr(StateManager, "conv_verify"):
        return "StateManager.conv_verify is not in this checkout"
    if variant in ("vllm_pair", "fi_backend", "native", "diag_oursconv_fiverify") and fi is None:
        return "flashinfer not importable"
    if variant in ("vllm_pair", "fi_backend", "native", "diag_vllmconv_oursverify") and vconv is None:
        return "vLLM's conv not importable"
    return None


# -- report --------------------------------------------------------------------------------------------------------


def print_table(rows: list[dict], variants: list[str], copy_tbps: float) -> None:
    log(f"\ncopy bandwidth (read + write): {copy_tbps:.2f} TB/s")
    for model in dict.fromkeys(r["model"] for r in rows):
        log(f"\n{model}: µs per decode step (all Mamba layers: conv + verify each, then the commit), "
            f"x = vLLM pair / variant, % = bytes per step / time as a fraction of copy bandwidth")
        hdr = f"{'batch':>5} {'fl%':>4} | " + " | ".join(f"{v:>22}" for v in variants)
        log(hdr)
        log("-" * len(hdr))
        for r in (r for r in rows if r["model"] == model):
            cells = []
            for v in variants:
                if f"{v}_us" in r:
                    x = r.get(f"{v}_vs_vllm_pair")
                    cells.append(f"{r[f'{v}_us']:9.1f} {x if x else float('nan'):5.2f}x "
                                 f"{100 * r[f'{v}_frac_of_copy']:4.0f}%")
                else:
                    cells.append(f"{'skipped' if f'{v}_skipped' in r else 'failed':>22}")
            log(f"{r['batch']:>5} {100 * r['flush_fraction']:>4.0f} | " + " | ".join(f"{c:>22}" for c in cells))
        for r in (r for r in rows if r["model"] == model):
            for v in variants:
                if f"{v}_skipped" in r or f"{v}_error" in r:
                    log(f"  batch {r['batch']} {v}: {r.get(f'{v}_skipped') or r.get(f'{v}_error')}")
            break


def markdown(paths: list[str]) -> str:
    """The docs/performance.md decode-step table from saved JSON files: µs per step (ratio vLLM pair ÷ variant,
    % of copy bandwidth), the card of each file named; a variant no row measured gets no column, and a launch
    override's (``VARIANT@NAME``) follows the others."""
    runs = []
    for path in paths:
        with open(path) as fh:
            res = json.load(fh)
        runs += res.get("runs", [res])  # a docs/results record holds one run per model under "runs"
    cols = tuple(v for v in ("ours", "ours_fused", "ours_fused_pdl", "ours_unfused", "ours_unfused_pdl", "vllm_pair",
                             "fi_backend", "native") if any(f"{v}_us" in r for res in runs for r in res["rows"]))
    # launch-override variants (VARIANT@NAME) after them, in the order the runs name them
    cols += tuple(dict.fromkeys(v for res in runs for v in res.get("variants", []) if "@" in v))
    out = ["| card | model | batch | flush % | " + " | ".join(cols) + " |", "|---" * (4 + len(cols)) + "|"]
    for res in runs:
        card = res["env"]["gpu"]
        for r in res["rows"]:
            cells = []
            for v in cols:
                us = r.get(f"{v}_us")
                x = r.get(f"{v}_vs_vllm_pair")
                cells.append("-" if us is None else f"{us:.1f} ({x:.2f}×, {100 * r[f'{v}_frac_of_copy']:.0f} %)" if x
                             else f"{us:.1f} ({100 * r[f'{v}_frac_of_copy']:.0f} %)")
            out.append(f"| {card} | {r['model']} | {r['batch']} | {100 * r['flush_fraction']:.0f} | "
                       + " | ".join(cells) + " |")
    return "\n".join(out)


def warm(spec: str) -> None:
    """JIT-build one FlashInfer kernel for a model (``MODEL:ckpt`` or ``MODEL:ssu``) and exit."""
    model, kernel = spec.split(":")
    fi, _ = bv.load_flashinfer(False)
    g = geometry(model)
    t0 = time.time()
    if kernel == "ckpt":
        from ssmstate import PageLayout, SpecConfig, StateManager
        from ssmstate.backends import flashinfer_tune as ft

        layout = PageLayout.replay(g, SpecConfig(K, window=W))
        be = StateManager(layout, 2, device=bv.DEV, backend="flashinfer", max_batch=1).backend
        gen = torch.Generator().manual_seed(0)
        priv, _ = ft.private_cache(layout, [1], torch.device(bv.DEV), 0, gen)
        with be.forcing("monolith"):
            be.run_probe(priv, ft.probe(layout, ft.CallShape.vllm(layout), "dense", 1, 1, torch.device(bv.DEV),
                                        gen), 0)
    else:
        inp = Inputs(g, 1, K + 1)
        native_step(g, 1, inp, fi, _StubConv(), 0)
    torch.cuda.synchronize()
    log(f"warm {spec}: {time.time() - t0:.1f} s")


class _StubConv:
    """Stands in for vLLM's conv when only FlashInfer's kernel is being built (the conv output is not used)."""

    def __call__(self, x, *a, out=None, **k):
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="decode_step.json")
    ap.add_argument("--models", default=None, help=f"default {','.join(MODELS)} (--cpu-smoke: the first)")
    ap.add_argument("--batches", default=None, help="default 1,2,4,8,16,32,64,128,256 (--cpu-smoke: 1,2)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=None, help="timed steps per point (default 40; smoke 2)")
    ap.add_argument("--warm-steps", type=int, default=None, help="steps before timing (default 24; smoke 1)")
    ap.add_argument("--tune-reps", type=int, default=10)
    ap.add_argument("--extra-batches", default=None,
                    help=f"run the extra variants ({', '.join(EXTRA)}) only at these batches (default: every batch)")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--launch", default=None,
                    help="JSON verify launch override (ssmstate.ops.triton.override keys, e.g. '{\"shape\": "
                         "\"one_head\"}') for the variants on our Triton backend")
    ap.add_argument("--launches", default=None,
                    help="JSON {NAME: override}: variants VARIANT@NAME run VARIANT under that launch override, in "
                         "the same process as the others (e.g. '{\"late\": {\"LATE\": 1}}' with --variants "
                         "ours,ours@late,vllm_pair)")
    ap.add_argument("--warm", default=None, help="only JIT-build FlashInfer's kernel MODEL:ckpt|ssu, then exit")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="the ours variants end to end on CPU under TRITON_INTERPRET=1, toy sizes, 2 layers")
    ap.add_argument("--markdown", nargs="+", default=None, metavar="JSON",
                    help="only print the docs table from saved JSON files (no GPU), then exit")
    args = ap.parse_args()
    if args.markdown:
        return print(markdown(args.markdown))
    if args.warm:
        return warm(args.warm)
    t0 = time.time()
    if args.launch:
        LAUNCH.update(json.loads(args.launch))
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        bv.DEV, bv.SMOKE = "cpu", True
        args.no_flashinfer = True
    elif not torch.cuda.is_available():
        sys.exit("bench_decode_step.py needs a CUDA GPU (or --cpu-smoke)")
    LAUNCHES.update(json.loads(args.launches) if args.launches else {})
    for launch in [LAUNCH, *LAUNCHES.values()]:  # refused here (ConfigError), not per variant after minutes of set-up
        from ssmstate.ops.triton import override
        with override(**launch):
            pass
    smoke = lambda s, full: s if args.cpu_smoke else full  # noqa: E731
    batches = [int(b) for b in (args.batches or smoke("1,2", "1,2,4,8,16,32,64,128,256")).split(",")]
    args.steps = args.steps or smoke(2, 40)
    args.warm_steps = args.warm_steps if args.warm_steps is not None else smoke(1, 24)
    variants = args.variants.split(",")
    args.extra_batches = [int(b) for b in args.extra_batches.split(",")] if args.extra_batches else None
    models = (args.models or smoke(MODELS[0], ",".join(MODELS))).split(",")
    fi, fi_version = bv.load_flashinfer(args.no_flashinfer)
    vconv = None if args.cpu_smoke else load_vllm_conv()
    import triton
    if bv.SMOKE:
        name, l2 = "cpu (Triton interpreter smoke run)", 0
    else:
        props = torch.cuda.get_device_properties(0)
        name, l2 = props.name, getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    env = {"gpu": name, "l2_bytes": l2, "torch": torch.__version__, "triton": triton.__version__,
           "flashinfer": fi_version, "python": platform.python_version(), "command": " ".join(sys.argv),
           "launch": LAUNCH or None, "launches": LAUNCHES or None,
           "mix": {"K": K, "W": W, "accept_p": bv.ACCEPT_P, "steps": args.steps, "warm_steps": args.warm_steps}}
    log(json.dumps(env))
    copy_tbps = bv.copy_bandwidth()
    log(f"copy bandwidth {copy_tbps:.2f} TB/s")
    rows: list[dict] = []

    def save(more: list[dict]) -> None:
        with open(args.json, "w") as fh:
            json.dump({"env": env, "copy_TBps": copy_tbps, "variants": variants, "rows": rows + more,
                       "seconds": time.time() - t0}, fh, indent=1)

    bar = progress(len(models), "bench_decode_step (models)")
    for model in models:
        rows += bench_model(model, batches, variants, args, fi, vconv, l2, copy_tbps, save)
        bar.update(1)
    bar.close()
    print_table(rows, variants, copy_tbps)
    log(f"wrote {args.json} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
