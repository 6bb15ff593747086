"""Compile the Triton verify, conv and fused kernels for sm_90a on a machine without a GPU and report their resources.

``--arch`` builds for another GPU (80: an A100, 89: an L40S) with that device class's launch choice (``--sms``,
``--gbps-per-sm``): before compute capability 9.0 the portable kernels, without PDL.

For each launch config: registers, spills, shared memory, and SASS counts (instructions, CTA
barriers, global loads/stores, tensor-core ops), read from the same build the H200 would run
(Triton's own ``ptxas`` and ``cuobjdump``). It costs no device time, so kernel variants are judged
here before they are timed there.

The launches are built by :func:`ssmstate.ops.triton.verify_launches` on CPU tensors of the benchmark
geometry (Nemotron-H layer: H=128, P=64, N=128, G=8, fp32 state, bf16 inputs) under
:func:`ssmstate.ops.triton.override` with a GPU's device class (the launch heuristic in force), and compiled
through Triton's own argument binder so the specialization
(16-byte alignment, divisibility, constants) matches a real launch.

``--allocs`` adds the build's shared-memory buffers (each ``ttg.local_alloc`` of its TTGIR: shape, element type and
bytes), the operands that stay in shared memory next to the checkpoint tile.

Run: ``python tools/kernel_resources.py --batch 256 --T 4 --W 16 [--config '{"shape": "pipelined"}'] [--pdl]
[--allocs] [--fused] [--conv]`` (a config: launch override keys, or with ``--fused`` the fused kernel's ``BLOCK_P``,
``FOLD_N``, ``num_warps``, ``maxnreg``, ``HPP``, with ``--conv`` the conv update's ``num_warps``, ``BLOCK_D``; see
:func:`ssmstate.ops.triton.override`); the launch passes row cursors as the manager does (``StepPlan.row_cursors``)
unless a config says ``"ROW_CURSORS": 0``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from bench_verify import split_config  # noqa: E402
from ssmstate.ops import triton as ops  # noqa: E402

#: the build target (``--arch``): sm_90a by default
TARGET = GPUTarget("cuda", 90, 32)
H, P, N, G = 128, 64, 128, 8
SMS = 132
#: the H200's peak DRAM bandwidth per SM (4,800 GB/s over 132 SMs)
GBPS_PER_SM = 36.4


def capture(batch: int, T: int, W: int, config: dict | None, pdl: bool = False, sms: int = SMS,
            gbps_per_sm: float = GBPS_PER_SM, state_dtype: str = "float32"):
    """(name, kernel, (grid, args, kwargs)) of every launch replay_verify would make for this batch on a GPU of
    ``sms`` SMs and ``gbps_per_sm`` GB/s of DRAM bandwidth per SM."""
    R = W + T
    pages = batch + 1
    bf = torch.bfloat16
    ck = torch.empty(pages, H, P, N, dtype=getattr(torch, state_dtype))
    scale = torch.empty(pages, H, P) if ck.element_size() == 1 else None  # an 8-bit checkpoint's decode scales
    xr = torch.empty(pages, H, R, P, dtype=bf)
    Br = torch.empty(pages, G, R, N, dtype=bf)
    dtr = torch.empty(pages, H, R, dtype=torch.float32)
    rs = torch.zeros(pages, dtype=torch.int32)
    nc = torch.zeros(pages, dtype=torch.int32)
    L = batch * T
    x = torch.empty(L, H, P, dtype=bf)
    dt = torch.empty(L, H, dtype=bf)
    A = torch.empty(H, dtype=torch.float32)
    B = torch.empty(L, G, N, dtype=bf)
    C = torch.empty(L, G, N, dtype=bf)
    D = torch.empty(H, dtype=bf)
    dtb = torch.empty(H, dtype=bf)
    z = torch.empty(L, H, P, dtype=bf)
    out = torch.empty(L, H, P, dtype=bf)
    page_ids = torch.arange(1, batch + 1, dtype=torch.int32)
    cu = torch.arange(0, L + 1, T, dtype=torch.int32)
    # the manager's launch passes StepPlan.row_cursors; a ROW_CURSORS: 0 key builds the launch without them
    config, use_rc = split_config(config, 1)
    rc = torch.zeros((batch, 2), dtype=torch.int32).t() if use_rc else None
    gpu = ops.DeviceClass(compiled=True, sms=sms, gbps_per_sm=gbps_per_sm, arch=TARGET.arch)
    with ops.override(device=gpu, **(config or {})):
        launches = ops.verify_launches(ck, xr, Br, dtr, rs, nc, x, dt, A, B, C, page_ids, cu, W, out, D=D,
                                       dt_bias=dtb, z=z, row_cursors=rc, pdl=pdl, checkpoint_scale=scale)
    return [(k.kernel.fn.__name__, k.kernel, (k.grid, k.args, k.kwargs)) for k in launches]  # split: two


def capture_fused(batch: int, T: int, W: int, config: dict | None, pdl: bool = False, sms: int = SMS,
                  gbps_per_sm: float = GBPS_PER_SM, state_dtype: str = "float32"):
    """(name, kernel, (grid, args, kwargs)) of the fused conv + verify launches (``replay_conv_verify``) for this
    batch (``config``: ``override(fused=...)`` fields, and the TMA kernel's launch override keys)."""
    R, pages, L, bf = W + T, batch + 1, batch * T, torch.bfloat16
    Dc = H * P + 2 * G * N
    e = torch.empty
    gpu = ops.DeviceClass(compiled=True, sms=sms, gbps_per_sm=gbps_per_sm, arch=TARGET.arch)
    config = config or {}
    fused = {k: v for k, v in config.items() if k in ops.config.FUSED_KEYS}  # the rest: the TMA kernel's launch
    with ops.override(device=gpu, fused=fused, **{k: v for k, v in config.items() if k not in fused}):
        launches = ops.conv_verify.conv_verify_launches(
            e(pages, H, P, N, dtype=getattr(torch, state_dtype)), e(pages, H, R, P, dtype=bf),
            e(pages, G, R, N, dtype=bf), e(pages, H, R), torch.zeros(pages, dtype=torch.int32),
            torch.zeros(pages, dtype=torch.int32), e(pages, 3 + T, Dc, dtype=bf).transpose(1, 2),
            torch.zeros(pages, dtype=torch.int32),
            e(L, Dc, dtype=bf), e(L, H, dtype=bf), e(H), e(Dc, 4), e(Dc), torch.arange(1, batch + 1, dtype=torch.int32),
            torch.arange(0, L + 1, T, dtype=torch.int32), W, e(L, H, P, dtype=bf), D=e(H), dt_bias=e(H),
            counters=torch.zeros(pages, G, dtype=torch.int32), pdl=pdl, row_shift=torch.zeros(batch, dtype=torch.int32),
            row_cursors=torch.zeros(2, batch, dtype=torch.int32))
    return [(k.kernel.fn.__name__, k.kernel, (k.grid, k.args, k.kwargs)) for k in launches]


def capture_conv(batch: int, T: int, W: int, config: dict | None, pdl: bool = False, sms: int = SMS,
                 gbps_per_sm: float = GBPS_PER_SM, state_dtype: str = "float32"):
    """(name, kernel, (grid, args, kwargs)) of the conv update's launch (``conv_update`` on the layout's
    channel-contiguous bf16 window, the step's gathered row shifts) for this batch (``config``: its
    ``override(conv=...)`` fields)."""
    L, bf, Dc, k = batch * T, torch.bfloat16, H * P + 2 * G * N, 4
    e = torch.empty
    gpu = ops.DeviceClass(compiled=True, sms=sms, gbps_per_sm=gbps_per_sm, arch=TARGET.arch)
    win = e(batch + 1, k - 1 + T, Dc, dtype=bf).transpose(1, 2)
    with ops.override(device=gpu, conv=config or {}):
        launch = ops.conv.conv_launch(win, torch.zeros(batch + 1, dtype=torch.int32), e(L, Dc, dtype=bf), e(Dc, k),
                                      e(Dc), torch.arange(1, batch + 1, dtype=torch.int32),
                                      torch.arange(0, L + 1, T, dtype=torch.int32), e(L, Dc, dtype=bf), pdl=pdl,
                                      row_shift=torch.zeros(batch, 4, dtype=torch.int32)[:, 3])
    return [(launch.kernel.fn.__name__, launch.kernel, (launch.grid, launch.args, launch.kwargs))]


def compile_launch(fn, args, kwargs):
    """Compile through Triton's binder for sm_90a; returns the CompiledKernel."""
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    if getattr(fn, "is_gluon", lambda: False)():  # the per-warp kernel (Gluon): its own source class
        from triton.experimental.gluon._runtime import GluonASTSource
        src = GluonASTSource(fn, signature, constexprs, attrs)
    else:
        src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=TARGET, options=options.__dict__)


