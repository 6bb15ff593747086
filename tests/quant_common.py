"""Shared helpers of the quantized-checkpoint kernel tests (CPU interpreter: tests/test_ops_quant_triton.py; GPU:
tests/gpu/test_quant_gpu.py). Holds no tests.

A case is :func:`tests.test_triton_common.make_case`'s random pool and step with its checkpoint stored as an 8-bit
(codes and scales) or 16-bit checkpoint through the reference quantization; both the reference and the kernel run
on copies and every tensor they may touch is compared.
"""

from __future__ import annotations

import torch

from ssmstate.ops import quant
from ssmstate.ops import reference as ref
from tests.test_triton_common import POISON, make_case, rel, verify_args

#: (checkpoint dtype, stochastic rounding)
VARIANTS = [(torch.int8, False), (torch.float8_e4m3fn, False), (torch.int8, True), (torch.float8_e4m3fn, True),
            (torch.bfloat16, True), (torch.float16, True)]
LAYER = 1  # 1: a kernel argument Triton would specialise into a constant unless told not to


def quant_case(seed: int, dtype: torch.dtype, sr: bool, *, device: str = "cpu", exact_fold: bool = False,
               H: int = 4, G: int = 2, P: int = 16, N: int = 32, W: int = 8, T: int = 4,
               qs: tuple[int, ...] = (4, 3, 4, 1, 2), act_dtype: torch.dtype = torch.float32) -> dict:
    """A mixed flush / non-flush case (the last row padding) whose checkpoint is stored as ``dtype`` through the
    reference quantization (codes and scales for 8-bit ones; rows of magnitudes 1e-3 .. 1e3); ``sr``: the step
    writes with stochastic rounding; ``exact_fold``: every history dt is 0, so a fold returns the decoded
    checkpoint exactly."""
    gen = torch.Generator().manual_seed(seed)
    pages = len(qs) + 2
    case = make_case(gen, device, pages=pages, H=H, G=G, P=P, N=N, W=W, T=T, rows=len(qs), n_pad=1,
                     route="mixed", qs=list(qs), act_dtype=act_dtype)
    mag = 10.0 ** torch.randint(-3, 4, (pages, H, P, 1), generator=gen).float()
    S = case["state"]["checkpoint"] * mag.to(device)
    seed0 = torch.tensor([11], dtype=torch.int64, device=device) if sr else None
    stored, scale = quant.quantize(S, dtype, seed=seed0, layer=LAYER, pages=torch.arange(pages, device=device))
    case["state"]["checkpoint"] = stored
    case["scale"] = scale
    case["sr_seed"] = torch.tensor([0x5EED0000ABCD], dtype=torch.int64, device=device) if sr else None
    if exact_fold:
        case["state"]["dt_ring"].zero_()
    real = [p for p in case["page_ids"].tolist() if p]
    flushed = [p for p, q in zip(case["page_ids"].tolist(), case["qs"]) if p and int(case["num_committed"][p]) + q > W]
    assert flushed and len(flushed) < len(real), "the case mixes flush and non-flush rows"
    case["flushed"] = flushed
    return case


def run(fn, case: dict, **kw) -> tuple[dict, torch.Tensor | None, torch.Tensor]:
    """``fn`` (a verify) on copies of the case's tensors: (cache tensors, scales, outputs)."""
    st = {k: v.clone() for k, v in case["state"].items()}
    scale = None if case["scale"] is None else case["scale"].clone()
    out = torch.full(case["x"].shape, POISON, dtype=case["x"].dtype, device=case["x"].device)
    fn(*verify_args(case, st), out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], checkpoint_scale=scale,
       sr_seed=case["sr_seed"], layer=LAYER, **kw)
    return st, scale, out


