#!/bin/bash
# Session 12, run 4: the new default (row cursors; the one-head launch up to batch 98) against FlashInfer 0.7.2.post1 in
# one process. FlashInfer JIT-compiles checkpointing_ssu once per T: T=4 first, T=2 and T=8 niced beside it while
# the whole Triton GPU test file runs. Then the main benchmark (T=4, W=16, every batch), then T=2 and T=8 (W=16)
# at batch 1 and 32.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm4.json \
  > $OUT/warm_T4.log 2>&1) & P4=$!
for t in 2 8; do
  (nice -n 19 python3 benchmarks/bench_verify.py --fi-configs $t:16 --configs $t:16 --batches 1 --reps 1 \
    --out /tmp/warm$t.json > $OUT/warm_T$t.log 2>&1) &
done
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py > $OUT/gpu_tests_triton.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests_triton.txt | head -8; echo "tests done $SECONDS s"
wait $P4; echo "jit T=4 done $SECONDS s"; tail -1 $OUT/warm_T4.log | cut -c1-200
timeout $((520 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "main done $SECONDS s"
wait; echo "jit T=2,8 done $SECONDS s"
timeout $((593 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify_t28.json --fi-configs 2:16,8:16 \
  --configs 2:16,8:16 --batches 1,32 --reps 5 > $OUT/verify_t28.log 2>&1; echo "t28 rc=$? at $SECONDS s"
grep -A8 "^ T " $OUT/verify_t28.log | cut -c1-200
