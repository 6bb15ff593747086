#!/bin/bash
# Session 15, run 2: the checkpoint tile's TMA copy before the wait (PDL_TILE 2, the default with EARLY 3) against
# PDL_TILE 0 / 1, in the layer chain against FlashInfer with and without enable_pdl. FlashInfer's two JIT builds run
# side by side (s15_fi_warm.py, one process each) while the GPU tests of the PDL launches run. Carries .whl.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export CUDA_HOME=$(dirname $(dirname $(readlink -f $(which nvcc)))); export FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 docs/benchmarks/s15_fi_warm.py 0 > $OUT/warm0.log 2>&1 &
python3 docs/benchmarks/s15_fi_warm.py 1 > $OUT/warm1.log 2>&1 &
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "pdl or cuda_graph or conv_gpu" 2>&1 | tail -4 \
  | tee $OUT/gpu_tests_pdl.txt; echo "tests done $SECONDS s"
wait; echo "warm done $SECONDS s"; tail -n 1 $OUT/warm0.log $OUT/warm1.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_layer_chain.py --out $OUT/chain.json --reps 10 \
  --pdl-configs '[{"PDL_TILE": 0}, {"PDL_TILE": 1}]' 2>&1 | tee $OUT/chain.log | grep -v '^  {"T"' | tail -24
echo "main done $SECONDS s"
