#!/bin/bash
# Session 13, run 2 (ours only, T=4): KSPLIT=1, non-flush rows on a sequence tile of pow2(W) rows instead of
# pow2(R) (W=16: 16 rows, not 32; W=32: 32, not 64, which opens W=32 to the TMA kernel). GPU tests of the new
# builds, then sweeps against the default in the same process: W=16 at every batch, W=32 at 8-256 against the
# default there (the LDG kernel).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "KSPLIT or ksplit or heuristic_routes" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8
echo "tests done $SECONDS s"
timeout $((300 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer \
  --sweep-configs '[{"KSPLIT":1}]' --configs 4:16 --reps 10 --out $OUT/sweep16.json \
  > $OUT/sweep16.log 2>&1; echo "sweep W=16 rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep16.log | grep -v best | cut -c1-320
timeout $((580 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --batches 8,32,64,256 \
  --sweep-configs '[{"KERNEL":"tma","KSPLIT":1,"EARLY":3,"maxnreg":128},
  {"KERNEL":"tma","KSPLIT":1,"SPLIT":1,"EARLY":3,"maxnreg":96,"PDL":1},
  {"KERNEL":"tma","KSPLIT":1,"SPLIT":1,"STREAM":2,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1}]' \
  --configs 4:32 --reps 10 --out $OUT/sweep32.json > $OUT/sweep32.log 2>&1; echo "sweep W=32 rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep32.log | grep -v best | cut -c1-320
