"""Shared helpers of the fused conv + verify tests (CPU interpreter and GPU): random kernel-level cases.

Holds no tests. A case is :func:`tests.test_triton_common.make_case`'s pool plus a conv window, ``conv_shift``
cursors and the step's ``xBC`` inputs; the reference and the fused kernel run on copies and every tensor they may
touch is compared.
"""

from __future__ import annotations

import torch

from ssmstate.layout import conv_spec
from tests.test_triton_common import POISON, make_case, rel


def make_conv_case(gen: torch.Generator, device: str | torch.device, *, H: int, G: int, P: int, N: int, W: int,
                   T: int, k: int = 4, rows: int, n_pad: int, pages: int | None = None,
                   state_dtype: torch.dtype = torch.float32, act_dtype: torch.dtype = torch.float32,
                   extras: bool = True, bias: bool = True, activation: str | None = "silu", route: str = "mixed",
                   empty_row: bool = False, qs: list[int] | None = None, shift: int | None = None) -> dict:
    """A random case; ``empty_row``: the first row has 0 tokens; ``shift``: every page's ``conv_shift`` (random
    in [0, T] if None)."""
    if qs is None and empty_row:
        qs = [1] + torch.randint(1, T + 1, (rows - 1,), generator=gen).tolist()
    pages = pages if pages is not None else rows + 2
    case = make_case(gen, device, pages=pages, H=H, G=G, P=P, N=N, W=W, T=T, rows=rows, n_pad=n_pad,
                     state_dtype=state_dtype, act_dtype=act_dtype, extras=extras, route=route, qs=qs)
    if empty_row:  # drop the first row's one token: a row of 0 tokens (on a live page)
        for name in ("x", "dt", "B", "C", "z"):
            if case[name] is not None:
                case[name] = case[name][1:]
        case["cu_seqlens"] = torch.cat([case["cu_seqlens"][:1], case["cu_seqlens"][1:] - 1])
        case["qs"] = [0] + case["qs"][1:]
    Dc, width = H * P + 2 * G * N, k - 1 + T
    L = case["x"].shape[0]
    win = conv_spec(Dc, width, act_dtype).zeros(pages, "cpu").copy_(torch.randn(pages, Dc, width, generator=gen))
    win[0] = 0
    if shift is None:
        sh = torch.randint(0, T + 1, (pages,), generator=gen, dtype=torch.int32)
    else:
        sh = torch.full((pages,), shift, dtype=torch.int32)
    sh[0] = 0
    case.update(
        conv=win.to(device), conv_shift=sh.to(device), k=k, activation=activation,
        xBC=torch.randn(L, Dc, generator=gen).to(act_dtype).to(device),
        weight=(torch.randn(Dc, k, generator=gen) * 0.5).to(device),
        bias=(torch.randn(Dc, generator=gen) * 0.1).to(device) if bias else None,
    )
    return case


def run_conv_verify(fn, case: dict, counters: torch.Tensor | None = None, **kw) -> tuple[dict, torch.Tensor]:
    """``fn`` (the reference's or a fast ``replay_conv_verify``) on copies of the case's state; returns the state
    (conv window and counters included) and ``out``."""
    st = {k: v.clone() for k, v in case["state"].items()}
    st["conv"] = case["conv"].clone()
    dev = case["xBC"].device
    st["counters"] = counters if counters is not None else torch.zeros(
        (st["checkpoint"].shape[0], st["B_ring"].shape[1]), dtype=torch.int32, device=dev)
    out = torch.full(case["x"].shape, POISON, dtype=case["x"].dtype, device=dev)
    fn(st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
       st["conv"], case["conv_shift"], case["xBC"], case["dt"], case["A"], case["weight"], case["bias"],
       case["page_ids"], case["cu_seqlens"], case["W"], out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"],
       activation=case["activation"], counters=st["counters"], **kw)
    return st, out


def compare_conv_verify(case: dict, got: tuple[dict, torch.Tensor], want: tuple[dict, torch.Tensor], *,
                        out_tol: float, state_tol: float) -> dict[str, float]:
    """Assert a fused result matches the reference: outputs (padding rows untouched), checkpoint (unflushed pages
    bit-identical), rings (the conv's rounding may differ by an ulp of the act dtype), the conv window bit for bit,
    page 0 never written, the counters back at zero."""
    (sg, og), (sw, ow) = got, want
    errs = {}
    cu = case["cu_seqlens"].tolist()
    for r, p in enumerate(case["page_ids"].tolist()):
        if p == 0:
            assert bool((og[cu[r]:cu[r + 1]].float() == POISON).all()), "a padding row's output was written"
    errs["out"] = rel(og, ow)
    assert errs["out"] <= out_tol, f"output rel err {errs['out']:.3g} > {out_tol}"
    errs["checkpoint"] = rel(sg["checkpoint"], sw["checkpoint"])
    assert errs["checkpoint"] <= state_tol, f"checkpoint rel err {errs['checkpoint']:.3g} > {state_tol}"
    flushed = [p for p, q in zip(case["page_ids"].tolist(), case["qs"])
               if p and q and int(case["num_committed"][p]) + q > case["W"]]
    keep = [p for p in range(sg["checkpoint"].shape[0]) if p not in flushed]
    assert torch.equal(sg["checkpoint"][keep], case["state"]["checkpoint"][keep]), "an unflushed checkpoint changed"
    ulp = 2e-2 if case["xBC"].dtype in (torch.bfloat16, torch.float16) else 1e-5
    for name in ("x_ring", "B_ring"):
        errs[name] = float((sg[name].float() - sw[name].float()).abs().max())
        assert errs[name] <= ulp * max(1.0, float(sw[name].float().abs().max())), f"{name} differs by {errs[name]}"
    errs["dt_ring"] = float((sg["dt_ring"] - sw["dt_ring"]).abs().max())
    assert errs["dt_ring"] <= 1e-5, f"dt ring differs by {errs['dt_ring']:.3g}"
    assert torch.equal(sg["conv"], sw["conv"]), "conv window differs"
    for name in ("checkpoint", "x_ring", "B_ring", "dt_ring", "conv"):
        assert bool((sg[name][0] == 0).all()), f"page 0 {name} was written"
    assert not bool(sg["counters"].any()), "a counter was left set"
    return errs
