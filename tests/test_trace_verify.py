"""tools/trace_verify.py's analysis on a synthetic trace (the trace itself needs the GPU: tests/gpu)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _trace_verify():
    spec = importlib.util.spec_from_file_location("trace_verify", ROOT / "tools" / "trace_verify.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _program(tr: torch.Tensor, p: int, g0: int, segs: list[tuple[int, int]], end: int, rank: int | None) -> None:
    """Program ``p`` of a synthetic launch: the global timer at 2 ns per cycle from ``g0``; ``segs``: (start cycle,
    heads), each with cursors after 200 cycles, the Gram after 500 and 600 cycles per head."""
    k0 = 10_000 + p

    def put(slot: int, dk: int) -> None:
        tr[p, slot] = torch.tensor([g0 + 2 * dk, k0 + dk])

    put(0, 0)
    if rank is not None:
        put(1, rank)
    for s, (start, nh) in enumerate(segs):
        b = 2 + 5 * s
        put(b, start)
        put(b + 1, start + 200)
        put(b + 2, start + 500)
        put(b + 3, start + 500 + 600 * nh)
        tr[p, b + 4, 0] = nh
    tr[p, 30, 0] = len(segs)
    put(31, end)


def test_launch_stats_reads_each_phase():
    tv = _trace_verify()
    tr = torch.zeros(3, tv.SLOTS, 2, dtype=torch.int64)  # program 2 never ran (no stamps): left out
    _program(tr, 0, 1000, [(700, 4), (3700, 2)], 5000, rank=500)
    _program(tr, 1, 1100, [(700, 4), (3700, 2)], 5000, rank=500)
    st = tv.launch_stats(tr)
    assert st["programs"] == 2 and st["ns_per_cycle"] == 2.0
    assert st["span"] == 1100 + 10_000 - 1000
    assert st["ramp"] == [0.0, 100.0] and st["tail"] == [100.0, 0.0] and st["busy"] == [10_000.0] * 2
    assert st["rank"] == [1000.0] * 2 and st["lead"] == [400.0] * 2
    assert st["after_cursor"] == [8200.0] * 2  # the first segment's cursors (cycle 900) to the end (5000)
    assert st["seg0_cursor"] == [400.0] * 2 and st["seg0_gram"] == [600.0] * 2
    assert st["seg0_heads"] == [4800.0] * 2 and st["seg0_per_head"] == [1200.0] * 2 and st["seg0_nh"] == [4.0] * 2
    assert st["seg1_heads"] == [2400.0] * 2 and st["seg1_per_head"] == [1200.0] * 2
    assert "seg2_cursor" not in st
    res = tv.summarize([[st, None], [st, None]])
    assert "launch1" not in res
    assert res["launch0"]["seg0_per_head"] == {"p50": 1.2, "p90": 1.2}  # µs
    assert res["launch0"]["seg0_nh"] == {"p50": 4.0, "p90": 4.0}  # counts stay counts


def test_launch_stats_of_a_launch_without_segments():
    """A launch whose programs found no rows (an empty route): its rank, no lead or segment phases."""
    tv = _trace_verify()
    tr = torch.zeros(2, tv.SLOTS, 2, dtype=torch.int64)
    _program(tr, 0, 1000, [], 1500, rank=300)  # 3 µs: long enough to measure ns per cycle
    _program(tr, 1, 1000, [], 1500, rank=300)
    st = tv.launch_stats(tr)
    assert st["rank"] == [600.0] * 2 and st["segs"] == [0.0] * 2
    assert "lead" not in st and "after_cursor" not in st and not any(key.startswith("seg0") for key in st)
    assert tv.launch_stats(torch.zeros(2, tv.SLOTS, 2, dtype=torch.int64)) is None  # nothing ran
