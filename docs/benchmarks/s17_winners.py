"""Print, as a JSON list for ``bench_verify.py --sweep-configs``, the sweep configs of an ours-only sweep record that
beat the default's non-flush time by at least ``--min`` percent at some batch (session 17: the candidates a later
FlashInfer comparison in the same call times again). Run: ``python s17_winners.py sweep.json [more.json] --min 2``."""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("records", nargs="+")
ap.add_argument("--min", type=float, default=2.0)
a = ap.parse_args()
wins = []
for path in a.records:
    try:
        rows = json.load(open(path))["rows"]
    except (OSError, ValueError, KeyError):
        continue
    for row in rows:
        base = row.get("ours_default_nonflush_us")
        for res in row.get("sweep_results", []):
            if res.get("default") or "error" in res or base is None:
                continue
            if res["nonflush_us"] <= base * (1 - a.min / 100) and res["config"] not in wins:
                wins.append(res["config"])
print(json.dumps(wins))
