#!/bin/bash
# Session 16, run 2: flush rows. TMA_STORE (the new checkpoint by one TMA bulk store) and whole-tile or wider-chunk
# folds (FOLD_N 64 / 128, raised register caps) against the default, standalone, every route, W=16 and W=32,
# batch 1-256, ours only; GPU tests of the TMA_STORE launches first. No FlashInfer this run.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "TMA_STORE" 2>&1 | tail -6 | tee $OUT/gpu_tests.txt
echo "tests done $SECONDS s"
S='[{"TMA_STORE": 1}, {"FOLD_N": 64}, {"FOLD_N": 64, "maxnreg": 128}, {"FOLD_N": 128}, {"FOLD_N": 128, "TMA_STORE": 1}, {"FOLD_N": 128, "maxnreg": 168, "TMA_STORE": 1}]'
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --configs 4:16,4:32 --reps 10 \
  --sweep-configs "$S" --out $OUT/verify_flush_sweep.json 2>&1 | grep -v '^  {"T"' | tail -80 | tee $OUT/verify.log
echo "main done $SECONDS s"
