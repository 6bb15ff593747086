"""The Triton ops against the PyTorch reference on CPU, under the Triton interpreter.

Random pools and cursors (both routes, padding rows, acceptance 0 and q,
non-power-of-two P and N, W up to 32, T up to 8, fp32/bf16 state,
fp32/bf16/fp16 inputs) — outputs, checkpoint, rings, conv window and cursors
compared, for the heuristic's launch and every named launch shape (chosen with
``ssmstate.ops.triton.override``). Also: no host sync inside verify/commit.
The backend and manager level is tests/test_backend_triton.py; the launch
choice itself tests/test_launch_config.py.

TRITON_INTERPRET=1 must be set before Triton's kernels are decorated; the
module sets it, or skips when a compiled-mode import already happened (or a
GPU is present without the variable: tests/gpu/test_triton_gpu.py covers it).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the Triton backend is tested compiled in tests/gpu/", allow_module_level=True)
if "ssmstate.ops.triton.common" in sys.modules and not sys.modules["ssmstate.ops.triton.common"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ssmstate.errors import ConfigError  # noqa: E402
from ssmstate.layout import conv_spec  # noqa: E402
from ssmstate.ops import reference as ref  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402
from tests.test_triton_common import (  # noqa: E402
    compare_verify, make_case, other_cursors, rel, run_verify, verify_args,
)

# No shrinking: the interpreter is slow and a failing example is reported as drawn.
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                phases=[Phase.explicit, Phase.reuse, Phase.generate])
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 4e-3}


def run_launch(case: dict, launch: dict | None = None, **kw):
    """:func:`run_verify` of the Triton verify under the launch override ``launch`` (None: the heuristic's)."""
    with ot.override(**(launch or {})):
        return run_verify(ot.replay_verify, case, **kw)


@st.composite
def verify_cases(draw):
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    T = draw(st.integers(1, 8))
    W = draw(st.integers(T, 32))
    rows = draw(st.integers(1, 3))
    return dict(
        H=H, G=G, P=draw(st.sampled_from([16, 8, 24])), N=draw(st.sampled_from([16, 32, 24])), W=W, T=T,
        rows=rows + 1, n_pad=draw(st.integers(0, 1)) if rows > 1 else 1,
        route=draw(st.sampled_from(["mixed", "flush", "nonflush"])),
        state_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16])),
        act_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16])),
        extras=draw(st.booleans()),
        config=draw(st.sampled_from([None, {"BLOCK_P": 16, "FOLD_N": 16}, {"shape": "ldg", "HPP": 1, "FOLD_N": 8},
                                     {"shape": "ldg_stream", "HPP": 1, "NC": 8}, {"BLOCK_S": 8},
                                     {"shape": "ldg", "HPP": 1, "BLOCK_S": 8}])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40, **SETTINGS)
@given(verify_cases())
@example(dict(H=2, G=1, P=16, N=16, W=32, T=8, rows=3, n_pad=1, route="flush", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=True, config={"BLOCK_P": 16, "FOLD_N": 16}, seed=1))
@example(dict(H=2, G=2, P=24, N=24, W=32, T=8, rows=2, n_pad=0, route="nonflush", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=True, config=None, seed=2))
@example(dict(H=4, G=2, P=16, N=32, W=4, T=4, rows=3, n_pad=1, route="mixed", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=False, config=None, seed=3))
@example(dict(H=4, G=2, P=16, N=32, W=6, T=3, rows=3, n_pad=1, route="mixed", state_dtype=torch.float32,
              act_dtype=torch.bfloat16, extras=True, config={"shape": "split", "BLOCK_S": 8}, seed=4))
@example(dict(H=2, G=1, P=32, N=16, W=8, T=4, rows=2, n_pad=1, route="mixed", state_dtype=torch.float32,
              act_dtype=torch.float32, extras=True, config={"shape": "base", "BLOCK_S": 8}, seed=6))
@example(dict(H=2, G=1, P=24, N=16, W=5, T=5, rows=2, n_pad=0, route="flush", state_dtype=torch.bfloat16,
              act_dtype=torch.float32, extras=True, config={"shape": "ldg", "HPP": 1, "BLOCK_S": 8}, seed=5))
