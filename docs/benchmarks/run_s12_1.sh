#!/bin/bash
# Session 12, run 1 (ours only, T=4, W=16): row cursors (StepPlan.row_cursors, gathered once per step) read by the
# TMA kernel beside the page id, against the pages' cursors (ROW_CURSORS: 0, the launch before this session).
# GPU tests of the new path and the default launches, then a sweep at every batch (default = row cursors on,
# candidate = off, same process), then traces of both at batch 1 and 32.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "row_cursors or heuristic_routes or nemotron \
  or manager or graph" > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8
echo "tests done $SECONDS s"
timeout $((420 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"ROW_CURSORS":0}]' \
  --configs 4:16 --reps 10 --out $OUT/sweep.json > $OUT/sweep.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep.log | grep -v best | cut -c1-220
python3 -c "
import json; d=json.load(open('$OUT/sweep.json'))
for r in d['rows']: print('b', r['batch'], 'gather us', round(r['ours_gather_us'], 2))"
timeout $((590 - SECONDS)) python3 benchmarks/trace_verify.py --batches 1,32 --scenarios nonflush \
  --config '{"ROW_CURSORS":1}' --config '{"ROW_CURSORS":0}' --out $OUT/trace.json > $OUT/trace.log 2>&1
echo "trace rc=$? at $SECONDS s"; grep -v "^  launch1" $OUT/trace.log | cut -c1-300 | head -20
