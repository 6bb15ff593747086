#!/bin/bash
# Session 7, device run 2: L2 prefetches aimed L2AHEAD launch slots ahead (the tile and rings of the program that
# starts about a wave later), and deeper head pipelines (uncapped). GPU tests of the new configs, ours-only sweep.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs" 2>&1 | tail -8 \
  > $OUT/gpu_tests.txt; tail -5 $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","L2PF":1,"L2AHEAD":330},{"KERNEL":"tma","L2PF":1,"L2AHEAD":660},{"KERNEL":"tma","L2PF":2,"L2AHEAD":660},{"KERNEL":"tma","L2PF":2,"L2AHEAD":1320},{"KERNEL":"tma","HEADS":8,"HSTAGES":2,"maxnreg":0},{"KERNEL":"tma","HEADS":16,"HSTAGES":2,"maxnreg":0},{"KERNEL":"tma","HEADS":8,"HSTAGES":4,"maxnreg":0},{"KERNEL":"tma","HEADS":16,"HSTAGES":5,"maxnreg":0,"num_warps":8}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep2.json > $OUT/sweep2.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep2.log | grep -v best | cut -c1-170
