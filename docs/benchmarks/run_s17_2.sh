#!/bin/bash
# Session 17, run 2: this session's defaults against FlashInfer 0.7.2.post1 in one process: standalone (bench_verify,
# T=4, W=16) and in the layer chain (bench_layer_chain, with and without PDL). FlashInfer's two JIT builds run side by
# side while the GPU tests run. Carries .whl.
source docs/benchmarks/fi_env.sh
python3 -m pytest -q tests/gpu/test_triton_gpu.py \
  -k "cuda_graph or verify_nemotron or heuristic_routes or TILE_LDG or row_cursors or manager_schedule" 2>&1 \
  | tail -4 | tee $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
wait; echo "warm done $SECONDS s"; tail -n 1 $OUT/warm0.log $OUT/warm1.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify.log | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "verify done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_layer_chain.py --out $OUT/chain.json --reps 10 2>&1 \
  | tee $OUT/chain.log | grep -v '^  {"T"' | tail -22
echo "main done $SECONDS s"
