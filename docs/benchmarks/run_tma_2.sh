#!/bin/bash
# Session 5, device run 2: where the TMA kernel's time goes (Nsight Compute at batch 256, non-flush: throughput,
# occupancy, scheduler and per-reason stall metrics) for 4 and 8 warps, and a launch sweep of both (ours only).
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
STALLS=$(for r in barrier long_scoreboard short_scoreboard mio_throttle lg_throttle wait math_pipe_throttle \
  not_selected selected dispatch_stall membar sleeping tex_throttle branch_resolving no_instruction misc drain; do
  printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $r; done)
for cfg in '{"KERNEL":"tma"}' '{"KERNEL":"tma","num_warps":8}'; do
  tag=$(echo "$cfg" | tr -dc 'a-z0-9')
  ncu --clock-control none --kernel-name regex:_verify_ --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats \
    --section MemoryWorkloadAnalysis --metrics "${STALLS%,}" \
    python3 benchmarks/profile_verify.py --batch 256 --config "$cfg" > $OUT/ncu_$tag.txt 2>&1; echo "ncu $cfg rc=$?"
  grep -E "Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Executed Instructions  |L2 Hit|L1/TEX Hit|Mem Busy|stalled" $OUT/ncu_$tag.txt \
    | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g'
done
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs \
  '[{"KERNEL":"tma"},{"KERNEL":"tma","num_warps":8},{"KERNEL":"tma","num_warps":8,"maxnreg":80}]' \
  --configs 4:16 --batches 256,64,8,1 --reps 5 --out $OUT/sweep2.json > $OUT/sweep2.log 2>&1; echo "sweep rc=$?"
grep -E "^  sweep b=" $OUT/sweep2.log | grep -v best | cut -c1-160
