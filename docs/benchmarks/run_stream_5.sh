#!/bin/bash
# Runs on branch session9-flush-stages (FLUSH_STAGES is not a config on main: it gained nothing, docs/performance_log.md section 11).
# Session 9, run 5 (ours only): the streamed flush launch in Triton's 2-stage pipeline (FLUSH_STAGES=2: two tile
# buffers, the runtime head count as the loop bound) against the default (one buffer); T=4, W=16.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "stream_batch64 or pdl" \
  > $OUT/gpu_tests.txt 2>&1; grep -E "passed|failed|^FAILED" $OUT/gpu_tests.txt | head -8; echo "tests done $SECONDS s"
A='[{"KERNEL":"tma","PFHEADS":1,"SPLIT":1,"STREAM":2,"maxnreg":168,"PDL":1,"PROGS":3,"FLUSH_STAGES":2}]'
for b in 256 64 128; do
  timeout $((200 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$A" --configs 4:16 \
    --batches $b --reps 3 --out $OUT/sweep_b$b.json > $OUT/sweep_b$b.log 2>&1; echo "b$b rc=$? at $SECONDS s"
  grep -E "^  sweep b=" $OUT/sweep_b$b.log | grep -v best | sed -e "s/'KERNEL': 'tma', 'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" | cut -c1-220
done
