#!/bin/bash
# Prepared in session 10 for the next device session (branch session10-ring-all; NOT RUN): config RING_ALL=1, the
# one-head TMA program loading the whole x / dt / B rings and the window's rows together with the cursors (they
# need only the page), then putting them in sequence order by register gathers; one dependent round trip fewer
# (docs/performance.md section 12, batch 1). Ours only, T=4, W=16: GPU tests of the configs, sweeps against the
# default at batch 1, 8 and 32 (the one-head launch's range), traces of both at batch 1 and 32. ~3 min.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "RING_ALL or trace" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
for b in 1 8 32; do
  timeout $((400 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"RING_ALL":1}]' \
    --configs 4:16 --batches $b --reps 10 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | cut -c1-220
done
timeout $((590 - SECONDS)) python3 benchmarks/trace_verify.py --batches 1,32 --scenarios nonflush,mixed \
  --config null --config '{"RING_ALL":1}' --out $OUT/trace.json 2>&1 | grep -v "^  launch1" | cut -c1-600
