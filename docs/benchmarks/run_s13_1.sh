#!/bin/bash
# Session 13, run 1 (ours only, T=4, W=16): PAIR=1, two heads of one group per program with both checkpoint tiles in
# one TMA copy (3 programs per SM under a 168-register cap, 6 tiles in flight per SM against the one-head
# launch's 5). GPU tests of the new launch, then a sweep against the default in the same process at batch 8-128.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "pair or PAIR or heuristic_routes" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8
echo "tests done $SECONDS s"
timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --batches 8,32,64,128 \
  --sweep-configs '[{"PAIR":1,"maxnreg":168},{"PAIR":1}]' --configs 4:16 --reps 10 --out $OUT/sweep.json \
  > $OUT/sweep.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep.log | grep -v best | cut -c1-240
