#!/bin/bash
# Session 7, device run 3: flush rows of the TMA kernel folded from the shared-memory tile in one product
# (FOLD_N = N: no chunk re-reads), with the pipelined HEADS loop. GPU tests (full log kept), ours-only sweep.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs or heuristic or nemotron" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -12; echo "tests done $SECONDS s"
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","HEADS":16,"HSTAGES":2,"maxnreg":0,"FOLD_N":128},{"KERNEL":"tma","HEADS":8,"HSTAGES":2,"maxnreg":0,"FOLD_N":128},{"KERNEL":"tma","HEADS":4,"HSTAGES":2,"maxnreg":0,"FOLD_N":128},{"KERNEL":"tma","HEADS":16,"HSTAGES":2,"maxnreg":0},{"KERNEL":"tma","FOLD_N":128,"maxnreg":0}]' \
  --configs 4:16 --batches 256,128,64,32,8 --reps 5 --out $OUT/sweep3.json > $OUT/sweep3.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep3.log | grep -v best | cut -c1-170
