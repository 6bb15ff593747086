#!/bin/bash
# Session 10, run 2 (ours only, T=4, W=16; branch session10-pfnext, commit d1470c1, not main): the streamed launches' cheaper row search (unit-cost routes: one rank
# lookup per segment) is now the default; config PFNEXT=1 (at a segment's end, L2 prefetches of the next segment's
# first tile and rings) against it; timings now cycle the page sets to >= 16 calls per graph. Then traces of both.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "stream or pdl or trace or heuristic" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
S='"KERNEL":"tma","PFHEADS":1,"SPLIT":1,"STREAM":2,"maxnreg":168,"PDL":1,"PROGS":3'
for b in 256 128 64 32; do
  A="[{$S,\"PFNEXT\":1}]"; [ $b = 32 ] && A="[{$S},{$S,\"PFNEXT\":1}]"
  timeout $((480 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 7 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | sed -e "s/'KERNEL': 'tma', //;s/'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" | cut -c1-220
done
timeout $((590 - SECONDS)) python3 benchmarks/trace_verify.py --batches 32,256 --scenarios nonflush,mixed \
  --config "{$S}" --config "{$S,\"PFNEXT\":1}" --out $OUT/trace.json 2>&1 | grep -v "^  launch1" | cut -c1-900
