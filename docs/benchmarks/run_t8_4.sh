#!/bin/bash
# Session 10, run 4: T=8, W=16 at batch 256 against FlashInfer 0.7.2.post1 (run 3's T=2/T=8 step ran out of time
# there after batch 32), the same build as run 3. FlashInfer JIT-compiles checkpointing_ssu for T=8 first (minutes).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
timeout $((520 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify_t8.json --fi-configs 8:16 \
  --configs 8:16 --batches 256 --reps 5 > $OUT/verify_t8.log 2>&1; echo "t8 rc=$? at $SECONDS s"
grep -A4 "^ T " $OUT/verify_t8.log | cut -c1-200
