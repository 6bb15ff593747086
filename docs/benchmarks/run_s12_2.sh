#!/bin/bash
# Session 12, run 2 (ours only, T=4, W=16; row cursors on, the new default): launch sweeps against the heuristic in
# the same process. Batch 1: L2PF 0 / 1 (row cursors leave the L2 prefetches little time ahead of the gathers).
# Batch 8-128: the non-flush one-head launch with flush rows split into a persistent launch (SPLIT 1, PDL 1;
# SPLIT_HEADS 8 / 4), the route-split streamed launches (STREAM 2 as at 64-256; STREAM 1), the one-head launch.
set -o pipefail; export PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"L2PF":0},{"L2PF":1}]' \
  --configs 4:16 --batches 1 --reps 10 --out $OUT/sweep_b1.json > $OUT/sweep_b1.log 2>&1; echo "b1 rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep_b1.log | grep -v best | cut -c1-240
C='[{"KERNEL":"tma","SPLIT":1,"PDL":1,"maxnreg":96,"EARLY":3},
{"KERNEL":"tma","SPLIT":1,"PDL":1,"maxnreg":96,"EARLY":3,"SPLIT_HEADS":4},
{"KERNEL":"tma","SPLIT":1,"STREAM":2,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1},
{"KERNEL":"tma","SPLIT":1,"STREAM":1,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1},
{"KERNEL":"tma","maxnreg":96,"EARLY":3}]'
timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$C" \
  --configs 4:16 --batches 8,32,64,128 --reps 10 --out $OUT/sweep_mid.json > $OUT/sweep_mid.log 2>&1
echo "mid rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/sweep_mid.log | grep -v best | cut -c1-260