def test_verify_matches_reference(c):
    gen = torch.Generator().manual_seed(c["seed"])
    case = make_case(gen, "cpu", pages=c["rows"] + 2, H=c["H"], G=c["G"], P=c["P"], N=c["N"], W=c["W"], T=c["T"],
                     rows=c["rows"], n_pad=c["n_pad"], state_dtype=c["state_dtype"], act_dtype=c["act_dtype"],
                     extras=c["extras"], route=c["route"])
    got = run_launch(case, c["config"])
    want = run_verify(ref.replay_verify, case)
    state_tol = TOL[torch.float32] if c["state_dtype"] == torch.float32 else TOL[c["state_dtype"]]
    compare_verify(case, got, want, out_tol=TOL[c["act_dtype"]], state_tol=state_tol)


#: the portable kernel's launches: heads per program (HPP divides the 4 heads per group below; 1 on the GPU), P and
#: N tiles, whole-tile or streamed readout
GROUP_CONFIGS = [{"shape": "ldg", "HPP": 1}, {"shape": "ldg", "HPP": 2, "BLOCK_P": 16, "FOLD_N": 16},
                 {"shape": "ldg", "HPP": 1, "BLOCK_P": 8, "FOLD_N": 8}, {"shape": "ldg", "FOLD_N": 32},
                 {"shape": "ldg_stream", "HPP": 1, "NC": 16}, {"shape": "ldg_stream", "HPP": 2, "NC": 16},
                 {"shape": "ldg_stream", "NC": 8, "BLOCK_P": 8}]


@pytest.mark.parametrize("cfg", GROUP_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("route,state_dtype,act_dtype,P,N", [
    ("flush", torch.float32, torch.float32, 24, 24), ("mixed", torch.bfloat16, torch.bfloat16, 16, 32),
    ("mixed", torch.float32, torch.float16, 16, 32),
])
def test_verify_group_configs(cfg, route, state_dtype, act_dtype, P, N):
    """The portable kernel's launches against the reference: head chunks, P tiles, streamed / whole-tile readout,
    fold chunks."""
    gen = torch.Generator().manual_seed(P + N)
    case = make_case(gen, "cpu", pages=7, H=8, G=2, P=P, N=N, W=12, T=3, rows=5, n_pad=1, route=route,
                     state_dtype=state_dtype, act_dtype=act_dtype)
    got = run_launch(case, cfg)
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act_dtype],
                   state_tol=TOL[torch.float32] if state_dtype == torch.float32 else TOL[state_dtype])


def assert_configs_refused(case, refusals, err=ConfigError):
    """Each ``(launch, match)`` in ``refusals`` makes ``replay_verify`` under that launch override raise ``err``
    matching ``match``, and none of them changes the case's state or the output buffer."""
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    for cfg, match in refusals:
        with pytest.raises(err, match=match), ot.override(**cfg):
            ot.replay_verify(*verify_args(case), out)
    assert all(torch.equal(before[k], case["state"][k]) for k in before) and bool((out == 7.0).all())


def test_verify_rejects_bad_config():
    case = make_case(torch.Generator().manual_seed(0), "cpu", pages=4, H=2, G=1, P=16, N=16, W=8, T=2, rows=2, n_pad=0)
    assert_configs_refused(case, (({"READOUT": "dot"}, "unknown launch override keys"),
                                  ({"shape": "wgmma"}, "unknown launch shape"),
                                  ({"shape": "ldg_stream", "NC": 12}, "power of two"),
                                  ({"shape": "ldg", "HPP": 3}, "must divide"), ({"shape": "ldg", "HPP": 0}, "divide"),
                                  ({"L2PF": 2}, "unknown launch override keys"), ({"HEADS": 3}, "HEADS must divide"),
                                  ({"HEADS": 0}, "HEADS must divide"), ({"HEADS": 2.5}, "HEADS must be an int"),
                                  ({"FOLD_N": 0}, "FOLD_N must be a power of two"),
                                  ({"FOLD_N": 12}, "FOLD_N must be a power of two"),
                                  ({"shape": "ldg", "BLOCK_P": 24}, "BLOCK_P must be a power of two"),
                                  ({"shape": "split", "PROGS": 0}, "PROGS must be >= 1"),
                                  ({"KSPLIT": 2}, "KSPLIT must be 0 or 1"), ({"TMA_STORE": True}, "must be an int"),
                                  ({"shape": "ldg", "HEADS": 1}, "do not apply to the LDG kernel"),
                                  ({"shape": "base", "NC": 16}, "do not apply to the TMA kernel")))


