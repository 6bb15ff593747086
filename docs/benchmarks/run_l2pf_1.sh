#!/bin/bash
# Session 6, device run 1: the TMA kernel with L2 prefetches (config L2PF: 1 the checkpoint tile, 2 also the x and B
# rings) issued as soon as the page id is known. FlashInfer's JIT builds in the background while the GPU tests of the
# new configs and an ours-only sweep run; then the benchmark against FlashInfer with the default and L2PF=2 launches.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs or heuristic" 2>&1 | tail -8 \
  > $OUT/gpu_tests.txt; tail -5 $OUT/gpu_tests.txt
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","L2PF":1},{"KERNEL":"tma","L2PF":2},{"KERNEL":"tma","L2PF":2,"maxnreg":0},{"KERNEL":"tma","L2PF":2,"BLOCK_P":32,"maxnreg":0}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep1.json > $OUT/sweep1.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep1.log | grep -v best | cut -c1-150
wait $P1; echo "jit done $SECONDS s"; tail -2 $OUT/warm_bench.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --sweep-configs '[{"KERNEL":"tma"},{"KERNEL":"tma","L2PF":2}]' --reps 10 2>&1 | tee $OUT/verify.log \
  | grep -v '^  {"T"\|^  sweep b=' | tail -22
