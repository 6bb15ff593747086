"""The benchmark scripts' CPU paths: progress output and ``bench_verify.py --cpu-smoke``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    code = ("import sys; sys.path.insert(0, 'benchmarks'); from progress import progress\n"
            "bar = progress(3, 'work', every=0.0)\n"
            "for _ in range(3): bar.update(1)\n"
            "bar.close()\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["work: 1/3", "work: 2/3", "work: 3/3"]
    assert "\r" not in res.stderr  # a log gets whole lines, no carriage-return bar


def test_bench_verify_cpu_smoke(tmp_path: Path) -> None:
    """The whole verify benchmark on CPU under the Triton interpreter: it prints the table and writes every row."""
    out = tmp_path / "verify.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_verify.py"), "--cpu-smoke", "--out",
                          str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [(r["T"], r["W"], r["batch"]) for r in got["rows"]] == [(4, 16, 1), (4, 16, 2)]
    assert all(r["ours_nonflush_us"] > 0 and r["ours_flush_us"] > 0 and r["ours_one_flush_us"] > 0 for r in got["rows"])
    assert "bench_verify (T:W pairs): 1/1 (100%)" in res.stderr
    assert " T   W batch |" in res.stdout
    print(f"bench_verify --cpu-smoke took {time.monotonic() - t0:.1f} s")


def test_bench_verify_quant_cpu_smoke(tmp_path: Path) -> None:
    """The 8-bit verify benchmark on CPU under the Triton interpreter (fp32 and int8 pools, batch 1, a sweep of two
    launches): it prints its table and writes each dtype's figures, the sweep's on both routes."""
    out = tmp_path / "verify_quant.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_verify_quant.py"), "--cpu-smoke",
                          "--dtypes", "fp32,int8", "--batches", "1", "--sweep-configs", '[{}, {"BLOCK_S": 8}]',
                          "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())["results"]
    assert sorted(got) == ["fp32", "int8"]
    assert got["int8"]["1"]["ours_nonflush_us"] > 0 and got["int8"]["1"]["ours_flush_us"] > 0
    for route in ("nonflush", "flush"):
        sweep = got["int8"]["1"][f"ours_sweep_{route}_us"]
        assert sorted(sweep) == ["", "BLOCK_S=8"] and all(v > 0 for v in sweep.values()), sweep
    assert "batch |    fp32 |    int8" in res.stdout and "sweep int8 flush b=1" in res.stdout


def test_accuracy_drift_cpu_smoke(tmp_path: Path) -> None:
    """The drift study on a tiny shape: every run against fp32, errors positive and ordered by resolution."""
    out = tmp_path / "drift.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy_drift.py"), "--heads", "2",
                          "--head-dim", "8", "--state", "16", "--batch", "2", "--steps", "120",
                          "--dtypes", "fp16", "int8", "--json", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = {r["run"]: r for r in json.loads(out.read_text())["rows"]}
    assert sorted(got) == ["fp16", "fp16+sr", "int8", "int8+sr"]
    for r in got.values():
        assert set(r["output_err"]) == {"100", "120"} and set(r["state_err"]) == {"100", "120"}
        assert 0 < r["output_err"]["120"] <= r["output_err_max"] < 0.1
    assert got["fp16"]["state_err"]["120"] < got["int8"]["state_err"]["120"]  # 11 mantissa bits vs 8-bit codes
    assert "| int8+sr |" in res.stdout


def test_bench_decode_step_cpu_smoke(tmp_path: Path) -> None:
    """The decode-step benchmark on CPU under the Triton interpreter: ours (fused and unfused) through the manager,
    real commits; the FlashInfer and vLLM variants are skipped and say why."""
    out = tmp_path / "decode_step.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decode_step.py"), "--cpu-smoke", "--json",
                          str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in got["rows"]] == [("nemotron-h-8b", 1), ("nemotron-h-8b", 2)]
    for r in got["rows"]:
        assert r["ours_unfused_us"] > 0 and r["ours_unfused_bytes"] > 0
        assert r["ours_fused_us"] > 0 and r["ours_fused_bytes"] < r["ours_unfused_bytes"]  # no conv-output round trip
        assert r["vllm_pair_skipped"] == r["native_skipped"] == "flashinfer not importable"
    assert "µs per decode step" in res.stdout
    md = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decode_step.py"), "--markdown", str(out)],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert md.returncode == 0, md.stderr[-2000:]
    lines = md.stdout.strip().splitlines()
    assert lines[0].startswith("| card | model | batch |") and len(lines) == 2 + len(got["rows"])
    assert f"{got['rows'][0]['ours_unfused_us']:.1f}" in lines[2]


def test_bench_decode_step_launch_override(tmp_path: Path) -> None:
    """``--launch``: our variants captured under a verify launch override, recorded in the JSON; an unknown key is
    refused with the override's own error before anything runs."""
    out = tmp_path / "decode_step.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_decode_step.py"), "--cpu-smoke", "--batches", "1",
           "--variants", "ours_unfused", "--json", str(out)]
    res = subprocess.run(cmd + ["--launch", '{"shape": "base", "FOLD_N": 8}'], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["env"]["launch"] == {"shape": "base", "FOLD_N": 8} and got["rows"][0]["ours_unfused_us"] > 0
    bad = subprocess.run(cmd + ["--launch", '{"FOLDN": 8}'], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert bad.returncode != 0 and "unknown launch override keys ['FOLDN']" in bad.stderr


def test_bench_decode_step_named_launches(tmp_path: Path) -> None:
    """``--launches``: a variant ``VARIANT@NAME`` runs under NAME's override beside the others in one process, with
    ``--launch`` under it (NAME's fields win); a name not given, or one on a variant not on our Triton backend,
    is skipped with the reason; a bad override is refused before anything runs."""
    out = tmp_path / "decode_step.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_decode_step.py"), "--cpu-smoke", "--batches", "1",
           "--json", str(out), "--launch", '{"shape": "base"}']
    res = subprocess.run(cmd + ["--variants", "ours_unfused,ours_unfused@f8,ours_unfused@nope,vllm_pair@f8",
                                "--launches", '{"f8": {"FOLD_N": 8}}'],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    row = got["rows"][0]
    assert got["env"]["launches"] == {"f8": {"FOLD_N": 8}} and row["ours_unfused_us"] > 0
    assert row["ours_unfused@f8_us"] > 0 and row["ours_unfused@f8_bytes"] == row["ours_unfused_bytes"]
    assert row["ours_unfused@f8_launch"] == {"shape": "base", "FOLD_N": 8} and "ours_unfused_launch" not in row
    assert row["ours_unfused@nope_skipped"] == "no launch 'nope' in --launches"
    assert row["vllm_pair@f8_skipped"] == "a launch applies to the variants on our Triton backend only"
    bad = subprocess.run(cmd + ["--variants", "ours_unfused", "--launches", '{"x": {"FOLDN": 8}}'],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert bad.returncode != 0 and "unknown launch override keys ['FOLDN']" in bad.stderr


def test_bench_conv_cpu_smoke(tmp_path: Path) -> None:
    """The conv benchmark on CPU under the Triton interpreter: ours on both storage orders, vLLM's skipped."""
    out = tmp_path / "conv.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_conv.py"), "--cpu-smoke", "--json",
                          str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ours_us"] > 0 and r["ours_w1_us"] > 0 and r["ours_colmajor_us"] > 0 and "vllm_us" not in r
    assert "µs per conv update" in res.stdout
