#!/bin/bash
# Session 12, run 6 (ours only, default launch): the steady-state mixed batch as drawn against the same rows with
# the flush rows first (ours_mixed_flush_first_us; row order is launch order), T=4 and T=8, W=16.
set -o pipefail; export PYTHONUNBUFFERED=1
python3 benchmarks/bench_verify.py --no-flashinfer --configs 4:16 --batches 8,32,64,128,256 --reps 10 \
  --out $OUT/order_t4.json > $OUT/order_t4.log 2>&1; echo "t4 rc=$? at $SECONDS s"
python3 benchmarks/bench_verify.py --no-flashinfer --configs 8:16 --batches 32,64 --reps 10 \
  --out $OUT/order_t8.json > $OUT/order_t8.log 2>&1; echo "t8 rc=$? at $SECONDS s"
python3 -c "
import json
for f in ('order_t4', 'order_t8'):
    for r in json.load(open('$OUT/' + f + '.json'))['rows']:
        print(r['T'], r['batch'], 'nf', round(r['ours_nonflush_us'], 2), 'fl', round(r['ours_flush_us'], 2),
              'amort', round(r['ours_amortized_us'], 2), 'mixed', round(r['ours_mixed_us'], 2),
              'flush-first', round(r['ours_mixed_flush_first_us'], 2))"
