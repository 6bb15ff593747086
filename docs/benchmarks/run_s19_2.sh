#!/bin/bash
# Session 19, run 2 (carries .whl): run 1 again, but only on an H200 (it exits at once on any other card, run 1
# having come on an H100): the driver's bandwidth and the launches verify_config picks there, the GPU tests of the
# routes and the CUDA-graph step while FlashInfer's JIT builds run, then the whole table against FlashInfer
# 0.7.2.post1 (T=4, W=16) and, in the time left, the layer chain.
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) ;; *) nvidia-smi -L; exit 3;; esac
source docs/benchmarks/fi_env.sh
python3 docs/benchmarks/s19_heuristic.py > $OUT/info.txt 2>&1; cat $OUT/info.txt
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "heuristic_routes or cuda_graph_decode_step" \
  2>&1 | tail -4 | tee $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
wait; echo "warm done $SECONDS s"; tail -n 1 $OUT/warm0.log $OUT/warm1.log
timeout $((550 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --reps 10 2>&1 | grep -v '^  {"T"\|^  sweep b=\|autotuner\|AutoTuner' | tail -14 | tee $OUT/verify.txt
echo "verify done $SECONDS s"
timeout $((560 - SECONDS)) python3 benchmarks/bench_layer_chain.py --out $OUT/chain.json --reps 10 2>&1 \
  | grep -v '^  {"T"' | tail -22
echo "chain done $SECONDS s"
