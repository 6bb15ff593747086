#!/bin/bash
# Session 9, run 2 (ours only): STREAM without SPLIT (one persistent launch streams both routes, a flush row's heads
# weighted FLUSH_W / 4) against run 1's best split launches; T=4, W=16, batches 64, 256, 128, 32, 8.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "STREAM or stream" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma","PFHEADS":1'
A="[{$T,\"SPLIT\":1,\"STREAM\":1,\"maxnreg\":168},{$T,\"SPLIT\":1,\"STREAM\":2,\"maxnreg\":168},
{$T,\"STREAM\":1,\"maxnreg\":168,\"FOLD_N\":32},{$T,\"STREAM\":1,\"maxnreg\":168,\"FOLD_N\":32,\"FLUSH_W\":14},
{$T,\"STREAM\":1,\"maxnreg\":168,\"FOLD_N\":32,\"FLUSH_W\":7},{$T,\"STREAM\":1,\"maxnreg\":168,\"FOLD_N\":64},
{$T,\"STREAM\":1,\"maxnreg\":0,\"PROGS\":2,\"FOLD_N\":128}]"
for b in 64 256 128 32 8; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | sed -e 's/.KERNEL.: .tma., //' -e "s/'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" | cut -c1-200
done
