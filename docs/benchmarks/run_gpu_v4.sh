#!/bin/bash
# Final GPU run (session 3): FlashInfer JIT in the background, Triton GPU tests and our other (T, W) while it builds,
# then the T=4 W=16 benchmark against FlashInfer (best of auto / monolith / autotuned) and the native scheme.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(SSMSTATE_WARM=replay python3 tests/gpu/test_flashinfer_gpu.py > $OUT/warm_replay.log 2>&1) & P1=$!
(SSMSTATE_WARM=native python3 tests/gpu/test_flashinfer_gpu.py > $OUT/warm_native.log 2>&1) & P2=$!
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py 2>&1 | tail -8 > $OUT/gpu_tests_triton.txt
tail -3 $OUT/gpu_tests_triton.txt
timeout 200 python3 benchmarks/bench_verify.py --no-flashinfer --configs 2:16,8:16,4:32,8:32 --batches 1,8,64,256 --reps 10 \
  --out $OUT/verify_other.json > $OUT/verify_other.log 2>&1; echo "other rc=$?"
wait $P1 $P2; echo "jit done $SECONDS s"
timeout $((570 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=' | tail -32
