#!/bin/bash
# Session 17, run 1 (carries .whl): while FlashInfer's two JIT builds run, ours only: at batch 1 the tile by plain
# loads into registers (TILE_LDG: the Gram and factors overlap its round trip; the readout takes it from registers),
# the tile's copy after the Gram (EARLY 2) and the route split; at batch 8-64 route-split one-head launches (the
# non-flush build without the flush route's code: 1,056 instructions, 80-86 registers, no spills, against 1,864 / 96
# / 4 spill loads) and two heads per program with the second tile prefetched into L2. Then whatever beat the default
# by >= 2 % non-flush against FlashInfer in one process (batch 1, 32, 64), and at batch 1 the layer chain with
# TILE_LDG (PDL) and its trace. T=4, W=16.
source docs/benchmarks/fi_env.sh
source docs/benchmarks/s17_sweeps.sh
WIN=$(python3 docs/benchmarks/s17_winners.py $OUT/sweep_b1.json $OUT/sweep_b8_64.json --min 2); echo "winners: $WIN"
wait; echo "warm done $SECONDS s"; tail -n 1 $OUT/warm0.log $OUT/warm1.log
timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --out $OUT/verify.json --fi-configs 4:16 --configs 4:16 \
  --batches 1,32,64 --reps 10 --sweep-configs "$WIN" 2>&1 | tee $OUT/verify.log \
  | grep -v '^  {"T"\|autotuner\|AutoTuner' | tail -16
echo "verify done $SECONDS s"
timeout $((580 - SECONDS)) python3 benchmarks/bench_layer_chain.py --batches 1 --reps 10 \
  --pdl-configs '[{"TILE_LDG":1}, {"TILE_LDG":1,"L2PF":0}]' --out $OUT/chain_b1.json 2>&1 | grep -v '^  {"T"' \
  | tail -8 | tee $OUT/chain_b1.log
echo "chain done $SECONDS s"
timeout $((595 - SECONDS)) python3 benchmarks/trace_verify.py --batches 1 --scenarios nonflush --chain 2 \
  --config '{"EARLY":3}' --config '{"TILE_LDG":1}' --out $OUT/trace_b1_chain2.json 2>&1 | grep -v "^  launch1" \
  | tail -6 | tee $OUT/trace_b1.log
echo "done $SECONDS s"
