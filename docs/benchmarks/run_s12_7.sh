#!/bin/bash
# Session 12, run 7: run 4's main benchmark again (the same default against FlashInfer 0.7.2.post1 in one process),
# a second sample of the ratios; FlashInfer JIT-compiles checkpointing_ssu for T=4 first. No tests.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm4.json \
  > $OUT/warm_T4.log 2>&1; echo "jit T=4 done $SECONDS s"; tail -1 $OUT/warm_T4.log | cut -c1-200
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "main done $SECONDS s"
