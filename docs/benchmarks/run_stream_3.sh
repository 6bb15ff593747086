#!/bin/bash
# Session 9, run 3 (ours only): the split launches with PDL (the flush launch may start as the non-flush launch's
# programs finish, and ends only after it), against run 1-2's split launches; T=4, W=16, batches 64, 256, 128, 32, 8.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "STREAM or stream or PDL or pdl or graph" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma","PFHEADS":1,"SPLIT":1,"maxnreg":168'
A="[{$T,\"STREAM\":1},{$T,\"STREAM\":1,\"PDL\":1},{$T,\"STREAM\":2},{$T,\"STREAM\":2,\"PDL\":1},
{$T,\"HEADS\":8,\"HSTAGES\":1,\"PDL\":1},{$T,\"STREAM\":2,\"PDL\":1,\"SPLIT_HEADS\":16}]"
for b in 64 256 128 32 8; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | sed -e 's/.KERNEL.: .tma., //' -e "s/'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" -e "s/'PFHEADS': 1, 'SPLIT': 1, 'maxnreg': 168, //" | cut -c1-200
done
