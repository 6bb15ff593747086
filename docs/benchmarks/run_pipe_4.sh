#!/bin/bash
# Session 7, device run 4: the build with the pipelined-heads launch as the heuristic's choice at batch >= 32
# (HEADS=16, HSTAGES=2, FOLD_N=N, uncapped), against FlashInfer. FlashInfer's JIT builds in the background while
# the whole Triton GPU test file and an ours-only sweep (new default vs the previous default) run; then the benchmark.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py > $OUT/gpu_tests_triton.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests_triton.txt | head -8; echo "tests done $SECONDS s"
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","HEADS":1,"HSTAGES":1,"FOLD_N":32,"maxnreg":96},{"KERNEL":"tma","HEADS":8,"HSTAGES":2,"FOLD_N":128,"maxnreg":0}]' \
  --configs 4:16 --batches 256,128,64,32,16,8 --reps 5 --out $OUT/sweep4.json > $OUT/sweep4.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep4.log | grep -v best | cut -c1-150
wait $P1; echo "jit done $SECONDS s"; tail -2 $OUT/warm_bench.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
