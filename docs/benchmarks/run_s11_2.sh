#!/bin/bash
# Session 11, run 2 (ours only, T=4, W=16). Run 1 measured EARLY=1 faster on the one-head launch (batch 1-32) and
# RING_ALL / KEEP_ROW no better. Here: GPU tests of the EARLY configs; sweeps of EARLY 1/2/3 with the L2 prefetch
# levels and BLOCK_P=32 at batch 1, 8, 32; the one-head launch with EARLY=3 against the streamed default at 64 and
# 128; EARLY=2 on the streamed launches at 64-256; traces of the default and EARLY=3 at batch 1 and 32.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "EARLY" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED|Error" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
timeout $((330 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"EARLY":1},
  {"EARLY":2},{"EARLY":3},{"EARLY":3,"L2PF":1},{"EARLY":3,"L2PF":2},{"EARLY":2,"L2PF":1},{"EARLY":3,"L2PF":0},
  {"EARLY":3,"BLOCK_P":32,"maxnreg":64},{"EARLY":3,"BLOCK_P":32,"maxnreg":80},{"EARLY":3,"BLOCK_P":32,"maxnreg":64,"L2PF":1}]' \
  --configs 4:16 --batches 1,8,32 --reps 10 --out $OUT/sweep_small.json > $OUT/sweep_small.log 2>&1
echo "small rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/sweep_small.log | grep -v best | cut -c1-160
timeout $((500 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs '[{"EARLY":2},
  {"HEADS":1,"maxnreg":96,"EARLY":3},{"HEADS":1,"maxnreg":96,"EARLY":3,"L2PF":1}]' \
  --configs 4:16 --batches 64,128,256 --reps 10 --out $OUT/sweep_large.json > $OUT/sweep_large.log 2>&1
echo "large rc=$? at $SECONDS s"; grep -E "^  sweep b=" $OUT/sweep_large.log | grep -v best | cut -c1-160
timeout $((590 - SECONDS)) python3 benchmarks/trace_verify.py --batches 1,32 --scenarios nonflush \
  --config null --config '{"EARLY":3}' --out $OUT/trace.json > $OUT/trace.log 2>&1
echo "trace rc=$? at $SECONDS s"; grep -v "^  launch1" $OUT/trace.log | cut -c1-400 | head -40
