#!/bin/bash
# Session 15, run 1: programmatic dependent launch (TritonBackend(pdl=True), replay_verify/conv_update pdl=True).
# The GPU tests of the PDL launches, then the layer-chain benchmark (conv + verify per layer, with and without PDL,
# against FlashInfer 0.7.2.post1 behind the same conv with and without enable_pdl). Carries .whl (FlashInfer and
# apache-tvm-ffi wheels); FlashInfer JIT-compiles checkpointing_ssu for T=4 with and without PDL on the first calls.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "pdl or cuda_graph or conv_gpu" 2>&1 | tail -4 \
  | tee $OUT/gpu_tests_pdl.txt; echo "tests done $SECONDS s"
python3 benchmarks/bench_layer_chain.py --batches 1 --reps 1 --out /tmp/warm.json > $OUT/warm.log 2>&1
echo "warm (JIT) done $SECONDS s"; grep -i "error\|failed" $OUT/warm.log | head -5
timeout $((590 - SECONDS)) python3 benchmarks/bench_layer_chain.py --out $OUT/chain.json --reps 10 2>&1 \
  | tee $OUT/chain.log | grep -v '^  {"T"' | tail -24
echo "main done $SECONDS s"
