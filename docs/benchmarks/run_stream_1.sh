#!/bin/bash
# Session 9, run 1 (ours only, no FlashInfer): the route-split launch (SPLIT=1) and the streamed persistent launch
# (STREAM: PROGS programs per SM, each taking an equal contiguous share of the non-flush rows' heads; 2 = the flush
# launch streams too). GPU tests of the new configs, then sweeps at batch 64, 256, 128, 32 (T=4, W=16).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "SPLIT or STREAM or stream or heuristic or graph" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma","SPLIT":1,"PFHEADS":1'
A="[{$T,\"HEADS\":8,\"HSTAGES\":1,\"maxnreg\":168},{$T,\"STREAM\":1,\"maxnreg\":168},
{$T,\"STREAM\":1,\"maxnreg\":168,\"L2PF\":1},{$T,\"STREAM\":2,\"maxnreg\":168},
{$T,\"STREAM\":1,\"maxnreg\":128,\"PROGS\":4},{$T,\"STREAM\":1,\"maxnreg\":0,\"PROGS\":2}]"
for b in 64 256 128 32; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-230
done
