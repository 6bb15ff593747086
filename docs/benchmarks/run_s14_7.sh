#!/bin/bash
# Needs docs/benchmarks/s14_flush_fold_n.patch applied (the FLUSH_FOLD_N key; measured slower, not kept in the code).
# Session 14, run 7 (ours only, last ~240 s of device time): FLUSH_FOLD_N, SPLIT's flush launch folding in column
# chunks re-read from L2 instead of the whole tile (fewer live registers: at W=32, batch 256, 88 bytes of stack and
# 35 spill loads against 344 and 86; kernel_resources.py). The new configs' GPU tests, then the streamed launches'
# batches (128, 256) at W=16 and W=32 against the default in the same process.
export PYTHONUNBUFFERED=1
timeout 75 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_triton_gpu.py -k "FLUSH_FOLD_N" \
  > $OUT/gpu_tests.txt 2>&1; echo "tests rc=$? at $SECONDS s"; tail -n 2 $OUT/gpu_tests.txt | cut -c1-200
timeout $((200 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --batches 256,128 --configs 4:32,4:16 \
  --reps 10 --sweep-configs '[{"FLUSH_FOLD_N":32},{"FLUSH_FOLD_N":64}]' --out $OUT/sweep.json > $OUT/sweep.log 2>&1
echo "sweep rc=$? at $SECONDS s"
grep -E "^  sweep b=|^== " $OUT/sweep.log | grep -v best | sed "s/'KERNEL': 'tma', 'BLOCK_P': 64, 'num_warps': 4, 'num_stages': 1, //" | cut -c1-250
