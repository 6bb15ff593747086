#!/bin/bash
# Session 14, run 3: the GPU test suite after the long-ring register floor (replay_verify refuses maxnreg < 128 where
# the capped launch holds a sequence tile over 32 rows), then at W=32 batch 1 and 8 the default against the LDG
# kernel (the old W=32 default) and the mid-batch launch, in the same process.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/ > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --batches 1,8 --configs 4:32 --reps 10 \
  --sweep-configs '[{"KERNEL":"ldg"},{"KERNEL":"tma","KSPLIT":1,"EARLY":3,"maxnreg":128}]' --out $OUT/sweep_w32_b1.json \
  > $OUT/sweep_w32_b1.log 2>&1; echo "b1 sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep_w32_b1.log | grep -v best | cut -c1-320
