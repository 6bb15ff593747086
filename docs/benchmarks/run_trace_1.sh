#!/bin/bash
# Session 10, run 1 (ours only, T=4, W=16; branch session10-tma-store-port, commit 8645163, not main): where a verify call's time goes (benchmarks/trace_verify.py: per-program
# %globaltimer / %clock64 stamps) at batch 1, 32 and 256, the heuristic launch and, at 32, the streamed split launch;
# then config TMA_STORE=1 (the whole-tile fold written back by one TMA store) against the default launches.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "trace or TMA_STORE" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
S='{"KERNEL":"tma","PFHEADS":1,"SPLIT":1,"STREAM":2,"maxnreg":168,"PDL":1,"PROGS":3}'
python3 benchmarks/trace_verify.py --batches 1 --scenarios nonflush,empty --out $OUT/trace_b1.json 2>&1 | tail -8
python3 benchmarks/trace_verify.py --batches 32 --scenarios nonflush,mixed,empty --config null --config "$S" \
  --out $OUT/trace_b32.json 2>&1 | tail -20
python3 benchmarks/trace_verify.py --batches 256 --scenarios nonflush,flush,mixed,empty --out $OUT/trace_b256.json \
  2>&1 | tail -16
echo "traces done $SECONDS s"
Q='"KERNEL":"tma","HEADS":16,"HSTAGES":2,"maxnreg":0,"FOLD_N":128,"PFHEADS":1'
A="[{\"KERNEL\":\"tma\",\"PFHEADS\":1,\"SPLIT\":1,\"STREAM\":2,\"maxnreg\":168,\"PDL\":1,\"PROGS\":3,\"TMA_STORE\":1},{$Q,\"TMA_STORE\":1}]"
for b in 256 64; do
  timeout $((560 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 5 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | sed -e "s/'KERNEL': 'tma', 'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" | cut -c1-220
done
