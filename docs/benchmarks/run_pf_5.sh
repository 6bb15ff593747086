#!/bin/bash
# Session 8, device run 5 (ours only): the next head's gathers loaded into registers at the top of the pipelined loop
# (no longer cp.async at its end); GPU tests of the TMA configs, then sweeps at T=4, W=16 with the tile one or two heads
# ahead in L2 (PFHEADS), with 2 tile stages (2 programs per SM) or 1 stage under a 168-register cap (3 per SM).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs and tma or heuristic or nemotron" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
T='"KERNEL":"tma"'; P16="$T,\"HEADS\":16,\"FOLD_N\":128"; H8="$T,\"HEADS\":8,\"FOLD_N\":128"
OLD="{$T,\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96}"
A="[$OLD,{$P16,\"HSTAGES\":2,\"maxnreg\":0},{$P16,\"HSTAGES\":2,\"maxnreg\":0,\"PFHEADS\":1},
{$P16,\"HSTAGES\":2,\"maxnreg\":0,\"PFHEADS\":2},{$P16,\"HSTAGES\":2,\"maxnreg\":168,\"PFHEADS\":1},
{$P16,\"HSTAGES\":1,\"maxnreg\":168,\"PFHEADS\":1},{$P16,\"HSTAGES\":1,\"maxnreg\":168,\"PFHEADS\":2},
{$H8,\"HSTAGES\":1,\"maxnreg\":168,\"PFHEADS\":1},{$H8,\"HSTAGES\":2,\"maxnreg\":0,\"PFHEADS\":1}]"
for b in 256 64 128 32; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-200
done
