#!/bin/bash
# Session 7, device run 6 (ours and the native scheme, no FlashInfer: its JIT does not fit the device time left): the
# final heuristic (pipelined heads at batch 256 only) in the benchmark's main table, T=4, W=16.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 benchmarks/bench_verify.py --no-flashinfer --configs 4:16 --reps 10 --out $OUT/verify.json > $OUT/verify.log 2>&1
echo "rc=$? at $SECONDS s"; grep -v '^  {"T"' $OUT/verify.log | tail -12
