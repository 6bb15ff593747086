#!/bin/bash
# Session 5, device run 3: the TMA kernel with HPP heads per program in a 2-stage pipelined loop (head i + 1's tile and
# gathers in flight while head i computes) against the single-head default; GPU tests of those configs first.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs and tma" 2>&1 | tail -4
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","HPP":2,"NS":2,"maxnreg":0},{"KERNEL":"tma","HPP":4,"NS":2,"maxnreg":0},{"KERNEL":"tma","HPP":16,"NS":2,"maxnreg":0},{"KERNEL":"tma","maxnreg":0}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep3.json > $OUT/sweep3.log 2>&1; echo "sweep rc=$?"
grep -E "^  sweep b=" $OUT/sweep3.log | grep -v best | cut -c1-140
