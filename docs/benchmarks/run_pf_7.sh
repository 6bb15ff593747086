#!/bin/bash
# Session 8, device run 7: the final build (register gathers, PFHEADS=1 in the batch-256 launch) against FlashInfer.
# FlashInfer's JIT builds in the background while the whole Triton GPU test file runs; then the benchmark (T=4, W=16,
# heuristic launches), then batch 256 again with the 168-register 8-head launch swept beside the default and FlashInfer.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py > $OUT/gpu_tests_triton.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests_triton.txt | head -8; echo "tests done $SECONDS s"
wait $P1; echo "jit done $SECONDS s"; tail -2 $OUT/warm_bench.log
timeout $((585 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "main done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify_b256_capped.json --fi-configs 4:16 \
  --configs 4:16 --batches 256 --reps 5 --sweep-configs \
  '[{"KERNEL":"tma","HEADS":8,"HSTAGES":1,"maxnreg":168,"PFHEADS":1,"FOLD_N":128},{"KERNEL":"tma","HEADS":8,"HSTAGES":1,"maxnreg":168,"PFHEADS":1,"FOLD_N":32}]' \
  > $OUT/verify_b256_capped.log 2>&1; echo "capped rc=$? at $SECONDS s"; grep -E "^  sweep b=|FlashInfer|fi_best" $OUT/verify_b256_capped.log | cut -c1-220 | tail -8