@pytest.mark.parametrize("route", ["flush", "nonflush"])
def test_verify_each_route_and_full_rows(route):
    """Every row of one route, every row of length T (acceptance of the whole window follows)."""
    gen = torch.Generator().manual_seed(7)
    T = 4
    case = make_case(gen, "cpu", pages=6, H=2, G=1, P=16, N=16, W=8, T=T, rows=4, n_pad=1, route=route,
                     qs=[T] * 4)
    flushed = [int(case["num_committed"][p]) + T > 8 for p in case["page_ids"].tolist() if p]
    assert all(flushed) if route == "flush" else not any(flushed)
    compare_verify(case, run_launch(case), run_verify(ref.replay_verify, case),
                   out_tol=2e-5, state_tol=2e-5)


@settings(max_examples=40, **SETTINGS)
@given(st.integers(0, 2**16), st.integers(1, 8), st.integers(0, 24), st.booleans(), st.booleans(), st.booleans())
def test_commit_matches_reference(seed, T, extra_w, bad, short_counts, update_conv):
    gen = torch.Generator().manual_seed(seed)
    W = T + extra_w
    R, pages, rows = W + T, 12, 6
    cur = torch.stack([
        torch.randint(0, R, (pages,), generator=gen), torch.randint(0, W + 1, (pages,), generator=gen),
        torch.randint(1, T + 1, (pages,), generator=gen), torch.randint(0, T + 1, (pages,), generator=gen),
    ]).to(torch.int32)
    ids = (torch.randperm(pages - 1, generator=gen)[:rows] + 1).to(torch.int32)
    ids[-1] = 0
    q = cur[2][ids.long()]
    acc = (torch.rand(rows, generator=gen) * (q + 1).float()).floor().to(torch.int32)
    acc[0] = 0
    acc[1] = q[1]  # acceptance 0 and q
    if bad:
        acc[2] = q[2] + 1 if seed % 2 else -1
    n_acc = rows - 1 if short_counts else rows  # the last row is padding: the counts may stop before it
    c1, c2 = cur.clone(), cur.clone()
    e1, e2 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    ref.replay_commit(c1[0], c1[1], c1[2], c1[3], ids, acc[:n_acc].clone(), W, R, update_conv, e1)
    ot.replay_commit(c2[0], c2[1], c2[2], c2[3], ids, acc[:n_acc].clone(), W, R, update_conv, e2)
    assert torch.equal(c1, c2)
    assert int(e1) == int(e2) == int(bad)
    assert torch.equal(c2[:, 0], cur[:, 0]), "page 0 cursors were written"


@pytest.mark.parametrize("bad", [False, True])
def test_commit_batch_wider_than_one_block(bad):
    """More rows than one commit block (1024): the chunked path checks the whole batch before moving cursors."""
    gen = torch.Generator().manual_seed(1)
    pages, rows, W, T = 1300, 1100, 16, 4
    R = W + T
    cur = torch.stack([
        torch.randint(0, R, (pages,), generator=gen), torch.randint(0, W + 1, (pages,), generator=gen),
        torch.randint(1, T + 1, (pages,), generator=gen), torch.randint(0, T + 1, (pages,), generator=gen),
    ]).to(torch.int32)
    ids = (torch.randperm(pages - 1, generator=gen)[:rows] + 1).to(torch.int32)
    ids[-3:] = 0
    q = cur[2][ids.long()]
    acc = (torch.rand(rows, generator=gen) * (q + 1).float()).floor().to(torch.int32)
    if bad:
        acc[1050] = q[1050] + 1  # in the second block: the first block must not commit either
    c1, c2 = cur.clone(), cur.clone()
    e1, e2 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    ref.replay_commit_torch(c1[0], c1[1], c1[2], c1[3], ids, acc, W, R, True, e1)
    ot.replay_commit(c2[0], c2[1], c2[2], c2[3], ids, acc, W, R, True, e2)
    assert torch.equal(c1, c2) and int(e1) == int(e2) == int(bad)


@settings(max_examples=12, **SETTINGS)
@given(st.integers(0, 2**16), st.sampled_from([(16, 16), (24, 32), (8, 24)]), st.integers(1, 8))
def test_materialize_matches_reference(seed, PN, T):
    gen = torch.Generator().manual_seed(seed)
    P, N = PN
    case = make_case(gen, "cpu", pages=6, H=2, G=1, P=P, N=N, W=T + 8, T=T, rows=4, n_pad=1)
    check_materialize(case, 2e-5)


