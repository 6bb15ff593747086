#!/bin/bash
# Session 8, device run 2 (ours only): Nsight Compute on the pipelined launch at batch 256 (non-flush, and flush with
# PFHEADS=1), to see what bounds it now that the tile is double-buffered.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis_Tables"
for spec in "nonflush {}" "flush {\"PFHEADS\":1}" "nonflush {\"HEADS\":1,\"HSTAGES\":1,\"FOLD_N\":32,\"maxnreg\":96}"; do
  set -- $spec; fl=""; [ "$1" = flush ] && fl="--flush"; tag="b256_$1_$(echo $2 | tr -dc 'A-Z0-9')"
  ncu --clock-control none --kernel-name regex:_verify --launch-skip 2 --launch-count 1 $SECT --print-summary none \
      python3 benchmarks/profile_verify.py --batch 256 $fl --config "$2" > $OUT/ncu_$tag.txt 2>&1
  echo "$tag rc=$? at $SECONDS s"
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Theoretical Occupancy|Warp Cycles Per Issued|stalled_(long|barrier|wait|short|math|lg|mio)" $OUT/ncu_$tag.txt | head -24
done
