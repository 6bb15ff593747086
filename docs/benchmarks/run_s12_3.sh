#!/bin/bash
# Session 12, run 3 (ours only, T=4, W=16, row cursors on): more launch sweeps against the heuristic in one process.
# Batch 1 and 8: 8 and 2 warps per program. Batch 32 and 64: two or four heads of a group per program, with one
# tile buffer (the next head's tile prefetched into L2) or a 2-stage pipeline, and the one-head launch at 64.
set -o pipefail; export PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"num_warps":8},{"num_warps":2}]' \
  --configs 4:16 --batches 1,8 --reps 10 --out $OUT/sweep_warps.json > $OUT/sweep_warps.log 2>&1
echo "warps rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/sweep_warps.log | grep -v best | cut -c1-240
C='[{"KERNEL":"tma","HEADS":2,"HSTAGES":1,"PFHEADS":1,"maxnreg":96,"EARLY":1},
{"KERNEL":"tma","HEADS":2,"HSTAGES":2,"PFHEADS":1,"EARLY":1},
{"KERNEL":"tma","HEADS":4,"HSTAGES":2,"PFHEADS":1,"EARLY":1},
{"KERNEL":"tma","HEADS":2,"HSTAGES":2,"maxnreg":128,"EARLY":1},
{"KERNEL":"tma","HEADS":1,"maxnreg":96,"EARLY":3}]'
timeout $((400 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$C" \
  --configs 4:16 --batches 32,64 --reps 10 --out $OUT/sweep_heads.json > $OUT/sweep_heads.log 2>&1
echo "heads rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/sweep_heads.log | grep -v best | cut -c1-260
