#!/bin/bash
# Session 5, device run 4 (final): FlashInfer's JIT builds in the background; meanwhile the Triton GPU tests, a sweep of
# the TMA kernel's variants (ring-order vs sequence-order gathers) against the LDG kernel, and our other (T, W); then
# the T=4 W=16 benchmark against FlashInfer (best of auto / monolith / autotuned) and the native scheme.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py 2>&1 | tail -25 > $OUT/gpu_tests_triton.txt
tail -4 $OUT/gpu_tests_triton.txt
python3 benchmarks/bench_verify.py --no-flashinfer --sweep --configs 4:16 --batches 256,64,8,1 --reps 5 \
  --out $OUT/sweep4.json > $OUT/sweep4.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep4.log | grep -v best | cut -c1-120
timeout 150 python3 benchmarks/bench_verify.py --no-flashinfer --configs 2:16,8:16,4:32,8:32 --batches 1,8,64,256 \
  --reps 10 --out $OUT/verify_other.json > $OUT/verify_other.log 2>&1; echo "other rc=$? at $SECONDS s"
wait $P1; echo "jit done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=' | tail -14
