#!/bin/bash
# Session 19, run 1 (carries .whl): first GPU check of session 18's bandwidth-per-SM heuristic (what the driver
# reports, the launch verify_config picks at batch 64 / 128 / 256, the GPU tests of the routes and the CUDA-graph
# step) while FlashInfer's two JIT builds run; then the whole table against FlashInfer 0.7.2.post1 (T=4, W=16) and
# the layer chain, in one process each. At most 8 files under $OUT (the device's limit).
source docs/benchmarks/fi_env.sh
python3 docs/benchmarks/s19_heuristic.py > $OUT/info.txt 2>&1   # (run 1 ran the same lines inline)
cat $OUT/info.txt
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "heuristic_routes or cuda_graph_decode_step or verify_nemotron" \
  2>&1 | tail -4 | tee $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
wait; echo "warm done $SECONDS s"; tail -n 1 $OUT/warm0.log $OUT/warm1.log
timeout $((590 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14
echo "verify done $SECONDS s"
timeout $((595 - SECONDS)) python3 benchmarks/bench_layer_chain.py --out $OUT/chain.json --reps 10 2>&1 \
  | grep -v '^  {"T"' | tail -22
echo "chain done $SECONDS s"
