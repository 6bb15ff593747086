#!/bin/bash
# Session 8, device run 6 (ours only): the register-gather build under a 168-register cap (3 programs per SM) with
# chunked folds (FOLD_N 32/64: fewer spills on flush rows than the whole-tile fold), against the uncapped pipelined
# launch; sweeps at T=4, W=16.
set -o pipefail; export PYTHONUNBUFFERED=1
T='"KERNEL":"tma"'; C="\"HSTAGES\":1,\"maxnreg\":168,\"PFHEADS\":1"
OLD="{$T,\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96}"
A="[$OLD,{$T,\"HEADS\":16,\"HSTAGES\":2,\"maxnreg\":0,\"PFHEADS\":1,\"FOLD_N\":128},{$T,\"HEADS\":16,$C,\"FOLD_N\":32},
{$T,\"HEADS\":16,$C,\"FOLD_N\":64},{$T,\"HEADS\":8,$C,\"FOLD_N\":32},{$T,\"HEADS\":8,$C,\"FOLD_N\":128},
{$T,\"HEADS\":4,$C,\"FOLD_N\":32},{$T,\"HEADS\":8,\"HSTAGES\":2,\"maxnreg\":0,\"PFHEADS\":1,\"FOLD_N\":128}]"
for b in 256 64 128 32; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-200
done
