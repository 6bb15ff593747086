#!/bin/bash
# Session 16, run 1: PREFOLD on the GPU. Its GPU tests (and the other configs' and the PDL graphs'), then PREFOLD
# (uncapped, maxnreg 168, BLOCK_P 32) timed standalone (bench_verify sweep, both routes) and in the PDL layer chain
# against our default, at batch 1-64 (PREFOLD needs the one-head EARLY-3 launch). No FlashInfer this run.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "prefold or verify_configs or cuda_graph" 2>&1 | tail -6 \
  | tee $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
P='[{"PREFOLD": 1}, {"PREFOLD": 1, "maxnreg": 168}, {"PREFOLD": 1, "maxnreg": 168, "BLOCK_P": 32}]'
timeout 200 python3 benchmarks/bench_verify.py --no-flashinfer --batches 1,8,32,64 --configs 4:16,4:32 --reps 10 \
  --sweep-configs "$P" --out $OUT/verify_prefold.json 2>&1 | tail -30 | tee $OUT/verify.log
echo "verify done $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/bench_layer_chain.py --no-flashinfer --batches 1,8,32,64 --reps 10 \
  --out $OUT/chain_prefold.json --pdl-configs "$P" 2>&1 | tee $OUT/chain.log | grep -v '^  {"T"' | tail -20
echo "main done $SECONDS s"
