"""JIT-compile FlashInfer's ``checkpointing_ssu`` for the benchmarks' specialisation before they run.

The build is for ``benchmarks/bench_verify.py`` and ``benchmarks/bench_layer_chain.py``'s inputs (Nemotron-H
layer, T=4, W=16, bf16 x/B/C/dt/D/dt_bias, fp32 state), with ``enable_pdl`` off (argument ``0``) or on (``1``):
one process per setting, so the two builds run side by side. A build takes four to five minutes of one CPU
core and is cached under ``FLASHINFER_WORKSPACE_BASE``; ``tools/fi_env.sh`` starts both in the background.

Run (repo root, GPU, FlashInfer importable): ``python3 tools/fi_warm.py 0``.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import bench_verify as bv  # noqa: E402
from bench_layer_chain import fi_setup  # noqa: E402
from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402

pdl = sys.argv[1] == "1"
geom = Mamba2Geometry(num_heads=bv.H, head_dim=bv.P, state_size=bv.N, n_groups=bv.G, conv_kernel=4, num_layers=1,
                      state_dtype=torch.float32, act_dtype=torch.bfloat16)
layout = PageLayout.replay(geom, SpecConfig(3, window=16))
pool = bv.Pool(layout, 3, 1, seed=0)
co = torch.randn(4, bv.H * bv.P + 2 * bv.G * bv.N, device="cuda", dtype=torch.bfloat16)
call = fi_setup(__import__("flashinfer"), pool, layout, 1, co, pool.out[:4])
for algo in ("monolith", "auto"):
    call(torch.tensor([1], dtype=torch.int32, device="cuda"), algo, pdl)()
torch.cuda.synchronize()
print(f"flashinfer pdl={pdl} built")
