#!/bin/bash
# Nsight Compute profile of the verify kernel on the device (ours only, no FlashInfer): where a program's time goes.
# Usage (repo root, on the device): bash docs/benchmarks/run_profile.sh [CONFIG_JSON]
set -o pipefail; export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats"
CFG=${1:-}
for spec in "256 nonflush" "256 flush" "1 nonflush"; do
  set -- $spec
  fl=""; [ "$2" = flush ] && fl="--flush"
  tag="b$1_$2"
  ncu --clock-control none --kernel-name regex:_verify --launch-skip 2 --launch-count 1 $SECT \
      --section SourceCounters --print-summary none \
      python3 benchmarks/profile_verify.py --batch $1 $fl ${CFG:+--config "$CFG"} > $OUT/ncu_$tag.txt 2>&1
  echo "$tag rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Theoretical Occupancy|Executed Ipc A|Warp Cycles Per Issued|Block Limit" $OUT/ncu_$tag.txt | head -20
done
