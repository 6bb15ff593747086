"""The ``ssmstate`` command line: tables, JSON, sweeps, and one-line errors with exit code 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ssmstate.cli import main, parse_k_range
from ssmstate.errors import SSMStateError
from ssmstate.geometry import preset_names
from ssmstate.gpus import GPUS
from ssmstate.planner import plan_capacity

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_table_shows_both_schemes(capsys) -> None:
    rc, out, err = _run(capsys, "plan")
    assert rc == 0 and err == ""
    plan = plan_capacity("nemotron-h-8b")
    for label in ("pages per request", "Mamba state / request", "attention KV / request", "total / request",
                  "max concurrency @ 8192", "native", "replay"):
        assert label in out
    row = next(line for line in out.splitlines() if line.startswith("max concurrency"))
    assert row.split()[-2:] == [str(plan.native.max_concurrency), str(plan.replay.max_concurrency)]
    assert f"{plan.concurrency_ratio:.2f}x concurrency" in out
    assert "MiB" in out and "GiB" in out


def test_plan_json_is_the_plan(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--gpu", "B200", "--tp", "2", "-k", "4", "--max-model-len", "4096", "--json")
    assert rc == 0
    got = json.loads(out)
    want = plan_capacity("nemotron-h-8b", gpu="B200", tp_size=2, num_speculative_tokens=4, max_model_len=4096)
    assert got == json.loads(json.dumps(want.to_dict()))
    assert got["native"]["pages_per_request"] == 5 and got["replay"]["pages_per_request"] == 1


def test_plan_no_attention_and_dtypes(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--no-attention", "--state-dtype", "bf16", "--gpu-memory", "80GiB", "--json")
    assert rc == 0
    got = json.loads(out)
    assert got["count_attention"] is False and got["replay"]["attention_bytes_per_request"] == 0
    assert got["geometry"]["state_dtype"] == "bfloat16" and got["gpu_memory"] == 80 << 30


def test_vllm_compatible_table(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--vllm-compatible", "--gpu-memory", "100GiB", "--gpu-utilization", "1")
    assert rc == 0
    assert "Maximum concurrency for 8192 tokens per request" in out
    row = next(line for line in out.splitlines() if line.startswith("max concurrency") and "x" in line.split()[-1])
    assert row.split()[-2:] == ["193.94x", f"{5688 / 14:.2f}x"]
    assert "1056" in out and "1152" in out


def test_sweep_table_json_and_parse(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--sweep-k", "0..8", "--no-attention")
    assert rc == 0
    all_lines = out.splitlines()
    sep = next(i for i, line in enumerate(all_lines) if line.startswith("-  "))
    lines = all_lines[sep + 1:]
    assert [int(line.split()[0]) for line in lines] == list(range(9))
    rc, out, _ = _run(capsys, "plan", "--sweep-k", "1,3", "--json", "--vllm-compatible")
    got = json.loads(out)
    assert [p["num_speculative_tokens"] for p in got] == [1, 3] and got[0]["vllm_native"] is not None
    assert parse_k_range("0..8") == list(range(9)) and parse_k_range("2") == [2]
    for bad in ("a..b", "", "3..1", "-1"):
        with pytest.raises(SSMStateError):
            parse_k_range(bad)


def test_presets_and_gpus(capsys) -> None:
    rc, out, _ = _run(capsys, "presets")
    assert rc == 0 and all(name in out for name in preset_names())
    rc, out, _ = _run(capsys, "gpus")
    assert rc == 0 and all(name in out for name in GPUS)


@pytest.mark.parametrize("argv, message", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--gpu-memory", "10MiB"], "holds no native request"),
    (["--tp", "3"], "tp_size=3 must divide"),
    (["--gpu-memory", "80 XB"], "bad memory size"),
    (["--gpu-memory", "lots"], "bad memory size"),
    (["--gpu", "Z9000"], "unknown GPU"),
    (["--sweep-k", "x"], "bad --sweep-k"),
    (["--gpu-utilization", "1.5"], "gpu_utilization"),
    (["-k", "-1"], "num_speculative_tokens"),
    (["-k", "4", "--window", "4"], "window W=4"),
    (["--state-dtype", "int3"], "unknown dtype"),
])
def test_bad_inputs_exit_2_with_one_line(capsys, argv: list[str], message: str) -> None:
    rc, out, err = _run(capsys, "plan", *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssmstate: error: ") and message in lines[0]


def test_argparse_errors_exit_2(capsys) -> None:
    rc, _, err = _run(capsys, "plan", "--gpu", "H200", "--gpu-memory", "80GiB")
    assert rc == 2 and "not allowed with" in err
    rc, _, err = _run(capsys, "plan", "--bogus")
    assert rc == 2 and "unrecognized arguments" in err
    rc, _, _ = _run(capsys)
    assert rc == 2


def test_plot(capsys, tmp_path: Path) -> None:
    out_png = tmp_path / "k.png"
    rc, out, err = _run(capsys, "plan", "--sweep-k", "0..3", "--plot", str(out_png))
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "--plot needs matplotlib" in err and not out_png.exists()
    else:
        assert rc == 0 and out_png.stat().st_size > 0


def test_python_dash_m() -> None:
    proc = subprocess.run([sys.executable, "-m", "ssmstate", "plan", "--gpu", "H100-80GB", "--tp", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "nemotron-h-8b on H100-80GB" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "ssmstate", "plan", "--model", "nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_capacity_doc_examples_are_current(capsys) -> None:
    """Every ```text block of docs/capacity.md that starts with `$ ssmstate ...` is that command's output."""
    import re
    import shlex

    text = (ROOT / "docs" / "capacity.md").read_text()
    blocks = re.findall(r"```text\n\$ (ssmstate [^\n]*)\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    for cmd, expected in blocks:
        rc, out, err = _run(capsys, *shlex.split(cmd)[1:])
        assert rc == 0, err
        assert out.rstrip("\n") == expected.rstrip("\n"), f"docs/capacity.md is stale for: {cmd}"
