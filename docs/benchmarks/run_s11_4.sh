#!/bin/bash
# Session 11, run 4 (from commit a6bffa6, branch session11-early4: EARLY=4 measured slower everywhere and was
# dropped from main after this run): the run-3 default against FlashInfer 0.7.2.post1 in one process, with a sweep
# of EARLY=4 (each head's tile copied only after its sequence product, for a tile an L2 prefetch brought in): on the one-head
# launch with the L2 prefetch levels, on the streamed launches, and the one-head launch at 64. FlashInfer's T=4 JIT
# runs beside the GPU tests of the EARLY configs; then bench_verify (T=4, W=16, every batch), which reports ours with
# the fastest non-flush config per point next to FlashInfer and the default (sweep_results) per point.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm4.json \
  > $OUT/warm_T4.log 2>&1) & P4=$!
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "EARLY" > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
wait $P4; echo "jit T=4 done $SECONDS s"; tail -1 $OUT/warm_T4.log | cut -c1-200
timeout $((575 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 --sweep-configs '[{"EARLY":4},{"EARLY":4,"L2PF":1},{"HEADS":1,"maxnreg":96,"EARLY":4,"L2PF":1}]' 2>&1 \
  | tee $OUT/verify.log | grep -v '^  {"T"\|autotuner\|AutoTuner' | cut -c1-230 | tail -40
echo "main done $SECONDS s"
