"""The per-warp verify kernel (Gluon, ``shape="warp"``) against the PyTorch reference on the GPU: outputs, the
folded checkpoints, the ring appends, padding rows untouched, on both routes and every window length it takes.
Skipped without CUDA or Gluon."""

from __future__ import annotations

import pytest
import torch

from ssmstate.errors import ConfigError
from ssmstate.ops import reference as ref
from tests.test_triton_common import POISON, compare_verify, make_case, run_verify

if torch.cuda.is_available():  # Triton only where it runs compiled (the CPU tests import it interpreted)
    from ssmstate.ops import triton as trk
    from ssmstate.ops.triton import verify_warp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not verify_warp.HAVE_GLUON,
                                reason="needs a CUDA GPU and Gluon (Triton >= 3.6)")

NEMO = dict(H=128, G=8, P=64, N=128)
NANO = dict(H=64, G=8, P=64, N=128)


def run_warp(case: dict, **kw):
    with trk.override(shape="warp"):
        return run_verify(trk.replay_verify, case, **kw)


@pytest.mark.parametrize("geom", ["nemo", "nano"])
@pytest.mark.parametrize("T,W,route,rows,n_pad", [
    (4, 16, "mixed", 12, 3), (4, 16, "flush", 5, 1), (4, 16, "nonflush", 5, 1), (1, 16, "mixed", 6, 1),
    (2, 16, "mixed", 9, 2), (8, 16, "flush", 4, 0), (8, 24, "mixed", 9, 2), (3, 5, "mixed", 7, 1),
])
def test_warp_matches_reference(geom, T, W, route, rows, n_pad):
    gen = torch.Generator().manual_seed(T * 100 + W + rows)
    case = make_case(gen, "cuda", pages=rows + 3, W=W, T=T, rows=rows, n_pad=n_pad, route=route,
                     act_dtype=torch.bfloat16, **(NEMO if geom == "nemo" else NANO))
    got = run_warp(case)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("route", ["mixed", "flush"])
def test_warp_without_d_dt_bias_z(route):
    gen = torch.Generator().manual_seed(5)
    case = make_case(gen, "cuda", pages=10, W=16, T=4, rows=8, n_pad=1, route=route, act_dtype=torch.bfloat16,
                     extras=False, **NEMO)
    compare_verify(case, run_warp(case), run_verify(ref.replay_verify, case), out_tol=1e-2, state_tol=1e-5)


@pytest.mark.parametrize("route", ["mixed", "flush"])
def test_warp_row_cursors_and_n256(route):
    """N = 256 (eight TMA chunks), the row cursors the manager passes."""
    gen = torch.Generator().manual_seed(11)
    case = make_case(gen, "cuda", pages=12, W=16, T=4, rows=9, n_pad=1, route=route, act_dtype=torch.bfloat16,
                     H=16, G=2, P=64, N=256)
    rc = torch.stack((case["ring_start"][case["page_ids"].long()],
                      case["num_committed"][case["page_ids"].long()])).to(torch.int32).contiguous()
    got = run_warp(case, row_cursors=rc)
    want = run_verify(ref.replay_verify, case)
    compare_verify(case, got, want, out_tol=1e-2, state_tol=1e-5)


def test_warp_rejects_what_it_cannot_take():
    gen = torch.Generator().manual_seed(1)
    case = make_case(gen, "cuda", pages=6, W=16, T=4, rows=3, n_pad=0, act_dtype=torch.bfloat16,
                     state_dtype=torch.bfloat16, **NEMO)
    before = {k: v.clone() for k, v in case["state"].items()}
    with pytest.raises(ConfigError, match="per-warp"):
        run_warp(case)
    for k, v in case["state"].items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize("pdl", [False, True])
def test_warp_in_a_cuda_graph_after_a_kernel(pdl):
    """Captured in a CUDA graph behind a kernel that writes the step's x (its programs wait for it with
    ``pdl=True``), with copies of the output and the checkpoint right after; every replay from the same state
    matches the reference."""
    gen = torch.Generator().manual_seed(9)
    case = make_case(gen, "cuda", pages=40, W=16, T=4, rows=32, n_pad=2, route="mixed", act_dtype=torch.bfloat16,
                     **NEMO)
    want = run_verify(ref.replay_verify, case)
    st = {k: v.clone() for k, v in case["state"].items()}
    x_src = case["x"].clone()
    x = torch.zeros_like(x_src)
    out = torch.full_like(x, POISON)  # padding rows' tokens: never written
    out_seen, ck_seen = torch.empty_like(out), torch.empty_like(st["checkpoint"])
    args = (st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
            x, case["dt"], case["A"], case["B"], case["C"], case["page_ids"], case["cu_seqlens"], case["W"])
    with trk.override(shape="warp"):
        x.copy_(x_src)
        trk.replay_verify(*args, out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], pdl=pdl)  # compile
        torch.cuda.synchronize()
        fresh = {k: v.clone() for k, v in case["state"].items()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.copy_(x_src)
            trk.replay_verify(*args, out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], pdl=pdl)
            out_seen.copy_(out)
            ck_seen.copy_(st["checkpoint"])
    for _ in range(3):
        for k in st:
            st[k].copy_(fresh[k])
        x.zero_()
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        compare_verify(case, (dict(st, checkpoint=ck_seen), out_seen), want, out_tol=1e-2, state_tol=1e-5)
