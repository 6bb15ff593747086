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


def _row(out: str, label: str) -> list[str]:
    """The cells after ``label`` of the table row that starts with it."""
    line = next(line for line in out.splitlines() if line.startswith(label))
    return line[len(label):].split()


def test_plan_table_shows_three_schemes_and_the_breakdown(capsys) -> None:
    rc, out, err = _run(capsys, "plan")
    assert rc == 0 and err == ""
    plan = plan_capacity("nemotron-h-8b")
    for label in ("state pages per request", "Mamba state per request", "attention KV per request (context 8192)",
                  "total per request", "max concurrent requests", "vLLM native", "vLLM ReplaySSM", "ssmstate",
                  "legend:", "context length of 8192 tokens", "- model weights", "- runtime reserve",
                  "x gpu-utilization 0.9", "= request state + attention KV"):
        assert label in out
    assert plan.vllm_replayssm is not None
    assert _row(out, "max concurrent requests") == [
        str(plan.native.max_concurrency), str(plan.vllm_replayssm.max_concurrency), str(plan.replay.max_concurrency)]
    assert f"{plan.concurrency_ratio:.2f}x the requests" in out and "3.66x smaller" in out
    assert "MiB" in out and "GiB" in out


def test_plan_wording_where_replay_is_larger(capsys) -> None:
    """At K=0 the replay page (one checkpoint plus rings) is larger than the one native page."""
    rc, out, _ = _run(capsys, "plan", "-k", "0")
    plan = plan_capacity("nemotron-h-8b", num_speculative_tokens=0)
    assert rc == 0 and plan.mamba_bytes_ratio < 1
    assert f"{1 / plan.mamba_bytes_ratio:.2f}x larger per request" in out and "smaller" not in out


def test_vllm_replayssm_column_is_na_past_its_window(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "-k", "16")
    assert rc == 0 and _row(out, "max concurrent requests")[1] == "n/a"
    assert "it needs 1 + K <= W <= 16" in out


def test_plan_json_is_the_plan(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--gpu", "B200", "--tp", "2", "-k", "4", "--max-model-len", "4096", "--json")
    assert rc == 0
    got = json.loads(out)
    want = plan_capacity("nemotron-h-8b", gpu="B200", tp_size=2, num_speculative_tokens=4, max_model_len=4096)
    assert got == json.loads(json.dumps(want.to_dict()))
    assert got["native"]["pages_per_request"] == 5 and got["replay"]["pages_per_request"] == 1
    # every term of the breakdown is in the JSON and adds up
    assert got["budget_bytes"] == got["requested_bytes"] - got["weights"]["total_bytes"] - got["reserve"]["total_bytes"]
    assert got["weights"]["weight_dtype"] == "bf16" and sum(got["weights"]["bytes_per_part"].values()) == \
        got["weights"]["total_bytes"]
    r = got["reserve"]
    assert r["total_bytes"] == max(r["activation_bytes"], r["sampler_bytes"]) + r["non_torch_bytes"] + \
        r["cuda_graph_bytes"]


def test_plan_weight_and_reserve_flags(capsys) -> None:
    def budget(*argv: str) -> int:
        rc, out, err = _run(capsys, "plan", "--json", *argv)
        assert rc == 0, err
        return json.loads(out)["budget_bytes"]

    bf16, fp8, nvfp4 = (budget("--weight-dtype", d) for d in ("bf16", "fp8", "nvfp4"))
    assert bf16 < fp8 < nvfp4
    assert budget("--enforce-eager") == bf16 + (512 << 20)
    assert budget("--weights-memory", "15GiB", "--reserve-memory", "3GiB") == \
        plan_capacity("nemotron-h-8b").requested_bytes - (18 << 30)
    assert budget("--kv-cache-memory", "100GiB") == 100 << 30


def test_plan_no_attention_and_dtypes(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--no-attention", "--state-dtype", "bf16", "--gpu-memory", "80GiB", "--json")
    assert rc == 0
    got = json.loads(out)
    assert got["count_attention"] is False and got["replay"]["attention_bytes_per_request"] == 0
    assert got["geometry"]["state_dtype"] == "bfloat16" and got["gpu_memory"] == 80 << 30


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_plan_8bit_state_beside_vllm_replayssm_fp32(capsys, dtype: str) -> None:
    rc, out, _ = _run(capsys, "plan", "--state-dtype", dtype, "--gpu", "H200")
    assert rc == 0
    assert "(vLLM's built-in: float32)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ssmstate vs vLLM ReplaySSM"))
    assert "Mamba state per request 0.34x (38,486,016 B vs 112,705,536 B)" in line
    rc, out, _ = _run(capsys, "plan", "--state-dtype", dtype, "--gpu", "H200", "--json")
    d = json.loads(out)
    assert d["builtin_state_dtype"] == "float32" and d["replayssm_bytes_ratio"] <= 0.4


