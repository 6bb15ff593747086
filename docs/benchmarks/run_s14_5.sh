#!/bin/bash
# Session 14, run 5: the mixed batch (steady-state cursors, ~18 % flush rows) at batch 32 and 64, T=4, W=16, where the
# one-launch default measured 0.80x / 0.84x FlashInfer's mixed batch (run 4): split and streamed launch shapes.
export PYTHONUNBUFFERED=1
timeout 560 python3 benchmarks/bench_verify.py --no-flashinfer --batches 32,64 --configs 4:16 --reps 10 --sweep-configs '[
 {"KERNEL":"tma","SPLIT":1,"EARLY":3,"maxnreg":96,"PDL":1},
 {"KERNEL":"tma","SPLIT":1,"EARLY":3,"maxnreg":96,"PDL":1,"SPLIT_HEADS":1},
 {"KERNEL":"tma","SPLIT":1,"STREAM":2,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1,"KSPLIT":1},
 {"KERNEL":"tma","SPLIT":1,"STREAM":1,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1},
 {"KERNEL":"tma","STREAM":1,"PROGS":3,"maxnreg":168,"PFHEADS":1},
 {"KERNEL":"tma","STREAM":1,"PROGS":5,"maxnreg":96,"PFHEADS":1},
 {"KERNEL":"tma","maxnreg":0,"EARLY":3},
 {"KERNEL":"tma","maxnreg":128,"EARLY":3}]' --out $OUT/mixed_sweep.json > $OUT/mixed_sweep.log 2>&1; echo "rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/mixed_sweep.log | grep -v best | sed 's/.KERNEL.: .tma., //' | cut -c1-260