def check_materialize(case: dict, tol: float) -> None:
    """Materialize ``case``'s pages with both backends on copies of its state: the checkpoints agree within ``tol``
    in the state's dtype, the rings are left as they were, and padding page 0 stays zero."""
    a = {k: v.clone() for k, v in case["state"].items()}
    b = {k: v.clone() for k, v in case["state"].items()}
    args = (case["ring_start"], case["num_committed"], case["A"], case["page_ids"])
    ref.replay_materialize(a["checkpoint"], a["x_ring"], a["B_ring"], a["dt_ring"], *args)
    ot.replay_materialize(b["checkpoint"], b["x_ring"], b["B_ring"], b["dt_ring"], *args)
    assert b["checkpoint"].dtype == case["state"]["checkpoint"].dtype
    assert rel(b["checkpoint"], a["checkpoint"]) < tol
    for name in ("x_ring", "B_ring", "dt_ring"):
        assert torch.equal(b[name], case["state"][name])
    assert bool((b["checkpoint"][0] == 0).all())


@pytest.mark.parametrize("kernel", ["tma", "ldg"])
@pytest.mark.parametrize("state_dtype", [torch.float16, torch.bfloat16])
def test_half_precision_states(kernel, state_dtype):
    """fp16 and bf16 checkpoints on both kernels: a mixed verify (both routes in one launch, the flush rows' folded
    checkpoint rounded to the state dtype) and a materialize, against the reference on the same pages."""
    gen = torch.Generator().manual_seed(2)  # two of the four rows flush
    case = make_case(gen, "cpu", pages=7, H=4, G=2, P=16, N=32, W=10, T=3, rows=5, n_pad=1, route="mixed",
                     state_dtype=state_dtype, act_dtype=torch.float16 if state_dtype == torch.float16 else
                     torch.bfloat16)
    flushes = [int(case["num_committed"][p]) + q > case["W"] for p, q in zip(case["page_ids"].tolist(), case["qs"]) if p]
    assert any(flushes) and not all(flushes), "the case must hold both routes"
    act = case["x"].dtype
    got = run_launch(case, {"shape": "base" if kernel == "tma" else "ldg"})
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act], state_tol=TOL[state_dtype])
    assert case["state"]["checkpoint"].dtype == state_dtype
    check_materialize(case, TOL[state_dtype])


@settings(max_examples=20, **SETTINGS)
@given(st.integers(0, 2**16), st.integers(2, 4), st.integers(1, 8), st.sampled_from([torch.float32, torch.bfloat16]),
       st.booleans(), st.sampled_from(["silu", None]), st.booleans(), st.sampled_from([16, 64]))
def test_conv_matches_reference(seed, k, T, dtype, with_bias, activation, channels_last, block_d):
    """Any storage order of the window (the layout's channel-contiguous one, or columns contiguous) and programs
    of one or several blocks of channels: the window's bytes as the reference's, the outputs to rounding."""
    gen = torch.Generator().manual_seed(seed)
    pages, Dc, rows = 7, 40, 5
    width = k - 1 + T
    win = torch.randn(pages, Dc, width, generator=gen).to(dtype)
    if channels_last:  # the layout's order
        win = conv_spec(Dc, width, dtype).zeros(pages, "cpu").copy_(win)
    win[0] = 0
    shift = torch.randint(0, T + 1, (pages,), generator=gen, dtype=torch.int32)
    qs = torch.randint(1, T + 1, (rows,), generator=gen).tolist()
    cu = torch.tensor([0] + torch.tensor(qs).cumsum(0).tolist(), dtype=torch.int32)
    ids = torch.tensor([3, 1, 0, 5, 6], dtype=torch.int32)
    L = sum(qs)
    xbc = torch.randn(L, Dc, generator=gen).to(dtype)
    w = torch.randn(Dc, k, generator=gen)
    bias = torch.randn(Dc, generator=gen) if with_bias else None
    w1, w2 = win.clone(), win.clone()
    o1 = torch.full((L, Dc), 7.0).to(dtype)
    o2 = o1.clone()
    ref.conv_update(w1, shift, xbc, w, bias, ids, cu, o1, activation=activation)
    with ot.override(conv={"BLOCK_D": block_d}):
        ot.conv_update(w2, shift, xbc, w, bias, ids, cu, o2, activation=activation)
    assert torch.equal(w1, w2)
    assert rel(o2, o1) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert bool((o2[cu[2]:cu[3]] == 7.0).all()), "a padding row's conv output was written"


# -- contract: no host sync, errors -----------------------------------------------------------