def cuobjdump(cubin: bytes, flag: str) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def resources(cubin: bytes) -> dict[str, int]:
    """Registers, stack frame and spill bytes, from the cubin's resource usage."""
    txt = cuobjdump(cubin, "--dump-resource-usage")
    get = lambda key: int(m.group(1)) if (m := re.search(key + r":(\d+)", txt)) else 0  # noqa: E731
    return {"registers": get("REG"), "stack": get("STACK"), "local": get("LOCAL")}


def sass_ops(cubin: bytes) -> list[str]:
    """The cubin's SASS opcodes in program order, without predicates or modifiers (Triton's cuobjdump): what the
    counts and orders below read, dumped once per build."""
    sass = cuobjdump(cubin, "--dump-sass")
    return [m.group(1).split(".")[0] for line in sass.splitlines()
            if (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line))]


def sass_counts(ops: list[str]) -> dict[str, int]:
    """Counts of SASS opcodes of interest (``ops``: :func:`sass_ops`)."""
    counts = Counter(ops)
    keys = ["BAR", "LDG", "STG", "LDGSTS", "LDS", "STS", "LDSM", "HGMMA", "HMMA", "SHFL", "FFMA", "MUFU", "LDL", "STL"]
    return {"instructions": len(ops), **{k: counts.get(k, 0) for k in keys}}


