"""Shared helpers of the Triton backend tests (CPU interpreter and GPU): random kernel-level cases.

Holds no tests. A case is a page pool in the DESIGN layout with random contents
and random cursors, plus a packed step (rows with 1..T tokens, padding rows on
page 0); both the reference and the Triton functions run on copies of it and
every tensor they may touch is compared.
"""

from __future__ import annotations

import torch

from ssmstate.ops import reference as ref

POISON = 7.0


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-12))


def make_case(gen: torch.Generator, device: str | torch.device, *, pages: int, H: int, G: int, P: int, N: int,
              W: int, T: int, rows: int, n_pad: int, state_dtype: torch.dtype = torch.float32,
              act_dtype: torch.dtype = torch.float32, extras: bool = True, route: str = "mixed",
              qs: list[int] | None = None) -> dict:
    """A random case. ``route``: "flush" / "nonflush" force c per row, "mixed" draws c in [0, W]."""
    R = W + T
    real = rows - n_pad
    assert real <= pages - 1

    def rnd(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    ck = rnd(pages, H, P, N, dtype=state_dtype)
    ck[0] = 0
    xr = rnd(pages, H, R, P, dtype=act_dtype)
    Br = rnd(pages, G, R, N, dtype=act_dtype)
    dtr = (torch.rand(pages, H, R, generator=gen) * 0.5).to(device)
    for t in (xr, Br, dtr):
        t[0] = 0
    perm = (torch.randperm(pages - 1, generator=gen)[:real] + 1).tolist()
    page_ids = perm + [0] * n_pad
    if qs is None:
        qs = torch.randint(1, T + 1, (rows,), generator=gen).tolist()
    qs = list(qs)
    rs = torch.randint(0, R, (pages,), generator=gen, dtype=torch.int32)
    nc = torch.randint(0, W + 1, (pages,), generator=gen, dtype=torch.int32)
    for p, q in zip(page_ids, qs):
        if p == 0:
            continue
        if route == "flush":
            nc[p] = int(torch.randint(max(0, W - q + 1), W + 1, (1,), generator=gen))
        elif route == "nonflush":
            nc[p] = int(torch.randint(0, W - q + 1, (1,), generator=gen))
    rs[0] = 0
    nc[0] = 0
    cu = [0]
    for q in qs:
        cu.append(cu[-1] + q)
    L = cu[-1]
    case = dict(
        W=W, T=T, R=R,
        state=dict(checkpoint=ck, x_ring=xr, B_ring=Br, dt_ring=dtr),
        ring_start=rs.to(device), num_committed=nc.to(device),
        page_ids=torch.tensor(page_ids, dtype=torch.int32, device=device),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        qs=qs,
        x=rnd(L, H, P, dtype=act_dtype), dt=rnd(L, H, scale=0.5) - 0.5,
        A=-(torch.rand(H, generator=gen) + 0.3).to(device),
        B=rnd(L, G, N, dtype=act_dtype), C=rnd(L, G, N, dtype=act_dtype),
        D=rnd(H) if extras else None, dt_bias=rnd(H, scale=0.3) if extras else None,
        z=rnd(L, H, P, dtype=act_dtype) if extras else None,
    )
    return case


def verify_args(case: dict, state: dict | None = None) -> tuple:
    """The positional arguments of ``replay_verify`` before ``out`` (``state``: the cache tensors, the case's own
    by default)."""
    st = case["state"] if state is None else state
    return (st["checkpoint"], st["x_ring"], st["B_ring"], st["dt_ring"], case["ring_start"], case["num_committed"],
            case["x"], case["dt"], case["A"], case["B"], case["C"], case["page_ids"], case["cu_seqlens"], case["W"])


def run_verify(fn, case: dict, **kw) -> tuple[dict, torch.Tensor]:
    st = {k: v.clone() for k, v in case["state"].items()}
    L = case["x"].shape[0]
    out = torch.full(case["x"].shape, POISON, dtype=case["x"].dtype, device=case["x"].device)
    fn(*verify_args(case, st), out, D=case["D"], dt_bias=case["dt_bias"], z=case["z"], **kw)
    assert out.shape[0] == L
    return st, out


def compare_verify(case: dict, got: tuple[dict, torch.Tensor], want: tuple[dict, torch.Tensor], *,
                   out_tol: float, state_tol: float) -> dict[str, float]:
    """Assert the Triton result matches the reference; return the errors seen."""
    (st_g, out_g), (st_w, out_w) = got, want
    errs = {}
    # tokens of padding rows keep the poison value in both
    cu = case["cu_seqlens"].tolist()
    for r, p in enumerate(case["page_ids"].tolist()):
        seg = slice(cu[r], cu[r + 1])
        if p == 0:
            assert bool((out_g[seg].float() == POISON).all()), "a padding row's output was written"
    errs["out"] = rel(out_g, out_w)
    assert errs["out"] <= out_tol, f"output rel err {errs['out']:.3g} > {out_tol}"
    errs["checkpoint"] = rel(st_g["checkpoint"], st_w["checkpoint"])
    assert errs["checkpoint"] <= state_tol, f"checkpoint rel err {errs['checkpoint']:.3g} > {state_tol}"
    # rows of unflushed pages are bit-identical (never written)
    flushed = [p for p, q in zip(case["page_ids"].tolist(), case["qs"])
               if p and int(case["num_committed"][p]) + q > case["W"]]
    keep = [p for p in range(case["state"]["checkpoint"].shape[0]) if p not in flushed]
    assert torch.equal(st_g["checkpoint"][keep], case["state"]["checkpoint"][keep]), "an unflushed checkpoint changed"
    assert torch.equal(st_g["x_ring"], st_w["x_ring"]), "x ring differs"
    assert torch.equal(st_g["B_ring"], st_w["B_ring"]), "B ring differs"
    errs["dt_ring"] = float((st_g["dt_ring"] - st_w["dt_ring"]).abs().max())
    assert errs["dt_ring"] <= 1e-5, f"dt ring differs by {errs['dt_ring']:.3g}"
    for name in ("checkpoint", "x_ring", "B_ring", "dt_ring"):
        assert bool((st_g[name][0] == 0).all()), f"page 0 {name} was written"
    return errs


def other_cursors(case: dict, seed: int) -> tuple[dict, torch.Tensor]:
    """A copy of ``case`` whose pages hold other valid cursors (every row's route flipped, ring starts redrawn),
    and those cursors gathered per row (2, rows)."""
    gen = torch.Generator().manual_seed(seed)
    pages = case["ring_start"].shape[0]
    nc = case["num_committed"].clone()
    rs = torch.randint(0, case["R"], (pages,), generator=gen, dtype=torch.int32).to(nc.device)
    for page, q in zip(case["page_ids"].tolist(), case["qs"]):
        if page:
            flush = int(nc[page]) + q > case["W"]
            nc[page] = int(torch.randint(0, case["W"] - q + 1, (1,), generator=gen)) if flush else case["W"]
    rs[0] = nc[0] = 0
    other = dict(case, ring_start=rs, num_committed=nc)
    p = case["page_ids"].long()
    return other, torch.stack((rs[p], nc[p]))


def reference_verify(*args, **kw):
    return ref.replay_verify(*args, **kw)
