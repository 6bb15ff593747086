#!/bin/bash
# NEVER RUN: superseded in session 9 by run_stream_1.sh ... run_stream_4.sh (docs/performance_log.md section 11).
# Branch session8-route-split, prepared in session 8 (not run yet): the route-split launch (config SPLIT=1: non-flush
# rows in one launch under a register cap, flush rows in a persistent uncapped launch that ranks them on the device).
# GPU tests of the split configs, then ours-only sweeps (T=4, W=16) against the default; then FlashInfer at batch 256
# in the same process as the best split config (its JIT builds in the background meanwhile).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 benchmarks/bench_verify.py --fi-configs 4:16 --configs 4:16 --batches 1 --reps 1 --out /tmp/warm.json \
  > $OUT/warm_bench.log 2>&1) & P1=$!
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "SPLIT or heuristic or nemotron or graph" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma"'; S="$T,\"SPLIT\":1,\"PFHEADS\":1"
A="[{$S,\"HEADS\":8,\"HSTAGES\":1,\"maxnreg\":168},{$S,\"HEADS\":8,\"HSTAGES\":1,\"maxnreg\":168,\"SPLIT_HEADS\":16},
{$S,\"HEADS\":8,\"HSTAGES\":1,\"maxnreg\":128},{$S,\"HEADS\":16,\"HSTAGES\":2,\"maxnreg\":0},
{$T,\"SPLIT\":1,\"HEADS\":1,\"HSTAGES\":1,\"maxnreg\":96,\"SPLIT_HEADS\":4}]"
for b in 256 64 128 32; do
  timeout $((330 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-200
done
wait $P1; echo "jit done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify_split_b256.json --fi-configs 4:16 \
  --configs 4:16 --batches 256 --reps 5 --sweep-configs "[{$S,\"HEADS\":8,\"HSTAGES\":1,\"maxnreg\":168}]" \
  > $OUT/verify_split_b256.log 2>&1; echo "fi rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/verify_split_b256.log | cut -c1-200
