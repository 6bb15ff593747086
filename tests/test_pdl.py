"""Programmatic dependent launch (``pdl=True``) without a GPU: where the sm_90a builds wait; the chain benchmark.

A verify launched as a programmatic dependent starts while the kernel before it (the layer's conv) still runs,
so what it reads before ``griddepcontrol.wait`` must not be that kernel's output, and it may let the next kernel
launch (``griddepcontrol.launch_dependents``) only after that wait (else a kernel two launches on could start
before the conv ends). These tests read the order off the SASS (``ACQBULK`` is the wait, ``PREEXIT`` the trigger)
of the launches the GPU heuristic makes, built by ``tools/kernel_resources.py`` in a subprocess (compiled
mode: the interpreter tests set ``TRITON_INTERPRET`` in this process); skipped where Triton's ``ptxas`` and
``cuobjdump`` are missing. The chain benchmark runs end to end under the interpreter.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

# Triton is located, not imported: importing it here, before tests/test_ops_triton.py sets TRITON_INTERPRET, would
# build its language functions for compiled mode and break every interpreted kernel in this process
_SPEC = importlib.util.find_spec("triton")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("triton is not installed", allow_module_level=True)
_BIN = os.path.join(list(_SPEC.submodule_search_locations)[0], "backends", "nvidia", "bin")
_HAVE_TOOLS = all(os.path.exists(os.path.join(_BIN, t)) for t in ("ptxas", "cuobjdump"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _builds(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "kernel_resources.py"), *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
@pytest.mark.parametrize("batch,W,config,prefetches", [
    (1, 16, None, 4), (8, 16, None, 0), (32, 16, None, 1), (64, 32, None, 1), (256, 16, None, 0),
    (32, 16, '{"shape": "ldg_stream"}', 0),
], ids=["batch1", "one-head-8", "one-head-32", "w32-ksplit", "split-streamed", "ldg"])
def test_pdl_build_waits_before_the_step_inputs(batch, W, config, prefetches):
    extra = ["--config", config] if config else []
    plain = _builds("--batch", str(batch), "--W", str(W), *extra)
    pdl = _builds("--batch", str(batch), "--W", str(W), "--pdl", *extra)
    assert len(plain) == len(pdl) >= 1
    first = pdl[0]
    # the first (or only) launch waits, then triggers; no TMA copy goes out before the wait
    assert first["waits"] >= 1 and first["triggers"] >= 1
    assert 0 <= first["wait_at"] < first["trigger_at"], "lets the next kernel launch before its own wait"
    # only the checkpoint goes out by TMA: its tile's copy before the wait in the batch-1 launch
    assert first["tma_before_wait"] == (1 if batch == 1 else 0)
    # the batch-1 launch's own prefetches (tile, x, B and dt rings) and its tile copy; the
    # first tile into L2 from 16 programs per SM in the one-head launch; nothing more elsewhere
    assert first["l2_prefetch_before_wait"] == prefetches
    if first["grid"][1] == batch:  # one program per (head, row): before the wait only the page id, the two
        # cu_seqlens and the two row cursors (a gather of x, B, C, dt or z there would read the conv's output early)
        assert first["ldg_before_wait"] == 5
    # without pdl the same launch has neither, but for SPLIT's own PDL pair (first triggers, second waits at its end)
    for p, q in zip(plain, pdl):
        if len(plain) == 1:
            assert p["waits"] == p["triggers"] == 0
        assert q["registers"] <= 255 and q["shared_bytes"] <= p["shared_bytes"]  # no second tile buffer
    if len(pdl) == 2:  # SPLIT's flush launch: unchanged (it starts once every program of the first is past its wait)
        assert (pdl[1]["wait_at"], pdl[1]["triggers"]) == (plain[1]["wait_at"], plain[1]["triggers"]) and \
            pdl[1]["triggers"] == 0


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
@pytest.mark.parametrize("state_dtype", ["float32", "int8"])
def test_one_head_verify_loads_go_out_together(state_dtype):
    """``LATE`` (the one-head launch): the program's C, x and B rows (and an 8-bit checkpoint's decode scales) go
    out in one run of loads before its tile's copy, with no barrier between them. The compiler places the
    shared-memory store that feeds a loaded tensor to a product right after its load, and that store waits for
    the load: without ``LATE`` (the table's launch) the rows go out one round trip after another."""
    late = _builds("--batch", "8", "--state-dtype", state_dtype, "--config", '{"LATE": 1}')
    early = _builds("--batch", "8", "--state-dtype", state_dtype, "--config", '{"LATE": 0}')
    assert late[0]["load_rounds_before_tile"] == 1
    assert early[0]["load_rounds_before_tile"] >= 3


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
def test_per_warp_kernel_builds_without_spills_and_waits_before_the_step_inputs():
    """The per-warp kernel (Gluon, ``shape="warp"``): its sm_90a build holds no spill, and with ``pdl=True`` only
    the page id, the two cu_seqlens, the two row cursors and the tile's four column-chunk copies go out before the
    wait, which comes before the trigger."""
    (plain,) = _builds("--batch", "4", "--config", '{"shape": "warp"}')
    (pdl,) = _builds("--batch", "4", "--pdl", "--config", '{"shape": "warp"}')
    assert plain["kernel"] == pdl["kernel"] == "verify_warp_kernel"
    assert plain["local"] == plain["stack"] == 0 and plain["waits"] == plain["triggers"] == 0
    assert pdl["waits"] >= 1 and 0 <= pdl["wait_at"] < pdl["trigger_at"]
    assert pdl["tma_before_wait"] == 4 and pdl["ldg_before_wait"] == 5
    assert pdl["HMMA"] > 0 and pdl["HGMMA"] == 0  # every product an mma.sync of one warp's rows


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
@pytest.mark.parametrize("T,W", [(4, 16), (8, 24)])
def test_per_warp_fused_layer_builds_without_spills_and_waits_before_the_step_inputs(T, W):
    """The fused layer on the per-warp kernel (``shape="warp"``, always a programmatic dependent): its sm_90a build
    holds no spill, and before its wait only the page id, the two cu_seqlens, the two row cursors, the row's conv
    shift and the tile's four column-chunk copies go out (the conv's reads of xBC and the window come after)."""
    (row,) = _builds("--fused", "--batch", "4", "--T", str(T), "--W", str(W), "--pdl", "--config",
                     '{"shape": "warp"}')
    assert row["kernel"] == "verify_warp_kernel"
    assert row["local"] == row["stack"] == 0
    assert row["waits"] >= 1 and 0 <= row["wait_at"] < row["trigger_at"]
    assert row["tma_before_wait"] == 4 and row["ldg_before_wait"] == 6
    assert row["HMMA"] > 0 and row["HGMMA"] == 0


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
@pytest.mark.parametrize("batch,config,loads", [(4, '{"shape": "warp"}', 41), (32, '{"shape": "one_head"}', 43),
                                                (4, '{"shape": "ldg"}', 70), (64, '{"shape": "ldg_stream"}', 55)],
                         ids=["per-warp", "tma-one-head", "portable", "portable-streamed"])
def test_sequence_rows_load_as_16_byte_vectors(batch, config, loads):
    """Each sequence row (a ring's or the step's, picked per position) loads as 16-byte vectors: the kernels state
    the rows' alignment, which the compiler cannot derive through the pick (Triton 3.8 and later load them element
    by element without it: 104, 85, 126 and 111 global loads here under Triton 3.8 instead of 41, 43, 70 and 55)."""
    (row,) = _builds("--batch", str(batch), "--config", config)
    assert row["LDG"] <= loads


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
def test_fused_layer_conv_loads_go_out_in_one_round_trip():
    """The fused layer on the TMA kernel at batch 1 (the launch the decode step takes there): after its PDL wait,
    every load before its first product (x, B and C conv taps, weights, biases, rings) goes out in one run, with
    no barrier between them. From Triton 3.7 its gather placement (``GATHER``: 1) sends the conv's loads one round
    trip after another (28 runs under Triton 3.8 and 3.9), which is why the launch takes selects there."""
    (row,) = _builds("--fused", "--batch", "1", "--pdl")
    assert row["kernel"] == "verify_tma_kernel" and row["load_rounds_before_products"] == 1
    assert row["ldg_before_wait"] == 6 and row["tma_before_wait"] == 1
    (selects,) = _builds("--fused", "--batch", "1", "--pdl", "--config", '{"GATHER": 0}')
    assert selects["load_rounds_before_products"] == 1 and selects["local"] == 0
    version = tuple(int(v) for v in re.findall(r"\d+", importlib.metadata.version("triton"))[:2])
    if version >= (3, 7):
        (gather,) = _builds("--fused", "--batch", "1", "--pdl", "--config", '{"GATHER": 1}')
        assert gather["load_rounds_before_products"] > 10


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
@pytest.mark.parametrize("args,kernel", [
    (("--arch", "80", "--batch", "1", "--pdl"), "verify_ldg_kernel"),
    (("--arch", "80", "--batch", "256", "--state-dtype", "int8"), "verify_ldg_kernel"),
    (("--arch", "89", "--batch", "64", "--state-dtype", "float8_e4m3fn"), "verify_ldg_kernel"),
    (("--arch", "80", "--conv", "--batch", "4", "--pdl"), "_conv_update_kernel"),
    (("--arch", "80", "--fused", "--batch", "1", "--pdl"), "conv_verify_kernel"),
], ids=["a100-verify-pdl", "a100-int8", "l40s-fp8", "a100-conv-pdl", "a100-fused-pdl"])
def test_gpus_before_hopper_build_the_portable_kernels_without_pdl(args, kernel):
    """On a GPU before compute capability 9.0 (an A100's sm_80, an L40S's sm_89) the launches the heuristic makes
    are the portable kernels, built without a programmatic-dependent wait or trigger even where ``pdl=True`` was
    asked for (the TMA kernel's build aborts the process there)."""
    (row,) = _builds(*args, "--sms", "108", "--gbps-per-sm", "18.9")
    assert row["kernel"] == kernel
    assert row["waits"] == row["triggers"] == 0 and row["local"] == 0


@pytest.mark.skipif(not _HAVE_TOOLS, reason="Triton's ptxas / cuobjdump not installed")
def test_kernel_resources_lists_shared_buffers():
    """``--allocs``: the one-head launch's shared-memory buffers, read off its TTGIR. The checkpoint tile (64 x 128
    fp32, 32 KB) is one of them, and the build's shared memory holds at least the largest."""
    (row,) = _builds("--batch", "32", "--allocs")
    allocs = row["shared_allocs"]
    assert {"shape": "64x128", "dtype": "f32", "bytes": 32768} in allocs
    assert all(a["bytes"] > 0 for a in allocs)
    assert row["shared_bytes"] >= max(a["bytes"] for a in allocs)


def test_layer_chain_benchmark_smoke(tmp_path):
    """``benchmarks/bench_layer_chain.py --cpu-smoke``: the whole script (conv and verify chains with and without
    pdl, a launch override timed in the PDL chain) under the interpreter at toy sizes, its JSON holding every chain
    it times."""
    out = tmp_path / "chain.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_layer_chain.py"), "--cpu-smoke",
                          "--batches", "1", "--reps", "1", "--out", str(out), "--pdl-configs", '[{"shape": "base"}]'],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    row = json.loads(out.read_text())["rows"][0]
    for scen in ("nonflush", "mixed"):
        for k in ("conv", "conv_pdl", "ours", "ours_pdl", "ours_verify", "ours_pdl_cfg0"):
            assert row[f"{scen}_{k}_us"] > 0
        assert row[f"{scen}_ours_pdl_verify_share_us"] == row[f"{scen}_ours_pdl_us"] - row[f"{scen}_conv_pdl_us"]