def wait_order(ops: list[str]) -> dict[str, int]:
    """Where a ``pdl=True`` build waits (``griddepcontrol.wait``: SASS ``ACQBULK``) and lets the next kernel launch
    (``griddepcontrol.launch_dependents``: ``PREEXIT``), as SASS instruction indices (-1: none), and which
    global loads come before the first wait in program order: ``LDG`` (gathers), ``UTMALDG`` (TMA copies) and
    ``UBLKPF`` (bulk L2 prefetches). ``ops``: :func:`sass_ops`."""
    first = lambda op: ops.index(op) if op in ops else -1  # noqa: E731
    wait = first("ACQBULK")
    before = ops[:wait] if wait >= 0 else []
    return {"wait_at": wait, "trigger_at": first("PREEXIT"), "waits": ops.count("ACQBULK"),
            "triggers": ops.count("PREEXIT"), "ldg_before_wait": before.count("LDG"),
            "tma_before_wait": before.count("UTMALDG"), "l2_prefetch_before_wait": before.count("UBLKPF")}


def load_rounds(ops: list[str]) -> dict[str, int]:
    """How the program's loads go out before its first tile copy (``UTMALDG``): the number of barrier-separated
    runs of the SASS up to it that hold a global load (``LDG``). A barrier there is a layout change through shared
    memory, and one that takes a loaded value waits for that load, so each run past the first is a round trip the
    loads after it wait for. -1: no tile copy. ``ops``: :func:`sass_ops`."""
    if "UTMALDG" not in ops:
        return {"load_rounds_before_tile": -1}
    return {"load_rounds_before_tile": _runs_with_loads(ops[:ops.index("UTMALDG")])}


def product_rounds(ops: list[str]) -> dict[str, int]:
    """How the program's loads go out before its first tensor-core product (``HGMMA`` or ``HMMA``), counted from
    its first PDL wait (``ACQBULK``) if it has one: the number of barrier-separated runs of that stretch of SASS
    that hold a global load (``LDG``), as in :func:`load_rounds`. One: every such load goes out in one round trip.
    -1: no product. ``ops``: :func:`sass_ops`."""
    mma = [i for i, op in enumerate(ops) if op in ("HGMMA", "HMMA")]
    if not mma:
        return {"load_rounds_before_products": -1}
    start = ops.index("ACQBULK") + 1 if "ACQBULK" in ops[:mma[0]] else 0
    return {"load_rounds_before_products": _runs_with_loads(ops[start:mma[0]])}


