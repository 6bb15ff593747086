#!/bin/bash
# Session 8, device run 3 (ours only): per-instruction warp-stall samples (Nsight Compute, full set, SASS source page)
# of the pipelined launch at batch 256, non-flush rows: which instructions a head's iteration waits on.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
ncu --version | tail -1
ncu --clock-control none --kernel-name regex:_verify --launch-skip 2 --launch-count 1 --set full --import-source no \
    -o $OUT/rep_nf python3 benchmarks/profile_verify.py --batch 256 > $OUT/ncu_full.log 2>&1; echo "profile rc=$? $SECONDS s"
ncu -i $OUT/rep_nf.ncu-rep --page source --csv --print-source sass > $OUT/src_sass.csv 2> $OUT/src_err.txt
echo "source rc=$? lines $(wc -l < $OUT/src_sass.csv)"; head -c 600 $OUT/src_sass.csv; head -5 $OUT/src_err.txt
ncu -i $OUT/rep_nf.ncu-rep --page raw --csv > $OUT/raw.csv 2>/dev/null; echo "raw rc=$?"
grep -o 'smsp__average_warp[a-z_]*issue_stalled[a-z_]*per_issue_active.ratio' $OUT/raw.csv | head -3
rm -f $OUT/rep_nf.ncu-rep
