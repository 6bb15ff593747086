#!/bin/bash
# Session 7, device run 1: the TMA kernel with HEADS heads of one group per program in a software-pipelined loop
# (HSTAGES stages: head i+1's tile copy goes out while head i computes). GPU tests of the new configs, then an
# ours-only sweep (no FlashInfer in this run).
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs or heuristic" 2>&1 | tail -8 \
  > $OUT/gpu_tests.txt; tail -5 $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","HEADS":2,"HSTAGES":2},{"KERNEL":"tma","HEADS":4,"HSTAGES":2},{"KERNEL":"tma","HEADS":8,"HSTAGES":2},{"KERNEL":"tma","HEADS":16,"HSTAGES":2},{"KERNEL":"tma","HEADS":8,"HSTAGES":2,"maxnreg":0},{"KERNEL":"tma","HEADS":8,"HSTAGES":3,"maxnreg":0},{"KERNEL":"tma","HEADS":8,"HSTAGES":2,"num_warps":8},{"KERNEL":"tma","HEADS":4,"HSTAGES":2,"FOLD_N":16}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep1.json > $OUT/sweep1.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep1.log | grep -v best | cut -c1-170
