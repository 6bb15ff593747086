"""Triton verify and materialize on quantized and stochastically rounded checkpoints against the reference, in the
Triton interpreter: int8 and fp8_e4m3fn checkpoints with their (pages, H, P) decode scales, bf16/fp16 with
stochastic rounding, both verify kernels and their launch shapes (chosen with ``ssmstate.ops.triton.override``),
flush and non-flush rows mixed in one batch, padding rows.

What is bit-exact and what is not: the kernels quantize a fold ``S1`` they compute themselves (fp32 dots in another
order than the reference's einsum; tf32 on the GPU), so where ``S1`` differs in its last bits a code may land one
step from the reference's (|Δq| <= 1, the next representable value) and a scale a few ulps off; outputs agree to fp32
rounding. Where the fold is exact (a history of dt = 0: ``S1 = dequant(S0)``), the stored bytes and scales are the
reference's bit for bit, stochastic rounding included. The quantization helpers alone are bit-exact on any tile
(tests/test_quant_triton.py).
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

from ssmstate.errors import ConfigError, ShapeError  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402
from tests.quant_common import (  # noqa: E402
    VARIANTS, assert_matches, assert_stored_close, code_steps, materialize, quant_case, reference_materialize,
    reference_verify, run,
)
from tests.test_triton_common import verify_args  # noqa: E402

#: launch overrides: both kernels, whole-tile and chunked folds (two passes over N), split, pipelined, TMA store
LAUNCHES = [{"shape": "ldg", "HPP": 1, "FOLD_N": 8}, {"shape": "ldg_stream", "HPP": 1, "NC": 8}, {"shape": "base"},
            {"shape": "base", "FOLD_N": 16}, {"shape": "split", "FOLD_N": 16}, {"shape": "pipelined", "HEADS": 2},
            {"shape": "split", "PROGS": 2, "maxnreg": 0, "TMA_STORE": 1}, {"shape": "split", "BLOCK_S": 8},
            {"shape": "ldg", "HPP": 1, "BLOCK_S": 8}]

def launch_id(c: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in c.items())


#: every launch for int8 and fp8, an LDG and a chunked TMA fold for the stochastically rounded variants
CASES = ([(*v, c) for v in VARIANTS[:2] for c in LAUNCHES]
         + [(*v, c) for v in VARIANTS[2:] for c in (LAUNCHES[0], LAUNCHES[3])])


@pytest.mark.parametrize("dtype,sr,launch", CASES, ids=[f"{d}-{'sr' if s else 'rn'}-{launch_id(c)}"
                                                         for d, s, c in CASES])
def test_verify_quantized_matches_reference(dtype, sr, launch):
    case = quant_case(1, dtype, sr)
    with ot.override(**launch):
        got = run(ot.replay_verify, case)
    assert_matches(case, got, run(reference_verify, case), exact=False)


@pytest.mark.parametrize("dtype,sr", VARIANTS)
@pytest.mark.parametrize("launch", [LAUNCHES[0], LAUNCHES[3]], ids=launch_id)
def test_verify_flush_bytes_exact_when_the_fold_is(dtype, sr, launch):
    """A history of dt = 0 makes ``S1 = dequant(S0)`` in both: the requantized bytes and scales are identical."""
    case = quant_case(2, dtype, sr, exact_fold=True)
    with ot.override(**launch):
        got = run(ot.replay_verify, case)
    assert_matches(case, got, run(reference_verify, case), exact=True)


@pytest.mark.parametrize("dtype,sr,exact", [(*v, True) for v in VARIANTS] + [(*v, False) for v in VARIANTS[:2]])
def test_materialize_quantized(dtype, sr, exact):
    case = quant_case(3, dtype, sr, exact_fold=exact, P=24, N=24)  # tails: masked rows and columns
    pages = torch.tensor([0, *case["page_ids"].tolist()[:3]], dtype=torch.int32)
    (st_g, sc_g), (st_w, sc_w) = (materialize(fn, case, pages) for fn in (ot.replay_materialize,
                                                                            reference_materialize))
    if not exact:  # interpreted: the fold's rounding moves a code by at most one step
        assert int(code_steps(st_g["checkpoint"], st_w["checkpoint"]).max()) <= 1
    assert_stored_close(st_g["checkpoint"], sc_g, st_w["checkpoint"], sc_w, exact=exact)


@pytest.mark.parametrize("dtype,sr", [(torch.float8_e4m3fn, False), (torch.float16, True)], ids=str)
def test_materialize_negative_zero_one_row(dtype, sr):
    """Stored -0 values folded over one committed row of dt = 0: kernel and reference store the same bytes (+0)."""
    case = quant_case(3, dtype, sr, exact_fold=True, P=24, N=24)
    page = case["page_ids"].tolist()[0]
    case["num_committed"][page] = 1
    ck = case["state"]["checkpoint"]
    raw = ck.view(torch.uint8 if ck.element_size() == 1 else torch.int16)
    raw[page, :, :2] = 0x80 if ck.element_size() == 1 else -0x8000  # -0 in two head-dim rows of every head
    pages = torch.tensor([page], dtype=torch.int32)
    res = [materialize(fn, case, pages)[0]["checkpoint"][page].view(raw.dtype)
           for fn in (ot.replay_materialize, reference_materialize)]
    assert torch.equal(res[0], res[1]), f"{int((res[0] != res[1]).sum())} stored values differ"


def test_quantized_arguments_refused():
    case = quant_case(4, torch.int8, False)
    out = torch.empty_like(case["x"])
    args = verify_args(case)
    with pytest.raises(ShapeError, match="needs its checkpoint_scale"):
        ot.replay_verify(*args, out)
    with pytest.raises(ShapeError, match="checkpoint_scale must be"):
        ot.replay_verify(*args, out, checkpoint_scale=case["scale"][:, :, :8])
    fp32 = dict(case, state=dict(case["state"], checkpoint=case["state"]["checkpoint"].float()))
    with pytest.raises(ShapeError, match="only for int8/fp8"):
        ot.replay_verify(*verify_args(fp32), out, checkpoint_scale=case["scale"])
    with pytest.raises(ConfigError, match="stochastic rounding needs"):
        ot.replay_verify(*verify_args(fp32), out, sr_seed=torch.tensor([1]))
    with pytest.raises(ShapeError, match="sr_seed must be one int64"):
        ot.replay_verify(*args, out, checkpoint_scale=case["scale"], sr_seed=torch.tensor([1], dtype=torch.int32))
