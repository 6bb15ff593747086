#!/bin/bash
# Session 8, device run 1 (ours only): GPU tests of the in-loop L2 prefetch (PFHEADS), then sweeps at T=4, W=16 of
# the pipelined launch with the checkpoint tile PFHEADS heads ahead prefetched into L2, against the current launches.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "PFHEADS" > $OUT/gpu_tests.txt 2>&1
grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma"'; P16="$T,\"HEADS\":16,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0"
OLD="{$T,\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96}"
A="[$OLD,{$P16},{$P16,\"PFHEADS\":1},{$P16,\"PFHEADS\":2},{$P16,\"PFHEADS\":4},
{$T,\"HEADS\":16,\"HSTAGES\":1,\"FOLD_N\":128,\"maxnreg\":0,\"PFHEADS\":2},
{$T,\"BLOCK_P\":32,\"HEADS\":16,\"HSTAGES\":3,\"FOLD_N\":128,\"maxnreg\":0,\"PFHEADS\":2},
{$T,\"HEADS\":8,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0,\"PFHEADS\":2},{$T,\"HEADS\":4,\"HSTAGES\":2,\"FOLD_N\":128,\"maxnreg\":0,\"PFHEADS\":2}]"
for b in 256 64 128 32; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-200
done
