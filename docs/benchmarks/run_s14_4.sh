#!/bin/bash
# Session 14, run 4 (session 13 run 4, not run then): the new default against FlashInfer 0.7.2.post1 in one process (T=4, W=16), FlashInfer's
# checkpointing_ssu JIT-compiled for T=4 first. Carries .whl (FlashInfer and apache-tvm-ffi wheels).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm4.json \
  > $OUT/warm_T4.log 2>&1; echo "jit T=4 done $SECONDS s"; tail -1 $OUT/warm_T4.log | cut -c1-200
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "main done $SECONDS s"
