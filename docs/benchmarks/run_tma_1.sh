#!/bin/bash
# Session 5, device run 1: the TMA verify kernel on the H200. FlashInfer's JIT builds (the benchmark's dtypes) in the
# background while the Triton GPU tests and a TMA-vs-LDG launch sweep run; then the benchmark against FlashInfer.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py 2>&1 | tail -25 > $OUT/gpu_tests_triton.txt
tail -12 $OUT/gpu_tests_triton.txt
python3 benchmarks/bench_verify.py --no-flashinfer --sweep --configs 4:16,8:32 --batches 256,64,8,1 --reps 5 \
  --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -A7 "^sweep T=" $OUT/sweep.log | grep -v "^--"
wait $P1; echo "jit done $SECONDS s"; tail -2 $OUT/warm_bench.log
timeout $((585 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=' | tail -22
