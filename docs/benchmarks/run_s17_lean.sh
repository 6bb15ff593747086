#!/bin/bash
# Session 17, lean run (no carry, ours only; for when the device budget cannot cover FlashInfer's JIT): the GPU
# tests of TILE_LDG, then run_s17_1.sh's sweeps at batch 1 and 8-64 against our default in one process, and at batch
# 1 the PDL layer chain with TILE_LDG and its trace. T=4, W=16.
set -o pipefail; export PYTHONUNBUFFERED=1
source docs/benchmarks/s17_sweeps.sh
timeout 150 python3 benchmarks/bench_layer_chain.py --no-flashinfer --batches 1 --reps 10 \
  --pdl-configs '[{"TILE_LDG":1}, {"TILE_LDG":1,"L2PF":0}]' --out $OUT/chain_b1.json 2>&1 | grep -v '^  {"T"' \
  | tail -8 | tee $OUT/chain_b1.log
timeout 100 python3 benchmarks/trace_verify.py --batches 1 --scenarios nonflush --chain 2 \
  --config '{"EARLY":3}' --config '{"TILE_LDG":1}' --out $OUT/trace_b1_chain2.json 2>&1 | grep -v "^  launch1" \
  | tail -6 | tee $OUT/trace_b1.log
echo "done $SECONDS s"
