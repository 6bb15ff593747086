"""Session 14: which launch keys make test_verify_sweep_configs' T=8, W=32 case fault (misaligned address).

python3 docs/benchmarks/s14_fault_probe.py T W ROWS 'CONFIG_JSON'   (one case per process: a fault poisons the context)
"""
import json
import sys

import torch

sys.path.insert(0, ".")
from ssmstate.kernels import reference as ref  # noqa: E402
from ssmstate.kernels import triton_replay as trk  # noqa: E402
from tests.test_triton_common import compare_verify, make_case, run_verify  # noqa: E402

T, W, rows, cfg = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
gen = torch.Generator().manual_seed(T * 10 + W)
case = make_case(gen, "cuda", pages=rows + 3, W=W, T=T, rows=rows, n_pad=3, route="mixed", act_dtype=torch.bfloat16,
                 H=128, G=8, P=64, N=128)
try:
    got = run_verify(trk.replay_verify, case, config=cfg)
    torch.cuda.synchronize()
    errs = compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=1e-2, state_tol=1e-5)
    print(f"OK   T={T} W={W} rows={rows} {cfg} {errs}")
except Exception as e:  # noqa: BLE001
    print(f"FAIL T={T} W={W} rows={rows} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
