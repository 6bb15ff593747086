#!/bin/bash
# Session 8, device run 4 (ours only): GPU tests of the L2 prefetches, then sweeps at T=4, W=16 of the pipelined launch
# with the program's x and dt rings prefetched into L2 at its start (L2PF=2 over HEADS heads) and the tile PFHEADS ahead.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "PFHEADS or L2PF" > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma"'; P16="$T,\"HEADS\":16,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0"
OLD="{$T,\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96}"
A="[$OLD,{$T,\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96,\"L2PF\":2},{$P16},{$P16,\"PFHEADS\":1},
{$P16,\"L2PF\":2},{$P16,\"L2PF\":2,\"PFHEADS\":1},{$P16,\"L2PF\":1,\"PFHEADS\":1},
{$T,\"HEADS\":8,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0,\"L2PF\":2,\"PFHEADS\":1}]"
for b in 256 64 128 32; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-200
done