def _runs_with_loads(ops: list[str]) -> int:
    """The barrier-separated runs of this stretch of SASS that hold a global load (``LDG``)."""
    rounds, loads = 0, False
    for op in ops:
        if op == "BAR":
            rounds += loads
            loads = False
        loads |= op == "LDG"
    return rounds + loads


_ELEM_BYTES = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "i64": 8, "i8": 1}


def shared_allocs(ttgir: str) -> list[dict]:
    """The shared-memory buffers a build allocates (its TTGIR's ``ttg.local_alloc`` results), in program order.
    Triton reuses the space of buffers whose lives do not overlap, and adds scratch for layout conversions, so
    ``shared_bytes`` is at most their sum plus that scratch, not the sum itself."""
    rows = []
    for m in re.finditer(r"ttg\.local_alloc[^\n]*?-> !ttg\.memdesc<([0-9x]+)x([a-z]+[0-9]+),", ttgir):
        dims, elem = [int(d) for d in m.group(1).split("x")], m.group(2)
        rows.append({"shape": m.group(1), "dtype": elem, "bytes": math.prod(dims) * _ELEM_BYTES.get(elem, 0)})
    return rows


def report(batch: int, T: int, W: int, config: dict | None, pdl: bool = False, allocs: bool = False,
           fused: bool = False, conv: bool = False, state_dtype: str = "float32", sms: int = SMS,
           gbps_per_sm: float = GBPS_PER_SM) -> list[dict]:
    """One row per kernel the launch runs (``fused``: the fused conv + verify kernel's; ``conv``: the conv
    update's)."""
    rows = []
    cap = capture_fused if fused else capture_conv if conv else capture
    for name, fn, (grid, args, kwargs) in cap(batch, T, W, config, pdl, sms, gbps_per_sm,
                                                  state_dtype=state_dtype):
        k = compile_launch(fn, args, kwargs)
        md = k.metadata
        row = {
            "kernel": name, "batch": batch, "T": T, "W": W, "config": config or "heuristic",
            "grid": list(grid), "num_warps": md.num_warps, "shared_bytes": md.shared, "pdl": pdl,
            "state_dtype": state_dtype,
        }
        row.update(resources(k.asm["cubin"]))
        ops = sass_ops(k.asm["cubin"])
        row.update(sass_counts(ops))
        row.update(wait_order(ops))
        row.update(load_rounds(ops))
        row.update(product_rounds(ops))
        if allocs:
            row["shared_allocs"] = shared_allocs(k.asm["ttgir"])
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--W", type=int, default=16)
    ap.add_argument("--config", action="append", default=[], help="JSON launch config (repeatable)")
    ap.add_argument("--pdl", action="store_true", help="the launch replay_verify(pdl=True) makes")
    ap.add_argument("--allocs", action="store_true", help="list the build's shared-memory buffers (TTGIR)")
    ap.add_argument("--fused", action="store_true",
                    help="the fused conv + verify kernel (configs: override(fused=...) fields, e.g. BLOCK_P)")
    ap.add_argument("--conv", action="store_true",
                    help="the conv update (configs: override(conv=...) fields, e.g. num_warps)")
    ap.add_argument("--state-dtype", default="float32", choices=("float32", "bfloat16", "int8", "float8_e4m3fn"),
                    help="the checkpoint's dtype (8-bit: with its decode scales)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability to build for (90: sm_90a; 80: an A100's sm_80, 89: an L40S's sm_89)")
    ap.add_argument("--sms", type=int, default=SMS, help="the device class's SMs (132: H100/H200; 108: A100)")
    ap.add_argument("--gbps-per-sm", type=float, default=GBPS_PER_SM,
                    help="the device class's DRAM GB/s per SM (36.4: H200; 25.4: H100 80GB HBM3; 18.9: A100 80GB)")
    a = ap.parse_args()
    global TARGET
    TARGET = GPUTarget("cuda", a.arch, 32)
    configs = [json.loads(c) for c in a.config] or [None]
    rows = []
    for cfg in configs:
        for row in report(a.batch, a.T, a.W, cfg, a.pdl, a.allocs, a.fused, a.conv, a.state_dtype, a.sms,
                          a.gbps_per_sm):
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
