"""Launch the Triton verify kernel a few times on the benchmark's pages, for a profiler (ncu) to read.

Same pool, geometry and scenarios as ``bench_verify.py`` (Nemotron-H layer, fp32 state, bf16 inputs).
Run under Nsight Compute on the device, e.g.::

    ncu --clock-control none --kernel-name regex:verify_ --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python3 tools/profile_verify.py --batch 256

``--config`` takes a JSON launch override (keys of :func:`ssmstate.ops.triton.override`); ``--flush`` makes every
row a flush row; ``--state-dtype`` int8 or float8_e4m3fn profiles an 8-bit checkpoint; ``--flashinfer`` launches
FlashInfer's ``checkpointing_ssu`` (its monolith, ``--fi-algorithm``) on the same pages instead (``ncu
--kernel-name regex:checkpointing``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_verify as bv  # noqa: E402
from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402
from ssmstate.ops import triton as trk  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--W", type=int, default=16)
    ap.add_argument("--flush", action="store_true")
    ap.add_argument("--config", default=None)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--state-dtype", default="float32", choices=("float32", "int8", "float8_e4m3fn"))
    ap.add_argument("--flashinfer", action="store_true", help="FlashInfer's checkpointing_ssu instead of ours")
    ap.add_argument("--fi-algorithm", default="monolith", help="its algorithm argument (monolith, two-kernel, auto)")
    a = ap.parse_args()
    geom = Mamba2Geometry(num_heads=bv.H, head_dim=bv.P, state_size=bv.N, n_groups=bv.G, conv_kernel=4,
                          num_layers=1, state_dtype=getattr(torch, a.state_dtype), act_dtype=torch.bfloat16)
    layout = PageLayout.replay(geom, SpecConfig(a.T - 1, window=a.W))
    b, T, W = a.batch, a.T, a.W
    pool = bv.Pool(layout, 1 + a.calls * b, b, seed=0)
    c = min(W, W - T + 2) if a.flush else min(W - T, W // 2)
    pool.nc.fill_(c)
    cu = torch.arange(0, b * T + 1, T, dtype=torch.int32, device="cuda")
    cfg = json.loads(a.config) if a.config else None
    if a.flashinfer:
        run_flashinfer(a, pool, b, T, W)
    else:
        with trk.override(**(cfg or {})):
            run(a, pool, cu, b, T, W)
    torch.cuda.synchronize()
    print("ok", b, T, W, "flush" if a.flush else "nonflush", cfg)


def run(a, pool, cu, b: int, T: int, W: int) -> None:
    for j in range(a.calls):  # disjoint pages per call: cold checkpoints, as in the benchmark
        ids = torch.arange(1 + j * b, 1 + (j + 1) * b, dtype=torch.int32, device="cuda")
        trk.replay_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, pool.x[:b * T], pool.dt[:b * T],
                          pool.A, pool.B[:b * T], pool.C[:b * T], ids, cu, W, pool.out[:b * T], D=pool.D,
                          dt_bias=pool.dt_bias, checkpoint_scale=pool.scale)


def run_flashinfer(a, pool, b: int, T: int, W: int) -> None:
    """FlashInfer's call as the benchmarks make it (``bench_verify.fi_caller``), on the same pages."""
    call = bv.fi_caller(pool, b, T, W)
    for j in range(a.calls):
        call(torch.arange(1 + j * b, 1 + (j + 1) * b, dtype=torch.int32, device="cuda"), a.fi_algorithm)()


if __name__ == "__main__":
    main()
