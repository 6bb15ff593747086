#!/bin/bash
# Session 11, run 1 (ours only, T=4, W=16), run from commit 3c40d20 (branch session11-keep-row: RING_ALL and
# KEEP_ROW were dropped from main after this run). GPU tests of the new configs, then sweeps against the default:
# RING_ALL=1 (whole rings loaded with the cursors) and EARLY=1 (the first head's gathers beside B's rows) on the
# one-head launch at batch 1, 8, 32; KEEP_ROW=1 (a row's cursors once per streamed program, not per segment) and
# EARLY=1 on the streamed launches at 64, 128, 256; a trace of the default and KEEP_ROW+EARLY at 64 and 256.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "RING_ALL or EARLY or KEEP_ROW" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
timeout $((300 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer \
  --sweep-configs '[{"RING_ALL":1},{"EARLY":1}]' --configs 4:16 --batches 1,8,32 --reps 10 \
  --out $OUT/sweep_small.json > $OUT/sweep_small.log 2>&1; echo "small rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep_small.log | grep -v best | cut -c1-200
timeout $((500 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer \
  --sweep-configs '[{"KEEP_ROW":1},{"EARLY":1},{"KEEP_ROW":1,"EARLY":1}]' --configs 4:16 --batches 64,128,256 \
  --reps 10 --out $OUT/sweep_large.json > $OUT/sweep_large.log 2>&1; echo "large rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep_large.log | grep -v best | cut -c1-200
timeout $((590 - SECONDS)) python3 benchmarks/trace_verify.py --batches 64,256 --scenarios nonflush \
  --config null --config '{"KEEP_ROW":1,"EARLY":1}' --out $OUT/trace.json > $OUT/trace.log 2>&1
echo "trace rc=$? at $SECONDS s"; grep -v "^  launch1" $OUT/trace.log | cut -c1-300 | head -40