def test_verify_and_commit_never_sync(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    case = make_case(gen, "cpu", pages=5, H=2, G=1, P=16, N=16, W=8, T=4, rows=3, n_pad=1)

    def boom(*a, **k):
        raise AssertionError("host sync inside a Triton wrapper")

    monkeypatch.setattr(torch.Tensor, "tolist", boom)
    monkeypatch.setattr(torch.Tensor, "item", boom)
    monkeypatch.setattr(torch.Tensor, "__bool__", boom)
    monkeypatch.setattr(torch.Tensor, "__int__", boom)
    st_ = {k: v.clone() for k, v in case["state"].items()}
    out = torch.zeros_like(case["x"])
    ot.replay_verify(st_["checkpoint"], st_["x_ring"], st_["B_ring"], st_["dt_ring"], case["ring_start"],
                      case["num_committed"], case["x"], case["dt"], case["A"], case["B"], case["C"],
                      case["page_ids"], case["cu_seqlens"], case["W"], out)
    cur = torch.zeros(4, 5, dtype=torch.int32)
    ot.replay_commit(cur[0], cur[1], cur[2], cur[3], case["page_ids"], torch.zeros(3, dtype=torch.int32),
                      8, 12, True, torch.zeros(1, dtype=torch.int32))


# -- the TMA kernel's named launch shapes (run in the interpreter through a host TensorDescriptor) ------------


@pytest.mark.parametrize("cfg", [{"shape": "base"}, {"shape": "base", "BLOCK_P": 16}, {"shape": "base", "FOLD_N": 8},
                                 {"shape": "latency", "BLOCK_P": 16, "FOLD_N": 16},
                                 {"shape": "latency", "BLOCK_P": 16, "LATE": 1},
                                 {"shape": "split", "BLOCK_P": 16, "LATE": 1},
                                 {"shape": "pipelined", "HEADS": 2}, {"shape": "pipelined", "BLOCK_P": 16, "HEADS": 2},
                                 {"shape": "pipelined", "HEADS": 2, "FOLD_N": 8},
                                 {"shape": "one_head", "BLOCK_P": 16}, {"shape": "base", "KSPLIT": 1},
                                 {"shape": "one_head_long_ring", "BLOCK_P": 16, "FOLD_N": 8},
                                 {"shape": "pipelined", "HEADS": 2, "KSPLIT": 1}],
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("route,state_dtype,act_dtype,T,W", [
    ("flush", torch.float32, torch.float32, 4, 12), ("mixed", torch.float32, torch.bfloat16, 3, 9),
    ("nonflush", torch.bfloat16, torch.bfloat16, 8, 24), ("mixed", torch.float32, torch.float16, 1, 5),
])
def test_tma_kernel_configs(cfg, route, state_dtype, act_dtype, T, W):
    """The TMA kernel's launch shapes against the reference: P tiles, fold chunks, both routes, dtypes, T and W."""
    gen = torch.Generator().manual_seed(T * 31 + W)
    case = make_case(gen, "cpu", pages=7, H=4, G=2, P=32, N=32, W=W, T=T, rows=5, n_pad=1, route=route,
                     state_dtype=state_dtype, act_dtype=act_dtype)
    got = run_launch(case, cfg)
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[act_dtype],
                   state_tol=TOL[torch.float32] if state_dtype == torch.float32 else TOL[state_dtype])


@pytest.mark.parametrize("W,T", [(16, 4), (14, 3), (32, 4)])
@pytest.mark.parametrize("route", ["mixed", "flush", "nonflush"])
def test_tma_ksplit(W, T, route):
    """``KSPLIT``: where the ring's sequence tile (``pow2(R)`` rows) is longer than a non-flush row can use
    (``pow2(W)``: ``c + q <= W``), non-flush rows take the short tile; in one launch by a branch on the route, in
    the split non-flush launch as its only build. Against the reference, on both routes, with and without row
    cursors."""
    gen = torch.Generator().manual_seed(W * 10 + T)
    case = make_case(gen, "cpu", pages=8, H=8, G=2, P=16, N=32, W=W, T=T, rows=5, n_pad=1, route=route,
                     act_dtype=torch.bfloat16)
    assert max(16, 1 << (W - 1).bit_length()) < max(16, 1 << (case["R"] - 1).bit_length())  # the short tile applies
    want = run_verify(ref.replay_verify, case)
    p = case["page_ids"].long()
    rc = torch.stack((case["ring_start"][p], case["num_committed"][p]))
    for cfg, cursors in (({"shape": "one_head_long_ring"}, None), ({"shape": "one_head_long_ring"}, rc),
                         ({"shape": "pipelined", "HEADS": 2, "KSPLIT": 1, "FOLD_N": 8}, None),
                         ({"shape": "split", "PROGS": 3}, rc), ({"shape": "split", "PROGS": 5}, None)):
        got = run_launch(case, cfg, row_cursors=cursors)
        compare_verify(case, got, want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


def test_tma_long_ring_register_cap():
    """A capped launch holding a sequence tile over 32 rows takes at least 128 registers (ptxas built a faulting
    kernel at 104): a lower cap is a ConfigError that changes nothing; 128, 0, a short ring and the split launch's
    short-tile non-flush launch (KSPLIT) are accepted and agree with the reference."""
    gen = torch.Generator().manual_seed(32)
    case = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=32, T=4, rows=3, n_pad=1, route="mixed",
                     act_dtype=torch.bfloat16)
    assert_configs_refused(case, ((bad, "maxnreg .* is below 128 on a ring of 36 rows") for bad in (
        {"shape": "base", "maxnreg": 104}, {"shape": "one_head_long_ring", "maxnreg": 96},
        {"shape": "split", "KSPLIT": 0, "maxnreg": 120})))
    want = run_verify(ref.replay_verify, case)
    for ok in ({"shape": "one_head_long_ring"}, {"shape": "base", "maxnreg": 0}, {"shape": "split", "maxnreg": 96}):
        compare_verify(case, run_launch(case, ok), want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])
    short = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=16, T=4, rows=3, n_pad=1, route="mixed",
                      act_dtype=torch.bfloat16)
    compare_verify(short, run_launch(short, {"shape": "one_head"}), run_verify(ref.replay_verify, short),
                   out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


def test_tma_pipelined_group_heads():
    """The GPU heuristic's long-grid launch (a group's 16 heads per program, 2 stages, flush rows folded in one
    product; FOLD_N 8: folded chunk by chunk) against the reference: flush, non-flush and padding rows in one
    launch, two programs per group, two P tiles per head."""
    gen = torch.Generator().manual_seed(9)
    case = make_case(gen, "cpu", pages=6, H=64, G=2, P=32, N=32, W=12, T=4, rows=4, n_pad=1, route="mixed",
                     act_dtype=torch.bfloat16)
    flush = [int(case["num_committed"][p]) + int(case["cu_seqlens"][i + 1] - case["cu_seqlens"][i]) > case["W"]
             for i, p in enumerate(case["page_ids"].tolist()) if p != 0]
    assert any(flush) and not all(flush)  # the case holds both routes
    want = run_verify(ref.replay_verify, case)
    for cfg in ({"shape": "pipelined", "BLOCK_P": 16, "FOLD_N": 32},
                {"shape": "pipelined", "BLOCK_P": 16, "FOLD_N": 8}):
        compare_verify(case, run_launch(case, cfg), want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


@pytest.mark.parametrize("route", ["mixed", "flush", "nonflush"])
def test_tma_split_launch(route):
    """The split launches: non-flush rows in one persistent launch, flush rows in another, each ranking its route's
    rows on the device and giving each program an equal contiguous share of the (row, P tile, head) items (shares
    start and end mid-group and mid-row; more items than programs). Padding rows and empty routes included. Against
    the reference, outputs and state."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, "cpu", pages=9, H=16, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route=route,
                     act_dtype=torch.bfloat16)
    want = run_verify(ref.replay_verify, case)
    for cfg in ({"shape": "split", "BLOCK_P": 16, "PROGS": 5}, {"shape": "split", "BLOCK_P": 32, "PROGS": 3},
                {"shape": "split", "BLOCK_P": 16, "PROGS": 7, "maxnreg": 0, "FOLD_N": 8},
                {"shape": "split", "BLOCK_P": 32, "PROGS": 7, "KSPLIT": 0}):
        compare_verify(case, run_launch(case, cfg), want, out_tol=TOL[torch.bfloat16], state_tol=TOL[torch.float32])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("route", ["mixed", "flush"])
def test_tma_store(route, state_dtype):
    """``TMA_STORE``: a flush row's new checkpoint leaves by a TMA bulk store from shared memory, in every launch
    that folds whole tiles (the split flush launch, the one-head and multi-head launches with ``FOLD_N`` >= N);
    outputs and state as the reference's. A launch folding in column chunks refuses it, changing nothing."""
    gen = torch.Generator().manual_seed(17)
    case = make_case(gen, "cpu", pages=9, H=8, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route=route,
                     state_dtype=state_dtype, act_dtype=torch.bfloat16)
    want = run_verify(ref.replay_verify, case)
    for cfg in ({"shape": "split", "BLOCK_P": 16, "PROGS": 3}, {"shape": "latency", "BLOCK_P": 16, "FOLD_N": 32},
                {"shape": "pipelined", "BLOCK_P": 16, "HEADS": 4, "FOLD_N": 32}):
        compare_verify(case, run_launch(case, {**cfg, "TMA_STORE": 1}), want, out_tol=TOL[torch.bfloat16],
                       state_tol=TOL[state_dtype])
    assert_configs_refused(case, (({"shape": "base", "FOLD_N": 16, "TMA_STORE": 1}, "TMA_STORE needs"),))


@pytest.mark.parametrize("shape", ["base", "ldg", "one_head"])
def test_verify_never_reads_stale_ring_rows(shape):
    """Ring rows outside a row's history hold inf (x, B) and 1e30 (dt): no output or state may see them."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, "cpu", pages=6, H=4, G=2, P=16, N=32, W=8, T=3, rows=4, n_pad=1, route="mixed")
    st, R = case["state"], case["R"]
    for p in case["page_ids"].tolist():
        if p == 0:
            continue
        rs, c = int(case["ring_start"][p]), int(case["num_committed"][p])
        stale = [r for r in range(R) if (r - rs) % R >= c]
        st["x_ring"][p][:, stale] = float("inf")
        st["B_ring"][p][:, stale] = float("inf")
        st["dt_ring"][p][:, stale] = 1e30
    got = run_launch(case, {"shape": shape})
    assert bool(torch.isfinite(got[1]).all()) and bool(torch.isfinite(got[0]["checkpoint"]).all())
    compare_verify(case, got, run_verify(ref.replay_verify, case), out_tol=TOL[torch.float32],
                   state_tol=TOL[torch.float32])


def test_tma_kernel_rejects_what_it_cannot_run():
    """Clear errors, nothing touched: a TMA shape on a geometry it cannot read, an unknown shape."""
    case = make_case(torch.Generator().manual_seed(1), "cpu", pages=4, H=2, G=1, P=24, N=16, W=8, T=2, rows=2,
                     n_pad=0)
    assert_configs_refused(case, (({"shape": "base"}, "TMA verify kernel needs"),
                                  ({"shape": "wgmma"}, "unknown launch shape")), err=ValueError)


# -- row cursors (StepPlan.row_cursors) ---------------------------------------------------------


@pytest.mark.parametrize("cfg", [
    {"shape": "base"}, {"shape": "one_head", "BLOCK_P": 16}, {"shape": "pipelined", "HEADS": 2},
    {"shape": "split", "BLOCK_P": 16, "PROGS": 3}, {"shape": "split", "BLOCK_P": 16, "PROGS": 5, "KSPLIT": 0},
    {"shape": "latency", "BLOCK_P": 16, "KSPLIT": 1}, {"shape": "ldg"},
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_verify_reads_row_cursors(cfg):
    """With ``row_cursors`` the TMA kernel takes each row's cursors (its route, its history, where it appends) from
    them, not from its page: here they hold a valid cursor state the pages do not, and the result must be the
    reference's on pages holding that state (one-head, pipelined, persistent flush launch, streamed launches with
    their route ranking). The LDG kernel reads the pages' cursors either way."""
    gen = torch.Generator().manual_seed(23)
    case = make_case(gen, "cpu", pages=9, H=8, G=2, P=32, N=32, W=12, T=4, rows=6, n_pad=2, route="mixed",
                     act_dtype=torch.bfloat16)
    other, rc = other_cursors(case, 5)
    p = case["page_ids"].long()
    assert not torch.equal(rc[1], case["num_committed"][p])
    flush = (rc[1] + torch.tensor(case["qs"]) > case["W"]) & (p != 0)
    assert bool(flush.any()) and not bool(flush[p != 0].all())  # both routes under the row cursors
    got = run_launch(case, cfg, row_cursors=rc)
    ref_case = case if cfg["shape"] == "ldg" else other
    compare_verify(ref_case, got, run_verify(ref.replay_verify, ref_case), out_tol=TOL[torch.bfloat16],
                   state_tol=TOL[torch.float32])


def test_row_cursors_refusals():
    """A wrong ``row_cursors`` tensor is a ShapeError in both functions; a stale one (a page's cursor moved since the
    gather) is a LifecycleError in the reference, which checks them. Nothing is written either way."""
    from ssmstate.errors import LifecycleError, ShapeError
    case = make_case(torch.Generator().manual_seed(3), "cpu", pages=6, H=2, G=1, P=16, N=16, W=8, T=2, rows=3,
                     n_pad=1)
    before = {k: v.clone() for k, v in case["state"].items()}
    out = torch.full_like(case["x"], 7.0)
    p = case["page_ids"].long()
    good = torch.stack((case["ring_start"][p], case["num_committed"][p]))
    for bad in (good[:, :2], good.t().contiguous(), good.long(), good[0], [[0, 0, 0], [0, 0, 0]]):
        for fn in (ot.replay_verify, ref.replay_verify):
            with pytest.raises(ShapeError, match="^row_cursors (must be|has|is on)"):
                fn(*verify_args(case), out, row_cursors=bad)
    stale = good.clone()
    stale[1, 1] += 1
    with pytest.raises(LifecycleError, match="row 1 .* stale|stale: row 1"):
        ref.replay_verify(*verify_args(case), out, row_cursors=stale)
    padded = good.clone()
    padded[:, 2] = 5  # a padding row's entry is never read
    ref.replay_verify(*verify_args(case, {k: v.clone() for k, v in before.items()}), torch.zeros_like(out),
                      row_cursors=padded)
    assert all(torch.equal(before[k], case["state"][k]) for k in before)
    assert bool((out == 7.0).all())




def test_conv_row_shift_is_read_and_checked():
    """With the step's gathered shifts (``row_shift``) the kernel reads them instead of the cursor: the same bytes as
    the reference; a stale one is a LifecycleError in the reference, a wrong tensor a ShapeError in both."""
    from ssmstate.errors import LifecycleError, ShapeError

    gen = torch.Generator().manual_seed(3)
    pages, Dc, k, T = 6, 24, 4, 3
    win = torch.randn(pages, k - 1 + T, Dc, generator=gen).transpose(1, 2)
    shift = torch.tensor([0, 2, 0, 3, 1, 2], dtype=torch.int32)
    ids = torch.tensor([4, 0, 1, 3], dtype=torch.int32)
    cu = torch.tensor([0, 3, 5, 6, 8], dtype=torch.int32)
    xbc, w = torch.randn(8, Dc, generator=gen), torch.randn(Dc, k, generator=gen)
    gathered = torch.zeros(4, 4, dtype=torch.int32)  # strided, as the plan's view of the gathered cursors
    row_shift = gathered[:, 3]
    row_shift.copy_(shift[ids.long()])
    row_shift[1] = 99  # a padding row's value is never read
    outs = []
    for fn in (ref.conv_update, ot.conv_update):
        wn, o = win.clone(), torch.zeros(8, Dc)
        fn(wn, shift, xbc, w, None, ids, cu, o, row_shift=row_shift)
        outs.append((wn, o))
    assert torch.equal(outs[0][0], outs[1][0]) and rel(outs[1][1], outs[0][1]) < 1e-5
    wn = win.clone()
    ot.conv_update(wn, torch.zeros_like(shift), xbc, w, None, ids, cu, torch.zeros(8, Dc), row_shift=row_shift)
    assert torch.equal(wn, outs[0][0]), "the kernel read the page cursor, not the row's gathered shift"
    stale = row_shift.clone()
    stale[2] += 1
    before = win.clone()
    with pytest.raises(LifecycleError, match="stale"):
        ref.conv_update(win, shift, xbc, w, None, ids, cu, torch.zeros(8, Dc), row_shift=stale)
    assert torch.equal(win, before)
    for fn in (ref.conv_update, ot.conv_update):
        with pytest.raises(ShapeError, match="row_shift"):
            fn(win, shift, xbc, w, None, ids, cu, torch.zeros(8, Dc), row_shift=row_shift[:3])
    assert torch.equal(win, before)


def test_conv_output_in_place():
    """``out`` may be ``xBC`` itself (as in the reference): the window keeps the tokens, not the outputs."""
    gen = torch.Generator().manual_seed(5)
    pages, Dc, k, T = 5, 24, 4, 3
    win = torch.randn(pages, k - 1 + T, Dc, generator=gen).transpose(1, 2)
    shift = torch.tensor([0, 1, 3, 0, 2], dtype=torch.int32)
    ids = torch.tensor([2, 0, 4, 1], dtype=torch.int32)
    cu = torch.tensor([0, 3, 4, 6, 9], dtype=torch.int32)
    xbc, w, b = torch.randn(9, Dc, generator=gen), torch.randn(Dc, k, generator=gen), torch.randn(Dc, generator=gen)
    res = []
    for fn in (ref.conv_update, ot.conv_update):
        wn, x = win.clone(), xbc.clone()
        fn(wn, shift, x, w, b, ids, cu, x)
        res.append((wn, x))
    sep = win.clone()
    ref.conv_update(sep, shift, xbc.clone(), w, b, ids, cu, torch.zeros(9, Dc))
    assert torch.equal(res[0][0], sep) and torch.equal(res[1][0], sep)
    assert rel(res[1][1], res[0][1]) < 1e-5
