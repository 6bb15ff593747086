"""JIT-compile FlashInfer's checkpointing_ssu for the layer-chain benchmark (T=4, W=16, Nemotron-H, bf16 inputs,
fp32 state) with ``enable_pdl`` as given, one process per setting so the two builds run side by side."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
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
