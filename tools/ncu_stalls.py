"""Summarize Nsight Compute's per-instruction warp-stall samples (the SASS source page, CSV) of one kernel.

Input: ``ncu -i REPORT --page source --csv --print-source sass > src.csv`` of a report taken with
``--set full``, e.g. ``ncu --clock-control none --kernel-name regex:_verify --launch-skip 2 --launch-count 1
--set full --import-source no -o REPORT python3 tools/profile_verify.py --batch 256``. Prints the share of every stall reason over all
samples, then the instructions that hold at least ``--min`` percent of the samples, in address order,
each with its execution count and its main reasons: where a program's warps wait, and on what.

Run: ``python tools/ncu_stalls.py src.csv [--min 0.3]``.
"""

from __future__ import annotations

import argparse
import csv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--min", type=float, default=0.3, help="percent of all samples an instruction must hold")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    col = {h: i for i, h in enumerate(hdr)}
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r: list[str], i: int) -> float:
        return float(r[i] or 0)

    total = sum(num(r, samples) for r in data) or 1.0
    shares = {h[6:]: sum(num(r, col[h]) for r in data) / total * 100 for h in reasons}
    print(f"{len(data)} instructions, {total:.0f} samples; stall reasons (% of samples):")
    print("  " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v >= 0.05))
    print(f"\ninstructions with >= {a.min} % of the samples (address, executions, %, SASS, main reasons):")
    for r in data:
        share = num(r, samples) / total * 100
        if share < a.min:
            continue
        why = ", ".join(f"{h[6:]} {num(r, col[h]) / total * 100:.1f}" for h in reasons
                        if num(r, col[h]) / total * 100 >= 0.2)
        print(f"  {r[col['Address']][-5:]} {r[col['Instructions Executed']]:>7} {share:5.1f}  "
              f"{r[col['Source']].strip()[:60]:<60} {why}")


if __name__ == "__main__":
    main()
