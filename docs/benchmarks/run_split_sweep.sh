#!/bin/bash
# Session 4, device runs 2-4: split path (prep + apply) correctness at Nemotron-H geometry, a sweep of its launch
# configs against the v4 kernel (ours only), and an Nsight Compute read of both split kernels at batch 256.
set -o pipefail; export PYTHONUNBUFFERED=1; export PYTHONPATH=$PWD
python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_triton_gpu.py -k split 2>&1 | tail -3
CFGS='[{"SPLIT":true},{"SPLIT":true,"HPC":8},{"SPLIT":true,"HPC":4},{"SPLIT":true,"prep_warps":2},{"SPLIT":true,"HPC":8,"prep_warps":2},{"SPLIT":true,"prep_warps":8},{"SPLIT":true,"NC":32,"NS":3,"maxnreg":0},{"SPLIT":true,"NC":64,"NS":2}]'
python3 benchmarks/bench_verify.py --no-flashinfer --sweep-configs "$CFGS" --configs 4:16 --batches 256,64,8,1 --reps 5 \
  --out $OUT/split_sweep.json > $OUT/split_sweep.log 2>&1; echo "sweep rc=$?"
grep -A12 "^sweep T=" $OUT/split_sweep.log | grep -v "^--"
ncu --clock-control none --kernel-name regex:_verify_ --launch-skip 4 --launch-count 2 --section SpeedOfLight \
  --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats \
  python3 benchmarks/profile_verify.py --batch 256 --config '{"SPLIT":true}' > $OUT/ncu_split_b256.txt 2>&1; echo "ncu rc=$?"
grep -E "_verify_|Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|^    Executed Instructions " $OUT/ncu_split_b256.txt
