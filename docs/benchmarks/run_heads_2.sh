#!/bin/bash
# Session 6, device run 2: the TMA kernel with HEADS heads of one group per program (a plain loop: the cursors, B rows,
# Gram and C are loaded once per program; one tile buffer), with and without L2 prefetches; GPU tests of the configs
# first. Ours only (no FlashInfer build).
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "configs" 2>&1 | tail -6 > $OUT/gpu_tests.txt
tail -4 $OUT/gpu_tests.txt
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","HEADS":2},{"KERNEL":"tma","HEADS":2,"L2PF":2},{"KERNEL":"tma","HEADS":4,"L2PF":2},{"KERNEL":"tma","HEADS":8,"L2PF":2},{"KERNEL":"tma","HEADS":4},{"KERNEL":"tma","L2PF":2,"maxnreg":0}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep2.json > $OUT/sweep2.log 2>&1; echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=" $OUT/sweep2.log | grep -v best | cut -c1-150
