#!/bin/bash
# Session 14, run 2: isolate the misaligned-address fault of {"KERNEL":"tma","FOLD_N":64,"maxnreg":104} at T=8, W=32
# (the heuristic adds EARLY 3 and KSPLIT 1 there), then compute-sanitizer on it for the faulting source line.
export PYTHONUNBUFFERED=1
P=docs/benchmarks/s14_fault_probe.py
for a in '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104}' '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"KSPLIT":0}' \
  '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"EARLY":2}' '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"EARLY":0,"KSPLIT":0}' \
  '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":128}' '8 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":0}' \
  '8 32 12 {"KERNEL":"tma","maxnreg":104}' '4 32 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104}' \
  '8 16 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"EARLY":3}' '4 16 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"EARLY":3}' \
  '4 16 12 {"KERNEL":"tma","FOLD_N":64,"maxnreg":104,"EARLY":3,"KSPLIT":1}' '8 32 12 {"KERNEL":"tma","FOLD_N":128,"maxnreg":0,"EARLY":3}' \
  '4 16 12 {"KERNEL":"tma","FOLD_N":128,"maxnreg":0,"EARLY":3}'; do
  set -- $a; timeout 120 python3 $P $1 $2 $3 "$4" 2>&1 | grep -E "^(OK|FAIL)|Error" | head -2
done
echo "probes done $SECONDS s"
CS=$(dirname $(readlink -f $(which nvcc)))/compute-sanitizer; ls $CS || CS=$(ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
timeout 200 $CS --print-limit 3 python3 $P 8 32 12 '{"KERNEL":"tma","FOLD_N":64,"maxnreg":104}' > $OUT/sanitizer.txt 2>&1
grep -E "Invalid|Misaligned|at |by thread|Address|kernel|line|\.py" $OUT/sanitizer.txt | head -30 | cut -c1-250
echo "done $SECONDS s"
# then ours at W=32 (T=4 and T=8), every batch, on the default launch (session 13 run 3's records were lost)
timeout $((585 - SECONDS)) python3 benchmarks/bench_verify.py --no-flashinfer --configs 4:32,8:32 --reps 10 \
  --out $OUT/verify_w32.json > $OUT/verify_w32.log 2>&1; echo "W=32 rc=$? at $SECONDS s"
grep -v '^  {"T"' $OUT/verify_w32.log | tail -22 | cut -c1-200
