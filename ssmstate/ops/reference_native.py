"""PyTorch reference kernels of the native scheme (1 + K pages per request, one state written per token), a
sibling of :mod:`ssmstate.ops.reference` with its conventions (packed tokens, padding rows, raw dt, fp32 math)."""

from __future__ import annotations

import torch

from ssmstate.ops.reference import _clamp, _finish, _heads_to_groups, process_dt

Tensor = torch.Tensor


def native_verify(
    state: Tensor,
    state_slot: Tensor,
    page_table: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    cu_seqlens: Tensor,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    dt_softplus: bool = True,
) -> Tensor:
    """Native speculative verify: serial recurrence, the state after token i written to page i.

    The row starts from the state in page ``page_table[r, state_slot[page_table[r, 0]]]``
    (the last accepted token's state) and writes ``q`` states.

    Args:
        state: (pages, H, P, N). state_slot: (pages,) int32, indexed by a request's first page.
        page_table: (rows, 1 + K) int32; row 0 entries of 0 are padding.
        Others as in :func:`replay_verify`.
    """
    Af = A.float()
    H, G = x.shape[1], B.shape[1]
    h2g = _heads_to_groups(H, G, x.device)
    cu = cu_seqlens.tolist()
    for r, row in enumerate(page_table.tolist()):
        lo, hi = cu[r], cu[r + 1]
        if row[0] == 0 or hi == lo:
            continue
        S = state[row[_clamp(state_slot[row[0]], 0, len(row) - 1)]].float()
        dtp = process_dt(dt[lo:hi], dt_bias, dt_softplus)
        ys = []
        for i in range(hi - lo):
            t = lo + i
            a = torch.exp(torch.clamp(Af * dtp[i], max=0.0))
            S = a[:, None, None] * S + dtp[i][:, None, None] * x[t].float()[:, :, None] * B[t].float()[h2g][:, None, :]
            ys.append(torch.einsum("hpn,hn->hp", S, C[t].float()[h2g]))
            state[row[i]] = S.to(state.dtype)
        y = torch.stack(ys)
        zz = None if z is None else z[lo:hi]
        out[lo:hi] = _finish(y, x[lo:hi], D, zz).to(out.dtype)
    return out


def native_commit(
    state_slot: Tensor,
    pending: Tensor,
    conv_shift: Tensor,
    page_ids: Tensor,
    num_accepted: Tensor,
    update_conv: bool,
    error_flag: Tensor,
) -> None:
    """Native commit: the next step reads the state of the last accepted token (slot ``a - 1``).

    The native scheme overwrites its source state while verifying, so ``a`` must be
    ``>= 1``; any row out of ``1 <= a <= q`` leaves everything unchanged and sets
    ``error_flag``. ``page_ids`` are the requests' first pages.
    """
    valid = page_ids != 0
    p = page_ids.long()
    a = num_accepted.to(torch.int32)
    q = pending[p]
    bad = valid & ((a < 1) | (a > q))
    ok = ~bad.any()
    apply = valid & ok
    state_slot[p] = torch.where(apply, a - 1, state_slot[p])
    pending[p] = torch.where(apply, torch.zeros_like(q), q)
    if update_conv:
        conv_shift[p] = torch.where(apply, q - a, conv_shift[p])
    error_flag |= (~ok).to(torch.int32)
