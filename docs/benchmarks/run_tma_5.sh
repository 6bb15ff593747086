#!/bin/bash
# Session 5, device run 5 (warm machine, FlashInfer's JIT cache from run 4): ring-order TMA kernel with the 16-bit
# Gram product; GPU tests at Nemotron-H geometry, variant sweep, then the benchmark against FlashInfer.
set -o pipefail; export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "nemotron or heuristic or dtypes or graph" 2>&1 | tail -3
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"KERNEL":"tma","RING":true},{"KERNEL":"tma","RING":false}]' \
  --configs 4:16 --batches 256,64 --reps 5 --out $OUT/sweep5.json > $OUT/sweep5.log 2>&1; echo "sweep rc=$?"
grep -E "^  sweep b=" $OUT/sweep5.log | grep -v best | cut -c1-100
timeout 200 python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=' | tail -12