def test_vllm_compatible_table(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--vllm-compatible", "--kv-cache-memory", "100GiB")
    assert rc == 0
    assert "Maximum concurrency for 8192 tokens per request" in out
    cells = _row(out, "max concurrency")
    assert cells[0] == "193.94x" and cells[2] == f"{5688 / 14:.2f}x"
    assert "1056" in out and "1152" in out


def test_sweep_table_json_and_parse(capsys) -> None:
    rc, out, _ = _run(capsys, "plan", "--sweep-k", "0..8", "--no-attention")
    assert rc == 0
    all_lines = out.splitlines()
    sep = next(i for i, line in enumerate(all_lines) if line.startswith("-  "))
    lines = all_lines[sep + 1:sep + 10]
    assert [int(line.split()[0]) for line in lines] == list(range(9))
    rc, out, _ = _run(capsys, "plan", "--sweep-k", "1,3", "--json", "--vllm-compatible")
    got = json.loads(out)
    assert [p["num_speculative_tokens"] for p in got["plans"]] == [1, 3] and got["plans"][0]["vllm_native"] is not None
    assert got["not_fitting"] == {}
    assert parse_k_range("0..8") == list(range(9)) and parse_k_range("2") == [2]
    for bad in ("a..b", "", "3..1", "-1"):
        with pytest.raises(SSMStateError):
            parse_k_range(bad)


def test_sweep_reports_the_k_that_do_not_fit(capsys) -> None:
    """A budget that holds native requests up to some K: the sweep lists the rest instead of aborting."""
    rc, out, err = _run(capsys, "plan", "--kv-cache-memory", "1GiB", "--no-attention", "--sweep-k", "0..12")
    assert rc == 0, err
    fits = [k for k in range(13) if _fits(k)]
    assert 0 < len(fits) < 13
    for k in range(13):
        assert (f"K={k} does not fit" in out) == (k not in fits)
    rc, out, _ = _run(capsys, "plan", "--kv-cache-memory", "1GiB", "--no-attention", "--sweep-k", "0..12", "--json")
    got = json.loads(out)
    assert [p["num_speculative_tokens"] for p in got["plans"]] == fits
    assert sorted(map(int, got["not_fitting"])) == [k for k in range(13) if k not in fits]


def _fits(k: int) -> bool:
    from ssmstate.errors import CapacityError

    try:
        plan_capacity("nemotron-h-8b", kv_cache_memory="1GiB", count_attention=False, num_speculative_tokens=k,
                      window=16)
    except CapacityError:
        return False
    return True


def test_presets_and_gpus(capsys) -> None:
    rc, out, _ = _run(capsys, "presets")
    assert rc == 0 and all(name in out for name in preset_names())
    rc, out, _ = _run(capsys, "gpus")
    assert rc == 0 and all(name in out for name in GPUS)


@pytest.mark.parametrize("argv, message", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--gpu-memory", "10GiB"], "does not fit"),
    (["--kv-cache-memory", "10MiB"], "holds no native request"),
    (["--plot", "out.png"], "give --sweep-k too"),
    (["--sweep-k", "0..2", "--plot", "out.xyz"], "unknown file type 'xyz'"),
    (["--weights-memory", "lots"], "bad memory size"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--tp", "3"], "tp_size=3 must divide"),
    (["--gpu-memory", "80 XB"], "bad memory size"),
    (["--gpu-memory", "lots"], "bad memory size"),
    (["--gpu", "Z9000"], "unknown GPU"),
    (["--sweep-k", "x"], "bad --sweep-k"),
    (["--gpu-utilization", "1.5"], "gpu_utilization"),
    (["-k", "-1"], "num_speculative_tokens"),
    (["-k", "4", "--window", "4"], "window W=4"),
    (["--state-dtype", "int3"], "unknown dtype"),
    (["--state-dtype", "int8", "--builtin-state-dtype", "fp8"], "no 8-bit state"),
])
def test_bad_inputs_exit_2_with_one_line(capsys, argv: list[str], message: str) -> None:
    rc, out, err = _run(capsys, "plan", *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssmstate: error: ") and message in lines[0]


@pytest.mark.parametrize("config, message", [
    ([1, 2, 3], "must be a JSON object"),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*X-", "num_hidden_layers": 4}, "unknown letter(s) 'X'"),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*M-", "num_hidden_layers": 5}, "num_hidden_layers=5"),
    ({"model_type": "llama"}, "not a supported hybrid Mamba2 model"),
    ("{not json", "cannot read"),
])
def test_bad_model_files_exit_2_with_one_line(capsys, tmp_path: Path, config: object, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    rc, out, err = _run(capsys, "plan", "--model", str(path))
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssmstate: error: ") and message in lines[0], err


def test_help_and_version_do_not_import_torch() -> None:
    code = ("import sys; from ssmstate.cli import main\n"
            "for argv in (['--help'], ['--version'], ['plan', '--help']):\n"
            "    assert main(argv) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ssmstate 0.1.0" in proc.stdout and "legend:" in proc.stdout and "--weight-dtype" in proc.stdout


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
    assert not (tmp_path / "k.xyz").exists()
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
