#!/bin/bash
# Session 14, run 1: find the test that faults with "CUDA error: misaligned address" (session 13 run 3). Runs the GPU
# suite with -x, deselecting each failure found and going again (a fault poisons the CUDA context), then reruns each
# failing test alone with CUDA_LAUNCH_BLOCKING=1.
export PYTHONUNBUFFERED=1
DESEL=""; FAILS=""
for round in 1 2 3 4; do
  timeout $((420 - SECONDS)) python3 -m pytest -q -x -rf -p no:cacheprovider tests/gpu/ $DESEL > $OUT/gpu_tests_r$round.txt 2>&1
  rc=$?; tail -n 2 $OUT/gpu_tests_r$round.txt | cut -c1-300; echo "round $round rc=$rc at $SECONDS s"
  f=$(grep -E "^FAILED" $OUT/gpu_tests_r$round.txt | head -1 | awk '{print $2}')
  [ -z "$f" ] && break
  FAILS="$FAILS $f"; DESEL="$DESEL --deselect $f"
done
for f in $FAILS; do
  echo "== alone: $f"
  CUDA_LAUNCH_BLOCKING=1 timeout $((560 - SECONDS)) python3 -m pytest -q -x -p no:cacheprovider "$f" > $OUT/alone.txt 2>&1
  grep -E "Error|error|passed|failed" $OUT/alone.txt | head -6 | cut -c1-300
  grep -E "^(ssmstate|tests)/.*py:[0-9]+" $OUT/alone.txt | tail -4
done
echo "done $SECONDS s"
