#!/bin/bash
# Session 12, run 5 (ours only, T=4, W=16): traces of the new default (row cursors; one-head launch up to batch 98)
# at batch 1, 32 and 64, non-flush and the steady-state mixed batch, and of the route-split streamed launch at 64.
set -o pipefail; export PYTHONUNBUFFERED=1
timeout 280 python3 benchmarks/trace_verify.py --batches 1,32,64 --scenarios nonflush,mixed --out $OUT/trace.json \
  > $OUT/trace.log 2>&1; echo "trace rc=$? at $SECONDS s"; cut -c1-330 $OUT/trace.log | head -40
timeout $((400 - SECONDS)) python3 benchmarks/trace_verify.py --batches 64 --scenarios nonflush,mixed \
  --config '{"KERNEL":"tma","SPLIT":1,"STREAM":2,"PDL":1,"PROGS":3,"maxnreg":168,"PFHEADS":1}' \
  --out $OUT/trace_stream64.json > $OUT/trace_stream64.log 2>&1; echo "stream rc=$? at $SECONDS s"
cut -c1-330 $OUT/trace_stream64.log | head -12
