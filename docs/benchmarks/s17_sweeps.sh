# Sourced by run_s17_1.sh and run_s17_lean.sh (session 17): the GPU tests of TILE_LDG, then ours-only sweeps against
# our default in one process, T=4, W=16: at batch 1 TILE_LDG (with and without L2PF), EARLY 2 and the route split;
# at batch 8-64 route-split one-head launches under register caps and two heads per program. Writes
# $OUT/sweep_b1.json and $OUT/sweep_b8_64.json (read by s17_winners.py).
timeout 120 python3 -m pytest -q tests/gpu/test_triton_gpu.py -k "TILE_LDG" 2>&1 | tail -2 | tee $OUT/gpu_tests.txt
timeout 120 python3 benchmarks/bench_verify.py --no-flashinfer --batches 1 --configs 4:16 --reps 10 \
  --sweep-configs '[{"L2PF":2,"EARLY":3,"FOLD_N":64,"TILE_LDG":1},
                    {"L2PF":0,"EARLY":3,"FOLD_N":64,"TILE_LDG":1},
                    {"L2PF":2,"EARLY":2,"FOLD_N":64},
                    {"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":3,"L2PF":2},
                    {"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":3,"L2PF":2,"TILE_LDG":1}]' \
  --out $OUT/sweep_b1.json 2>&1 | grep '^  sweep\|Error' | tee $OUT/sweep_b1.log
echo "b1 done $SECONDS s"
timeout 200 python3 benchmarks/bench_verify.py --no-flashinfer --batches 8,32,64 --configs 4:16 --reps 10 \
  --sweep-configs '[{"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":3,"maxnreg":96},
                    {"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":3,"maxnreg":80},
                    {"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":2,"HEADS":2,"HSTAGES":1,"PFHEADS":1,"maxnreg":96},
                    {"SPLIT":1,"PDL":1,"KSPLIT":1,"EARLY":2,"HEADS":2,"HSTAGES":1,"PFHEADS":1,"maxnreg":128}]' \
  --out $OUT/sweep_b8_64.json 2>&1 | grep '^  sweep\|Error' | tee $OUT/sweep_b8_64.log
echo "b8-64 done $SECONDS s"
