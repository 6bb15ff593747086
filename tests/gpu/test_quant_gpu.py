"""Quantized and stochastically rounded checkpoints on the GPU: the compiled Triton verify and materialize against
the reference at Nemotron-H geometry (H=128, P=64, N=128, G=8, bf16 inputs), every launch shape, and (where
FlashInfer is installed) FlashInfer's int8/fp8 ``checkpointing_ssu`` on the same bytes. Skipped without CUDA.

Tolerances (tests/quant_common.py says why bytes may move): the kernels' fold runs in tf32 pieces (3xTF32 or a
split x side), so a flushed value may sit one grid step plus FOLD_TOL of its row's magnitude from the reference's
(near zero the fp8 and 16-bit grids are fine, so that can be many codes) and a scale FOLD_TOL plus the divisions'
rounding from it (the scale is amax / QMAX, amax one of those values); where the fold is exact (a history of
dt = 0) the bytes and scales are the reference's bit for bit. FlashInfer folds with bf16 operands: 2e-2.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    from ssmstate.ops import triton as trk

from tests.quant_common import (
    LAYER, VARIANTS, assert_matches, assert_stored_close, materialize, quant_case, reference_materialize,
    reference_verify, run, value_excess,
)
from tests.test_triton_common import POISON, rel

DEV = "cuda"
#: the compiled fold's rounding, relative to a row's largest value (tf32 pieces; a cancelling fold loses more)
FOLD_TOL = 1e-4
NEMO = dict(H=128, G=8, P=64, N=128, act_dtype=torch.bfloat16)
#: every named launch shape besides the heuristic's, whole-tile and chunked folds, TMA stores (int8 and fp8)
SHAPES = [dict(shape="latency", FOLD_N=128, TMA_STORE=1), dict(shape="one_head"),
          dict(shape="pipelined", TMA_STORE=1), dict(shape="split", PROGS=2, maxnreg=0), dict(shape="ldg_stream"),
          dict(shape="ldg", FOLD_N=128, maxnreg=0), dict(shape="latency", BLOCK_S=8, FOLD_N=128, TMA_STORE=1),
          dict(shape="one_head", BLOCK_S=8), dict(shape="split", BLOCK_S=8, PROGS=4, maxnreg=128),
          dict(shape="ldg", BLOCK_S=8)]
#: each rounding variant: the heuristic's launch (one head per program at this batch), the split launches, LDG
FAMILIES = [None, dict(shape="split"), dict(shape="ldg")]


def launch_id(c) -> str:
    return "heuristic" if c is None else "-".join(f"{k}={v}" for k, v in c.items())


def vid(v) -> str:
    return f"{str(v[0]).removeprefix('torch.')}{'-sr' if v[1] else ''}"


@pytest.mark.parametrize("variant", VARIANTS, ids=vid)
@pytest.mark.parametrize("cfg", FAMILIES, ids=launch_id)
def test_verify_quantized_gpu(variant, cfg):
    check_verify(variant, cfg)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("cfg", SHAPES, ids=launch_id)
def test_verify_quantized_shapes_gpu(dtype, cfg):
    check_verify((dtype, False), cfg)


def check_verify(variant, cfg) -> None:
    dtype, sr = variant
    case = quant_case(5, dtype, sr, device=DEV, qs=(4, 3, 4, 1, 2, 4, 4, 3, 2), **NEMO)
    with trk.override(**(cfg or {})):
        got = run(trk.replay_verify, case)
    assert_matches(case, got, run(reference_verify, case), exact=False, out_tol=1e-2, fold_tol=FOLD_TOL)


@pytest.mark.parametrize("variant", VARIANTS, ids=vid)
@pytest.mark.parametrize("cfg", [None, dict(shape="ldg")], ids=launch_id)
def test_verify_flush_bytes_exact_gpu(variant, cfg):
    dtype, sr = variant
    case = quant_case(6, dtype, sr, device=DEV, exact_fold=True, qs=(4, 3, 4, 1, 2, 4, 4, 3, 2), **NEMO)
    with trk.override(**(cfg or {})):
        got = run(trk.replay_verify, case)
    assert_matches(case, got, run(reference_verify, case), exact=True, out_tol=1e-2)


@pytest.mark.parametrize("rows,dtype", [(64, torch.int8), (256, torch.float8_e4m3fn)])
def test_verify_quantized_large_batch_gpu(rows, dtype):
    """The heuristic's split launches at the benchmark's batches, mixed routes."""
    qs = tuple(4 - (r % 3) for r in range(rows))
    case = quant_case(7, dtype, False, device=DEV, qs=qs, **NEMO)
    got = run(trk.replay_verify, case)
    assert_matches(case, got, run(reference_verify, case), exact=False, out_tol=1e-2, fold_tol=FOLD_TOL)


@pytest.mark.parametrize("variant", VARIANTS, ids=vid)
@pytest.mark.parametrize("exact", [False, True])
def test_materialize_quantized_gpu(variant, exact):
    dtype, sr = variant
    case = quant_case(8, dtype, sr, device=DEV, exact_fold=exact, qs=(4, 3, 4, 1, 2), **NEMO)
    pages = torch.tensor([0, *case["page_ids"].tolist()[:3]], dtype=torch.int32, device=DEV)
    (st_g, sc_g), (st_w, sc_w) = (materialize(fn, case, pages) for fn in (trk.replay_materialize,
                                                                            reference_materialize))
    assert_stored_close(st_g["checkpoint"], sc_g, st_w["checkpoint"], sc_w, exact=exact, fold_tol=FOLD_TOL)


def test_e4m3_codes_as_bf16_exact_gpu():
    """The readout's e4m3 decode (f16, f32, then the f32's upper half) gives every one of the 256 codes exactly,
    as torch converts them: ±0, subnormals, ±448, NaN stays NaN."""
    import triton
    import triton.language as tl

    from ssmstate.ops.triton.quant import e4m3_as_bf16

    @triton.jit
    def decode(src, dst):
        o = tl.arange(0, 256)
        tl.store(dst + o, e4m3_as_bf16(tl.load(src + o)))

    raw = torch.arange(256, dtype=torch.int32, device=DEV).to(torch.uint8)
    got = torch.empty(256, dtype=torch.bfloat16, device=DEV)
    decode[(1,)](raw, got)
    want = raw.view(torch.float8_e4m3fn).to(torch.bfloat16)
    nan = want.isnan()
    assert nan.sum() == 2 and got[nan].isnan().all()
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))  # bits: -0 stays -0


def test_quantized_verify_in_cuda_graph():
    """A verify on an int8 checkpoint with stochastic rounding captured once and replayed: the seed is read on the
    device, so a replay after the seed moved writes the bytes of the new seed."""
    case = quant_case(14, torch.int8, True, device=DEV, qs=(4, 3, 4, 1, 2), **NEMO)  # 2 of 4 rows flush
    st = {k: v.clone() for k, v in case["state"].items()}
    scale = case["scale"].clone()
    seed = case["sr_seed"].clone()
    out = torch.full(case["x"].shape, POISON, dtype=case["x"].dtype, device=DEV)  # padding tokens: never written
    from tests.test_triton_common import verify_args
    args = verify_args(case, st)
    kw = dict(D=case["D"], dt_bias=case["dt_bias"], z=case["z"], checkpoint_scale=scale, sr_seed=seed, layer=LAYER)
    snap = {k: v.clone() for k, v in st.items()}, scale.clone()  # before any run: a flush rewrites the checkpoint
    trk.replay_verify(*args, out, **kw)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        trk.replay_verify(*args, out, **kw)
    for s in (41, 42):
        for k, v in snap[0].items():
            st[k].copy_(v)
        scale.copy_(snap[1])
        seed.fill_(s)
        graph.replay()
        torch.cuda.synchronize()
        want = run(reference_verify, dict(case, sr_seed=seed.clone()))
        assert_matches(case, (st, scale, out), want, exact=False, out_tol=1e-2, fold_tol=FOLD_TOL)


# -- FlashInfer's 8-bit checkpointing_ssu on the same bytes -------------------------------------------------------


def _flashinfer():
    try:
        import flashinfer.mamba as fim
    except Exception:  # absent, or a broken install
        pytest.skip("flashinfer is not installed")
    return fim


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_flashinfer_8bit_matches_triton(dtype):
    """FlashInfer's int8/fp8 checkpointing_ssu and ours on the same codes and scales: the same outputs (bf16
    rounding) and the same written checkpoint and scales, each value within a grid step plus 2e-2 of its row
    (FlashInfer folds with bf16 operands)."""
    fim = _flashinfer()
    qs = (4, 4, 4, 4, 4, 4, 4, 4)  # dense: every row has T tokens
    case = quant_case(10, dtype, False, device=DEV, qs=qs, W=16, **NEMO)
    for k in ("dt", "D", "dt_bias"):  # FlashInfer's build of bench_verify_quant.py --warm: bf16 dt, D and dt_bias
        case[k] = case[k].to(torch.bfloat16)
    got = run(trk.replay_verify, case)
    st = {k: v.clone() for k, v in case["state"].items()}
    scale = case["scale"].clone()
    out = torch.empty_like(case["x"])
    H, P, N = NEMO["H"], NEMO["P"], NEMO["N"]
    rows, T = len(qs), 4
    A3 = case["A"].view(H, 1, 1).expand(H, P, N)
    dtv = case["dt"].view(rows, T, H).unsqueeze(-1).expand(rows, T, H, P)
    fim.checkpointing_ssu(
        st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
        case["x"].view(rows, T, H, P), dtv, A3, case["B"].view(rows, T, 8, N), case["C"].view(rows, T, 8, N),
        out.view(rows, T, H, P), D=case["D"].view(H, 1).expand(H, P), z=case["z"].view(rows, T, H, P),
        dt_bias=case["dt_bias"].view(H, 1).expand(H, P), dt_softplus=True, state_batch_indices=case["page_ids"],
        pad_slot_id=0, state_scale=scale, algorithm="monolith")
    st_g, sc_g, out_g = got
    real = [r for r, p in enumerate(case["page_ids"].tolist()) if p]
    tok = torch.cat([torch.arange(r * T, (r + 1) * T) for r in real])
    assert rel(out[tok], out_g[tok]) <= 2e-2
    fl = case["flushed"]
    excess = value_excess(st["checkpoint"][fl], scale[fl], st_g["checkpoint"][fl], sc_g[fl])
    assert excess <= 2e-2, f"FlashInfer's value beyond a grid step + {excess:.3g} of its row from ours"
    assert float(((scale[fl] - sc_g[fl]).abs() / sc_g[fl].abs()).max()) <= 1e-2


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_manager_8bit_schedule_gpu(backend, dtype):
    """A backend's manager against the reference's on an 8-bit pool at Nemotron-H geometry: ragged and dense steps,
    commits, a rollback, materialize, preempt and resume; outputs to bf16 rounding, checkpoint values within two
    grid steps of the reference's (one step carried from an earlier write; FlashInfer: plus its bf16-operand fold),
    read states close."""
    if backend == "flashinfer":
        _flashinfer()
    from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
    from ssmstate.layout import SCALE_NAME

    g = Mamba2Geometry(num_heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4, num_layers=1,
                       state_dtype=dtype, act_dtype=torch.bfloat16)
    W, T, rows = 16, 4, 5
    layout = PageLayout.replay(g, SpecConfig(T - 1, window=W))
    mb = StateManager(layout, 8, device=DEV, backend=backend, max_batch=rows)
    mr = StateManager(layout, 8, device=DEV, backend="reference", max_batch=rows)
    gen = torch.Generator().manual_seed(4)
    H, P, N, G, Dc = 128, 64, 128, 8, g.conv_dim_per_rank
    A = -(torch.rand(H, generator=gen) + 0.3).cuda()
    # bf16 dt, D and dt_bias: FlashInfer's build of bench_verify_quant.py --warm (each dtype set is a JIT build)
    D = torch.randn(H, generator=gen).to(torch.bfloat16).cuda()
    dtb = (torch.randn(H, generator=gen) * 0.3).to(torch.bfloat16).cuda()
    ids = [f"r{i}" for i in range(rows)]
    for rid in ids:
        S = torch.randn(H, P, N, generator=gen).cuda() * 0.3
        for m in (mb, mr):
            m.admit(rid)
            m.write_state(rid, 0, S)
            m.bind_layer(0, A)
    # a value a grid step apart seeds later differences (a step's worth of state carried into the next fold): one
    # more step of the row's grid (int8: 1/127 of the row; e4m3: up to 32/448), plus FlashInfer's bf16-operand fold
    drift = (1.0 / 127 if dtype == "int8" else 32.0 / 448) + (2e-2 if backend == "flashinfer" else FOLD_TOL)
    for step, (qs, acc) in enumerate([([4] * 5, [4, 1, 2, 4, 3]), ([4, 2, 4, 1, 3], [2, 2, 0, 1, 3]),
                                      ([4] * 5, None), ([4] * 5, [4, 4, 4, 4, 4]), ([4] * 5, [1, 2, 3, 4, 0]),
                                      ([3, 4, 4, 4, 2], [3, 4, 1, 2, 2])]):
        plans = [m.begin_step(ids, qs) for m in (mb, mr)]
        L = plans[0].total_tokens
        x = torch.randn(L, H, P, generator=gen).to(torch.bfloat16).cuda()
        B = (torch.randn(L, G, N, generator=gen) * 0.3).to(torch.bfloat16).cuda()
        C = (torch.randn(L, G, N, generator=gen) * 0.3).to(torch.bfloat16).cuda()
        dt = (torch.randn(L, H, generator=gen) * 0.5 - 0.5).to(torch.bfloat16).cuda()
        outs = [m.verify(0, p, x, dt, B, C, A, D=D, dt_bias=dtb) for m, p in zip((mb, mr), plans)]
        assert rel(outs[0], outs[1]) < 2e-2, f"step {step} output"
        for m, p in zip((mb, mr), plans):
            if acc is None:
                m.rollback(p)
            else:
                m.commit(p, acc)
        if step == 2:
            for m in (mb, mr):
                m.materialize(ids[:2])
        if step == 3:
            for m in (mb, mr):
                m.resume("r2", m.preempt("r2"))
        assert torch.equal(mb.cache.cursors, mr.cache.cursors)
        a, b = mb.cache.layers[0], mr.cache.layers[0]
        excess = value_excess(a["checkpoint"], a[SCALE_NAME], b["checkpoint"], b[SCALE_NAME])
        assert excess <= drift, f"step {step} checkpoint: {excess:.3g} of a row beyond a grid step"
        assert float(((a[SCALE_NAME] - b[SCALE_NAME]).abs() / b[SCALE_NAME].abs()).max()) <= 1e-2
        for rid in ids:
            assert rel(mb.read_state(rid, 0), mr.read_state(rid, 0)) < 2e-2
