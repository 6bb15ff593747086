#!/bin/bash
# Session 20, run 1 (no carry; ours only, for a call with under 300 s of device time left): on an H200 only (exits 3
# on any other card), the driver's bandwidth and the launches verify_config picks, the GPU tests of the routes per
# batch, and the whole table without FlashInfer (T=4, W=16); every row is kept as it is printed. (Its one call ran
# without PYTHONPATH=., so the first step failed on the import; call 2 reran it, see verify.md.)
set -o pipefail; export PYTHONUNBUFFERED=1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in *H200*) ;; *) nvidia-smi -L; exit 3;; esac
PYTHONPATH=. python3 docs/benchmarks/s19_heuristic.py > $OUT/info.txt 2>&1; cat $OUT/info.txt
timeout 120 python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "heuristic_routes" 2>&1 | tail -4 \
  | tee $OUT/gpu_tests.txt; echo "tests done $SECONDS s"
timeout $((270 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --out $OUT/verify.json --configs 4:16 \
  --reps 10 2>&1 | tee $OUT/verify_raw.log | grep -v '^  {"T"\|^  sweep b=' | tail -14
echo "verify done $SECONDS s"