def materialize(fn, case: dict, pages: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """``fn`` (a materialize) of ``pages`` ((n,) int32, 0 = padding) on copies of the case's tensors: (cache tensors,
    scales)."""
    st = {k: v.clone() for k, v in case["state"].items()}
    scale = None if case["scale"] is None else case["scale"].clone()
    fn(st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
       case["A"], pages, window=case["W"], checkpoint_scale=scale, sr_seed=case["sr_seed"], layer=LAYER)
    return st, scale


def reference_verify(*args, **kw):
    return ref.replay_verify(*args, **kw)


def reference_materialize(*args, **kw):
    return ref.replay_materialize(*args, **kw)


def code_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable values apart two stored tensors are, elementwise (same-sign codes are ordered by
    their magnitude bits; a sign flip around zero counts the codes on both sides)."""
    width = {1: torch.int8, 2: torch.int16}[a.element_size()]
    if a.dtype == torch.int8:
        return (a.int() - b.int()).abs()
    bits = {1: 0x7F, 2: 0x7FFF}[a.element_size()]
    sign = {1: 0x80, 2: 0x8000}[a.element_size()]

    def ordered(t: torch.Tensor) -> torch.Tensor:
        raw = t.view(width).int() & (bits | sign)
        mag = raw & bits
        return torch.where((raw & sign) != 0, -mag, mag)

    return (ordered(a) - ordered(b)).abs()


def grid_step(stored: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """fp64, elementwise: the spacing of the stored grid at each value of a stored checkpoint (int8: the row's
    scale; e4m3: its 3-bit mantissa step, 2^-9 below 2^-6, times the scale; bf16 / fp16: one ulp)."""
    dt = stored.dtype
    if dt == torch.int8:
        return scale.double().unsqueeze(-1).expand(stored.shape)
    code = stored.double()
    _, e = torch.frexp(code)
    if dt == torch.float8_e4m3fn:
        return torch.pow(2.0, torch.clamp(e - 1, min=-6) - 3) * scale.double().unsqueeze(-1)
    mbits, emin = (7, -126) if dt == torch.bfloat16 else (10, -14)
    return torch.pow(2.0, torch.clamp(e - 1, min=emin) - mbits)


def value_excess(got: torch.Tensor, got_scale, want: torch.Tensor, want_scale) -> float:
    """How far two stored checkpoints' values are apart beyond one grid step of ``want``, relative to the row's
    largest value: 0 when every value is within a step. A fold computed in another order (or precision) moves a
    value by a small fraction of its row's magnitude, which near zero can be many fine steps (fp8 and 16-bit grids
    are finer there), so differences are measured in value, not in codes."""
    a, b = (quant.dequantize(t, s).double() for t, s in ((got, got_scale), (want, want_scale)))
    excess = ((a - b).abs() - grid_step(want, want_scale)).clamp(min=0)
    return float((excess / (b.abs().amax(-1, keepdim=True) + 1e-30)).max())


#: an fp32 fold in another order, relative to its row's largest value: a few ulps (interpreted kernels)
FOLD_TOL_CPU = 1e-6


def scale_tol(fold_tol: float) -> float:
    """Relative bound on two scales of one row whose folds differ by ``fold_tol`` of the row's magnitude: the scale
    is amax / QMAX and amax is one of the row's fold values, so it moves by ``fold_tol`` of itself, plus the
    rounding of the two fp32 divisions (QMAX / amax, 1 / enc) on either side (4 half-ulps, 2^-21 with room)."""
    return fold_tol + 2.0 ** -21


def assert_scales_close(got: torch.Tensor, want: torch.Tensor, fold_tol: float) -> None:
    """Scales (any shape, fp32) of rows whose folds differ by up to ``fold_tol``: within :func:`scale_tol`."""
    err = float(((got - want).abs() / want.abs()).max())
    assert err <= scale_tol(fold_tol), f"a scale {err:.3g} (relative) from the reference's: beyond its fold's rounding"


def assert_stored_close(ck_g: torch.Tensor, sc_g: torch.Tensor | None, ck_w: torch.Tensor, sc_w: torch.Tensor | None,
                        *, exact: bool, moved: float = 0.02, fold_tol: float = FOLD_TOL_CPU) -> None:
    """Stored checkpoints (and scales) written by a kernel (``_g``) and the reference (``_w``): identical bytes
    (``exact``) or every value within one grid step plus ``fold_tol`` of its row's magnitude (the fold's own
    rounding), at most a fraction ``moved`` of them stored differently, scales within :func:`scale_tol`."""
    if exact:
        assert torch.equal(ck_g.view(torch.uint8), ck_w.view(torch.uint8)), "stored bytes differ"
        if sc_g is not None:
            assert torch.equal(sc_g.view(torch.int32), sc_w.view(torch.int32)), "stored scales differ"
        return
    excess = value_excess(ck_g, sc_g, ck_w, sc_w)
    assert excess <= fold_tol, f"a stored value beyond a grid step + {excess:.3g} of its row from the reference's"
    steps = code_steps(ck_g, ck_w)
    assert float((steps != 0).float().mean()) <= moved, f"more than {moved:.0%} of the stored values differ"
    if sc_g is not None:
        assert_scales_close(sc_g, sc_w, fold_tol)


def assert_matches(case: dict, got: tuple, want: tuple, *, exact: bool, out_tol: float = 1e-5,
                   moved: float = 0.02, fold_tol: float = FOLD_TOL_CPU) -> None:
    """The kernel's result ``got`` against the reference's ``want``: outputs within ``out_tol``, rings equal,
    unflushed pages' bytes and scales untouched, flushed pages' bytes and scales identical (``exact``) or every
    value within one grid step plus ``fold_tol`` of its row's magnitude (the fold's own rounding), at most a
    fraction ``moved`` of them stored differently, scales within :func:`scale_tol` of ``fold_tol``
    (:func:`assert_stored_close`)."""
    (st_g, sc_g, out_g), (st_w, sc_w, out_w) = got, want
    assert rel(out_g, out_w) <= out_tol, f"output rel err {rel(out_g, out_w):.3g}"
    assert torch.equal(st_g["x_ring"], st_w["x_ring"]) and torch.equal(st_g["B_ring"], st_w["B_ring"])
    assert float((st_g["dt_ring"] - st_w["dt_ring"]).abs().max()) <= 1e-5
    keep = [p for p in range(st_g["checkpoint"].shape[0]) if p not in case["flushed"]]
    ck0 = case["state"]["checkpoint"]
    assert torch.equal(st_g["checkpoint"][keep].view(torch.uint8), ck0[keep].view(torch.uint8)), \
        "an unflushed page was written"
    if sc_g is not None:
        assert torch.equal(sc_g[keep], case["scale"][keep]), "unflushed page's scales written"
    fl = case["flushed"]
    assert_stored_close(st_g["checkpoint"][fl], None if sc_g is None else sc_g[fl], st_w["checkpoint"][fl],
                        None if sc_w is None else sc_w[fl], exact=exact, moved=moved, fold_tol=fold_tol)
