#!/bin/bash
# Session 14, run 6: T=8, W=16 against FlashInfer 0.7.2.post1 at batch 1, 32 and 256 on the current default (KSPLIT in
# the streamed launches applies at T=8, W=16: R=24, a 32-row tile, 16 for non-flush rows), FlashInfer JIT-compiled
# for T=8 first. Carries .whl (FlashInfer and apache-tvm-ffi wheels).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
timeout 380 python3 benchmarks/bench_verify.py --fi-configs 8:16 --configs 8:16 --batches 1 --reps 1 --out /tmp/warm8.json \
  > $OUT/warm_T8.log 2>&1; echo "jit T=8 rc=$? at $SECONDS s"; tail -1 $OUT/warm_T8.log | cut -c1-200
timeout $((585 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify_t8.json --fi-configs 8:16 --configs 8:16 \
  --batches 1,32,256 --reps 10 2>&1 | tee $OUT/verify_t8.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -9
echo "main done $SECONDS s"
