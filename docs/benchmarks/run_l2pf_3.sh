#!/bin/bash
# Session 6, device run 3: the final build (TMA kernel; batch 1 uncapped with L2 prefetches, L2PF=2) against FlashInfer.
# FlashInfer's JIT builds in the background while the whole Triton GPU test file runs; then the benchmark.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py 2>&1 | tail -25 > $OUT/gpu_tests_triton.txt
tail -4 $OUT/gpu_tests_triton.txt
wait $P1; echo "jit done $SECONDS s"; tail -2 $OUT/warm_bench.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
