"""The conv update alone: ours on the replay window against vLLM's Triton ``causal_conv1d_update`` on its own state.

A decode step's layer is a conv update, then the verify of its output. ``bench_decode_step.py`` times whole steps;
this script isolates the conv, so its part of a step's gap is measured directly. Per batch it times a CUDA graph
of at least 16 conv updates over distinct layers' buffers (cold pages: more bytes than L2 between two reads of a
layer), Nemotron-H-8B's conv (10,240 channels, kernel 4), bf16 window and activations, K = 3 drafts, every row
verifying T = 4 tokens, rollback cursors from the acceptance draw of ``bench_verify.py``:

* ``ours``: :func:`ssmstate.ops.triton.conv_update` on the layout's window (pages, conv dim, k - 1 + T), stored
  channel-contiguous, as :class:`~ssmstate.layout.PageLayout` allocates it;
* ``ours_w<n>``: the same with ``n`` warps per program (``override(conv={"num_warps": n})``; the table's pick is
  ``ours``);
* ``ours_colmajor``: the same kernel on a window stored with its columns contiguous (any strides are served; this
  shows what the storage order is worth);
* ``vllm``: vLLM's kernel on its own conv state, (blocks, K + k - 1, conv dim) stored and passed transposed, with
  ``num_accepted_tokens`` from the same draw.

Reported: µs per layer and vLLM ÷ ours (above 1: ours faster). Run (repo root, a GPU, vLLM's kernel importable or
``SSMSTATE_VLLM_KERNELS`` set to its sources): ``python benchmarks/bench_conv.py --json conv.json``.
``--cpu-smoke`` runs ours end to end on CPU under the Triton interpreter at a toy size (timings meaningless).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_verify as bv  # noqa: E402  (the acceptance draw, the CUDA-graph timer)
from bench_decode_step import load_vllm_conv  # noqa: E402
from ssmstate.layout import conv_spec  # noqa: E402

KCONV, K = 4, 3
T = K + 1
#: conv channels (Nemotron-H-8B's; --cpu-smoke: a toy size); the device and the timer are bench_verify's (bv.DEV,
#: bv.SMOKE)
DC = 10240


def buffers(rows: int, layers: int, order: str, gen: torch.Generator) -> list[dict]:
    """Per layer: a window of ``rows + 1`` pages (page 0: the null page) in ``order`` ("channels": the layout's,
    "columns": columns contiguous, "vllm": vLLM's (blocks, K + k - 1, conv dim) state, transposed)."""
    width = KCONV - 1 + (T if order != "vllm" else K)
    out = []
    for _ in range(layers):
        bf16 = dict(device=bv.DEV, dtype=torch.bfloat16)
        if order == "columns":
            win = torch.randn(rows + 1, DC, width, generator=gen).to(**bf16)
        elif order == "channels":
            win = conv_spec(DC, width, torch.bfloat16).zeros(rows + 1, bv.DEV).copy_(
                torch.randn(rows + 1, DC, width, generator=gen))
        else:
            win = torch.randn(rows + 1, width, DC, generator=gen).transpose(1, 2).to(**bf16)
        out.append({"win": win})
    return out


def bench_batch(rows: int, warps: list[int], vconv, l2: int, reps: int) -> dict:
    from ssmstate.ops import triton as trk

    gen = torch.Generator().manual_seed(rows)
    rng = random.Random(rows)
    per_layer = (rows + 1) * DC * (KCONV - 1 + T) * 2 + 2 * rows * T * DC * 2
    layers = max(16, -(-4 * l2 // per_layer)) if bv.DEV == "cuda" else 2
    xbc = torch.randn(rows * T, DC, generator=gen).to(device=bv.DEV, dtype=torch.bfloat16)
    out = torch.empty_like(xbc)
    weight = (torch.randn(DC, KCONV, generator=gen) * 0.3).to(bv.DEV)
    bias = (torch.randn(DC, generator=gen) * 0.1).to(bv.DEV)
    ids = torch.arange(1, rows + 1, dtype=torch.int32, device=bv.DEV)
    cu = torch.arange(0, rows * T + 1, T, dtype=torch.int32, device=bv.DEV)
    accepted = [bv.draw_accepted(rng, T) for _ in range(rows)]
    shift = torch.tensor([0] + [T - a for a in accepted], dtype=torch.int32, device=bv.DEV)
    num_acc = torch.tensor(accepted, dtype=torch.int32, device=bv.DEV)
    row = {"batch": rows, "layers": layers}

    def ours(bufs, cfg: dict | None = None):
        def call(b):
            def run():
                with trk.override(conv=cfg) if cfg else contextlib.nullcontext():
                    trk.conv_update(b["win"], shift, xbc, weight, bias, ids, cu, out)
            return run
        return [call(b) for b in bufs]

    bufs = buffers(rows, layers, "channels", gen)
    row["ours_us"] = bv.time_calls(ours(bufs), reps)
    for w in warps:
        row[f"ours_w{w}_us"] = bv.time_calls(ours(bufs, {"num_warps": w}), reps)
    del bufs
    bufs = buffers(rows, layers, "columns", gen)
    row["ours_colmajor_us"] = bv.time_calls(ours(bufs), reps)
    del bufs
    if vconv is not None:
        bufs = buffers(rows, layers, "vllm", gen)
        calls = [lambda b=b: vconv(xbc, b["win"], weight, bias, "silu", conv_state_indices=ids,
                                   num_accepted_tokens=num_acc, query_start_loc=cu, max_query_len=T, out=out)
                 for b in bufs]
        row["vllm_us"] = bv.time_calls(calls, reps)
        row["vllm_vs_ours"] = row["vllm_us"] / row["ours_us"]
        del bufs
    if bv.DEV == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="conv.json")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--warps", default="1,2,4", help="also time ours with these warps per program")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="ours only, on CPU under TRITON_INTERPRET=1, 64 channels, batches 1 and 2")
    args = ap.parse_args()
    global DC
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DC, args.batches, args.warps = 64, "1,2", "1"
        bv.DEV, bv.SMOKE = "cpu", True
    elif not torch.cuda.is_available():
        sys.exit("bench_conv.py needs a CUDA GPU (or --cpu-smoke)")
    t0 = time.time()
    if bv.DEV == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, l2 = props.name, getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
        vconv = load_vllm_conv()
    else:
        name, l2, vconv = "cpu (Triton interpreter smoke run)", 0, None
    import triton
    env = {"gpu": name, "l2_bytes": l2, "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "command": " ".join(sys.argv)}
    bv.log(json.dumps(env))
    warps = [int(w) for w in args.warps.split(",") if w]
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        rows.append(bench_batch(b, warps, vconv, l2, args.reps))
        bv.log("  " + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}))
        with open(args.json, "w") as fh:
            json.dump({"env": env, "rows": rows, "seconds": time.time() - t0}, fh, indent=1)
    cols = ["ours", *[f"ours_w{w}" for w in warps], "ours_colmajor", "vllm"]
    bv.log(f"\n{name}: µs per conv update (one layer); x = vLLM ÷ ours")
    bv.log(f"{'batch':>5} | " + " | ".join(f"{c:>13}" for c in cols) + " | x")
    for r in rows:
        cells = [f"{r[c + '_us']:13.2f}" if c + "_us" in r else f"{'-':>13}" for c in cols]
        bv.log(f"{r['batch']:>5} | " + " | ".join(cells) + f" | {r.get('vllm_vs_ours', float('nan')):.2f}")


if __name__ == "__main__":
    main()
