#!/bin/bash
# Session 7, device run 5 (ours only): GPU tests of the changed configs and the shared-memory ConfigError; the sweep
# with the measured mixed batch (steady-state cursors) for the new default against the previous one and fewer
# heads per program; then T=2 and T=8 (W=16) with the new default against the previous one.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs or shared_memory or heuristic" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
OLD='{"KERNEL":"tma","HEADS":1,"HSTAGES":1,"FOLD_N":32,"maxnreg":96}'
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  "[$OLD,{\"KERNEL\":\"tma\",\"HEADS\":8,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0},{\"KERNEL\":\"tma\",\"HEADS\":4,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0}]" \
  --configs 4:16 --batches 256,128,64,32,16 --reps 5 --out $OUT/sweep5.json > $OUT/sweep5.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep5.log | grep -v best | cut -c1-190
timeout $((380 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "[$OLD]" --configs 2:16,8:16 \
  --reps 5 --out $OUT/other.json > $OUT/other.log 2>&1; echo "other rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/other.log | grep -v best | cut -c1-190
