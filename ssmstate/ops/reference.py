"""PyTorch reference kernels on the shared page layout (CPU and GPU).

Slow and obvious: one Python iteration per batch row, fp32 math, closed forms
from prefix sums of dt. Every fast backend is tested against these functions,
which share their signatures, and these are tested against a token-by-token
serial oracle (``tests/oracle.py``).

Conventions shared by every backend (docs/design.md has the layout, the math and the commit rule):

* Tokens of all rows are packed: ``x`` is ``(tokens, H, P)`` and row ``r`` owns
  tokens ``cu_seqlens[r] : cu_seqlens[r + 1]``.
* ``page_ids[r] == 0`` marks a padding row: nothing of it is read or written,
  its outputs are left as they are.
* ``dt`` enters raw; the kernels apply ``softplus(dt + dt_bias)`` (threshold 20)
  and the rings store the processed fp32 value.
* All math is fp32; every decay exponent is clamped to ``<= 0``.
* Checkpoints are read through :func:`read_checkpoint` (fp32; an 8-bit one decoded with its
  ``checkpoint_scale``) and written through :func:`write_checkpoint` (cast, or quantized per
  :mod:`ssmstate.ops.quant`, round-to-nearest or stochastic with ``sr_seed``).
* Cursors are read clamped (:func:`clamp_ring_cursors`, :func:`clamp_conv_shift`): ``ring_start`` to
  ``[0, R)``, ``num_committed`` to ``[0, W]``, ``pending`` and ``conv_shift`` to ``[0, T]``. Cursors the
  manager wrote are always in range and pass unchanged; a corrupted one (written straight into the cursor
  tensor) can then never make a kernel touch another page, and every backend reads it the same way.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ssmstate.ops import quant

Tensor = torch.Tensor


def process_dt(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool = True) -> Tensor:
    """``softplus(dt + dt_bias)`` in fp32 (threshold 20, as every Mamba2 kernel does)."""
    out = dt.float()
    if dt_bias is not None:
        out = out + dt_bias.float()
    return F.softplus(out) if dt_softplus else out


def _heads_to_groups(H: int, G: int, device: torch.device) -> Tensor:
    return torch.arange(H, device=device) // (H // G)


def fold(S0: Tensor, x: Tensor, B: Tensor, dtp: Tensor, A: Tensor) -> Tensor:
    """State after the rows ``x, B, dtp`` on top of ``S0``, closed form.

    Args:
        S0: (H, P, N) fp32 state.
        x: (k, H, P); B: (k, G, N); dtp: (k, H) processed dt; A: (H,) fp32.
    Returns:
        (H, P, N) fp32.
    """
    k = x.shape[0]
    if k == 0:
        return S0.clone()
    H, G = x.shape[1], B.shape[1]
    lam = torch.cumsum(dtp, dim=0)  # (k, H)
    total = lam[-1]  # (H,)
    carry = torch.exp(torch.clamp(A * total, max=0.0))  # (H,)
    w = dtp * torch.exp(torch.clamp(A * (total - lam), max=0.0))  # (k, H)
    Bh = B.float()[:, _heads_to_groups(H, G, x.device)]  # (k, H, N)
    # + 0.0: a zero update is +0, as a sum over rows (or a kernel's padded dot) gives; einsum over one row returns
    # the signed zero of its single product, which would turn a -0 of S0 into a stored -0 only there
    upd = torch.einsum("kh,khp,khn->hpn", w, x.float(), Bh) + 0.0
    return carry[:, None, None] * S0 + upd


def window_outputs(
    S0: Tensor, hx: Tensor, hB: Tensor, hdt: Tensor,
    x: Tensor, B: Tensor, C: Tensor, dtp: Tensor, A: Tensor,
) -> Tensor:
    """Outputs of the window tokens from a checkpoint plus history rows, no state formed.

    ``y_s = exp(A Λ_w) (S0 C_s) + Σ_{k ≤ w} dt_k exp(A (Λ_w - Λ_k)) (B_k·C_s) x_k`` with
    ``w = c + s`` over the concatenation of ``c`` history rows and the window.

    Args:
        S0: (H, P, N) fp32. hx/hB/hdt: (c, H, P) / (c, G, N) / (c, H) history.
        x/B/C: (q, H, P) / (q, G, N) / (q, G, N) window inputs; dtp: (q, H) processed dt.
    Returns:
        (q, H, P) fp32, without the D skip and the z gate.
    """
    c, q = hx.shape[0], x.shape[0]
    H, G = x.shape[1], B.shape[1]
    h2g = _heads_to_groups(H, G, x.device)
    xa = torch.cat([hx.float(), x.float()])  # (c+q, H, P)
    Ba = torch.cat([hB.float(), B.float()])[:, h2g]  # (c+q, H, N)
    da = torch.cat([hdt.float(), dtp.float()])  # (c+q, H)
    Ch = C.float()[:, h2g]  # (q, H, N)
    lam = torch.cumsum(da, dim=0)  # (c+q, H)
    lam_w = lam[c:]  # (q, H)
    ks = torch.arange(c + q, device=x.device)
    causal = ks[:, None] <= (c + torch.arange(q, device=x.device))[None, :]  # (k, s)
    expo = torch.clamp(A[None, None, :] * (lam_w[None, :, :] - lam[:, None, :]), max=0.0)  # (k, s, H)
    decay = torch.where(causal[:, :, None], torch.exp(expo), torch.zeros((), device=x.device))
    cb = torch.einsum("khn,shn->ksh", Ba, Ch)  # (k, s, H)
    fac = da[:, None, :] * decay * cb  # (k, s, H)
    y = torch.einsum("ksh,khp->shp", fac, xa)
    readout = torch.einsum("hpn,shn->shp", S0, Ch)
    return y + torch.exp(torch.clamp(A * lam_w, max=0.0))[:, :, None] * readout


def _finish(y: Tensor, x: Tensor, D: Tensor | None, z: Tensor | None) -> Tensor:
    if D is not None:
        y = y + D.float()[None, :, None] * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y


def clamp_ring_cursors(ring_start: Tensor, num_committed: Tensor, window: int,
                       ring_len: int) -> tuple[Tensor, Tensor]:
    """``ring_start`` clamped to ``[0, R)`` and ``num_committed`` to ``[0, W]``, as every kernel reads them."""
    return ring_start.clamp(0, ring_len - 1), num_committed.clamp(0, window)


def clamp_conv_shift(conv_shift: Tensor | int, width: int, kernel: int) -> Tensor | int:
    """``conv_shift`` clamped to ``[0, width - (kernel - 1)]`` (``[0, T]`` on the replay layout)."""
    hi = width - (kernel - 1)
    if isinstance(conv_shift, Tensor):
        return conv_shift.clamp(0, hi)
    return min(max(int(conv_shift), 0), hi)


def _clamp(v: int, lo: int, hi: int) -> int:
    return min(max(int(v), lo), hi)


def _ring_rows(start: int, count: int, R: int, device: torch.device) -> Tensor:
    return (start + torch.arange(count, device=device)) % R


def check_checkpoint_scale(checkpoint: Tensor, checkpoint_scale: Tensor | None) -> None:
    """``ShapeError`` unless an 8-bit checkpoint comes with its (pages, H, P) fp32 scales (and only it does)."""
    from ssmstate.errors import ShapeError

    if quant.is_quantized(checkpoint.dtype):
        want = tuple(checkpoint.shape[:-1])
        if not (isinstance(checkpoint_scale, Tensor) and checkpoint_scale.dtype == torch.float32
                and tuple(checkpoint_scale.shape) == want and checkpoint_scale.device == checkpoint.device):
            raise ShapeError(f"a {checkpoint.dtype} checkpoint needs checkpoint_scale: {want} fp32 on "
                             f"{checkpoint.device}")
    elif checkpoint_scale is not None:
        raise ShapeError(f"checkpoint_scale is for 8-bit checkpoints only, the checkpoint is {checkpoint.dtype}")


def read_checkpoint(checkpoint: Tensor, checkpoint_scale: Tensor | None, page: int) -> Tensor:
    """(H, P, N) fp32 state stored at ``page`` (decoded with its scales for an 8-bit checkpoint)."""
    return quant.dequantize(checkpoint[page], None if checkpoint_scale is None else checkpoint_scale[page])


def write_checkpoint(checkpoint: Tensor, checkpoint_scale: Tensor | None, page: int, S: Tensor,
                     sr_seed: Tensor | None = None, layer: int = 0) -> None:
    """Store the fp32 state ``S`` (H, P, N) at ``page``: :func:`ssmstate.ops.quant.quantize` into the checkpoint
    dtype (and the page's scales), stochastically rounded when ``sr_seed`` (int64 (1,)) is given."""
    pages = torch.tensor([page], dtype=torch.int64, device=checkpoint.device)
    stored, scale = quant.quantize(S.unsqueeze(0), checkpoint.dtype, seed=sr_seed, layer=layer, pages=pages)
    checkpoint[page] = stored[0]
    if scale is not None:
        checkpoint_scale[page] = scale[0]  # type: ignore[index]


def replay_verify(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    window: int,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    dt_softplus: bool = True,
    row_cursors: Tensor | None = None,
    checkpoint_scale: Tensor | None = None, sr_seed: Tensor | None = None, layer: int = 0,
) -> Tensor:
    """ReplaySSM verify for one layer: outputs for every window token, rows appended to the ring.

    Per row, with ``c = num_committed[page]`` and ``q`` window tokens: if
    ``c + q <= window`` the outputs come from the checkpoint plus the ``c`` history
    rows and no state is written (non-flush); otherwise the ``c`` rows are folded
    into the checkpoint, which is written, and the outputs come from it (flush).
    Either way the ``q`` new rows are appended at ``(ring_start + c + i) % R``.
    Cursors are read, never written (the commit moves them).

    Args:
        checkpoint: (pages, H, P, N) state dtype; rewritten on flush rows.
        x_ring: (pages, H, R, P) act dtype. B_ring: (pages, G, R, N) act dtype.
        dt_ring: (pages, H, R) fp32 processed dt.
        ring_start, num_committed: (pages,) int32 cursors.
        x: (tokens, H, P). dt: (tokens, H) raw. A: (H,) fp32, negative.
        B, C: (tokens, G, N). page_ids: (rows,) int32, 0 = padding.
        cu_seqlens: (rows + 1,) int32. window: W. out: (tokens, H, P), written.
        D: (H,) skip. dt_bias: (H,). z: (tokens, H, P) gate, ``y *= silu(z)``.
        row_cursors: (2, rows) int32 or None: ``ring_start`` and ``num_committed`` of each row's page as
            gathered when the step began (``StepPlan.row_cursors``). A fast kernel may read a row's cursors
            there instead of at its page; here they are checked: a stale copy raises ``LifecycleError``
            before anything is written.
        checkpoint_scale: (pages, H, P) fp32 scales of an 8-bit checkpoint (rewritten with it), else None.
        sr_seed, layer: (1,) int64 seed of stochastically rounded flushes (None: nearest); layer for the hash.
    Returns:
        ``out``.
    """
    check_checkpoint_scale(checkpoint, checkpoint_scale)
    R, dev, Af = x_ring.shape[2], x.device, A.float()
    pages, cu = page_ids.tolist(), cu_seqlens.tolist()
    if row_cursors is not None:
        check_row_cursors(row_cursors, ring_start, num_committed, page_ids, cu_seqlens)
    for r, p in enumerate(pages):
        lo, hi = cu[r], cu[r + 1]
        q = hi - lo
        if p == 0 or q == 0:
            continue
        c = _clamp(num_committed[p], 0, window)
        rs = _clamp(ring_start[p], 0, R - 1)
        dtp = process_dt(dt[lo:hi], dt_bias, dt_softplus)
        hist = _ring_rows(rs, c, R, dev)
        hx = x_ring[p][:, hist].transpose(0, 1)  # (c, H, P)
        hB = B_ring[p][:, hist].transpose(0, 1)  # (c, G, N)
        hdt = dt_ring[p][:, hist].transpose(0, 1)  # (c, H)
        S0 = read_checkpoint(checkpoint, checkpoint_scale, p)
        if c + q > window:  # flush: fold history, write the checkpoint
            S0 = fold(S0, hx, hB, hdt, Af)
            write_checkpoint(checkpoint, checkpoint_scale, p, S0, sr_seed, layer)
            hx, hB, hdt = hx[:0], hB[:0], hdt[:0]
        y = window_outputs(S0, hx, hB, hdt, x[lo:hi], B[lo:hi], C[lo:hi], dtp, Af)
        zz = None if z is None else z[lo:hi]
        out[lo:hi] = _finish(y, x[lo:hi], D, zz).to(out.dtype)
        rows = _ring_rows(rs + c, q, R, dev)
        x_ring[p][:, rows] = x[lo:hi].transpose(0, 1).to(x_ring.dtype)
        B_ring[p][:, rows] = B[lo:hi].transpose(0, 1).to(B_ring.dtype)
        dt_ring[p][:, rows] = dtp.transpose(0, 1)
    return out


def check_row_cursors_shape(row_cursors: object, rows: int, device: torch.device) -> None:
    """``ShapeError`` unless ``row_cursors`` is a (2, rows) int32 tensor on ``device`` (no sync)."""
    from ssmstate.checks import check_tensor

    check_tensor("row_cursors", row_cursors, (2, rows), (torch.int32,), device)


def check_row_cursors(row_cursors: Tensor, ring_start: Tensor, num_committed: Tensor, page_ids: Tensor,
                      cu_seqlens: Tensor) -> None:
    """Raise unless ``row_cursors`` (2, rows) int32 holds every live row's page cursors (``ShapeError`` for a
    wrong tensor, ``LifecycleError`` for a stale value; padding and empty rows are not read)."""
    from ssmstate.errors import LifecycleError

    dev = ring_start.device
    check_row_cursors_shape(row_cursors, page_ids.shape[0], dev)
    page_ids, cu_seqlens = page_ids.to(dev), cu_seqlens.to(dev)
    p = page_ids.long()
    live = (page_ids != 0) & (cu_seqlens[1:] > cu_seqlens[:-1])
    want = torch.stack((ring_start[p], num_committed[p]))
    stale = live & (row_cursors != want).any(dim=0)
    if bool(stale.any()):
        r = int(stale.nonzero()[0, 0])
        raise LifecycleError(
            f"row_cursors are stale: row {r} (page {int(page_ids[r])}) holds ring_start/num_committed "
            f"{row_cursors[:, r].tolist()}, its page {want[:, r].tolist()}; they are gathered when the step "
            f"begins (a cursor moved since, outside reset_cursors)"
        )


def check_row_shift(row_shift: Tensor, conv_shift: Tensor, page_ids: Tensor, cu_seqlens: Tensor) -> None:
    """Raise unless ``row_shift`` (rows,) holds every live row's page ``conv_shift`` (``ShapeError`` for a wrong
    tensor, ``LifecycleError`` for a stale value; padding and empty rows are not read)."""
    from ssmstate.checks import check_tensor
    from ssmstate.errors import LifecycleError

    dev = conv_shift.device
    check_tensor("row_shift", row_shift, (page_ids.shape[0],), (torch.int32,), dev)
    page_ids, cu_seqlens = page_ids.to(dev), cu_seqlens.to(dev)
    live = (page_ids != 0) & (cu_seqlens[1:] > cu_seqlens[:-1])
    want = conv_shift[page_ids.long()]
    stale = live & (row_shift != want)
    if bool(stale.any()):
        r = int(stale.nonzero()[0, 0])
        raise LifecycleError(
            f"row_shift is stale: row {r} (page {int(page_ids[r])}) holds conv_shift {int(row_shift[r])}, its page "
            f"{int(want[r])}; it is gathered when the step begins (a cursor moved since, outside reset_cursors)"
        )


def replay_commit(
    ring_start: Tensor,
    num_committed: Tensor,
    pending: Tensor,
    conv_shift: Tensor,
    page_ids: Tensor,
    num_accepted: Tensor,
    window: int,
    ring_len: int,
    update_conv: bool,
    error_flag: Tensor,
) -> None:
    """Commit a verify step: cursor arithmetic only, on the device, no host sync.

    Per row (padding rows skipped), with ``q = pending[page]`` and ``a`` accepted:
    ``flushed = c + q > W``; if flushed ``ring_start += c (mod R); c = a`` else
    ``c += a``; ``pending = 0``; ``conv_shift = q - a`` when the conv ran.

    Cursors are read clamped (``q`` to ``[0, T]``, see the module notes) and written back in range.
    If any row has ``a < 0`` or ``a > q``, the whole step is rolled back instead
    (every row commits 0, which is always safe) and ``error_flag`` is set to 1; the
    host raises when it next looks.

    Args:
        ring_start, num_committed, pending, conv_shift: (pages,) int32 cursors.
        page_ids: (rows,) int32. num_accepted: (rows,) int32 on the same device, or (requests,)
            when the rows past it are padding (they commit nothing).
        error_flag: (1,) int32.
    """
    short = page_ids.shape[0] - num_accepted.shape[0]
    if short > 0:
        num_accepted = torch.cat([num_accepted, num_accepted.new_zeros(short)])
    if page_ids.device.type == "cpu" and num_accepted.device.type == "cpu":
        replay_commit_host(ring_start.numpy(), num_committed.numpy(), pending.numpy(), conv_shift.numpy(),
                            page_ids.numpy(), num_accepted.numpy(), window, ring_len, update_conv,
                            error_flag.numpy())
    else:
        replay_commit_torch(ring_start, num_committed, pending, conv_shift, page_ids, num_accepted, window,
                             ring_len, update_conv, error_flag)


def replay_commit_torch(ring_start: Tensor, num_committed: Tensor, pending: Tensor, conv_shift: Tensor,
                         page_ids: Tensor, num_accepted: Tensor, window: int, ring_len: int, update_conv: bool,
                         error_flag: Tensor) -> None:
    """:func:`replay_commit` as torch ops on any device, without a host sync."""
    valid = page_ids != 0
    p = page_ids.long()
    q = pending[p].clamp(0, ring_len - window)
    rs, c = clamp_ring_cursors(ring_start[p], num_committed[p], window, ring_len)
    a = num_accepted.to(torch.int32)
    ok = ~(valid & ((a < 0) | (a > q))).any()
    a = torch.where(ok, a, torch.zeros_like(a))
    flushed = (c + q) > window
    # a live row's cursors are written back clamped; a padding row's (page 0's) are written back as they were
    ring_start[p] = torch.where(valid, torch.where(flushed, (rs + c) % ring_len, rs), ring_start[p])
    num_committed[p] = torch.where(valid, torch.where(flushed, a, c + a), num_committed[p])
    pending[p] = torch.where(valid, torch.zeros_like(q), pending[p])
    if update_conv:
        conv_shift[p] = torch.where(valid, q - a, conv_shift[p])
    error_flag |= (~ok).to(torch.int32)


def replay_commit_host(ring_start: np.ndarray, num_committed: np.ndarray, pending: np.ndarray,
                        conv_shift: np.ndarray, page_ids: np.ndarray, num_accepted: np.ndarray, window: int,
                        ring_len: int, update_conv: bool, error_flag: np.ndarray) -> None:
    """:func:`replay_commit` on CPU tensors through numpy views: same rule, a tenth of the host time."""
    valid = page_ids != 0
    if valid.all():  # no padding rows: index with the arrays as they are
        p, a = page_ids, num_accepted
    else:
        p, a = page_ids[valid], num_accepted[valid]
    q = np.clip(pending[p], 0, ring_len - window)
    c = np.clip(num_committed[p], 0, window)
    if (a > q).any() or (a < 0).any():
        a = np.zeros_like(a)
        error_flag[0] |= 1
    flushed = c + q > window
    ring_start[p] = (np.clip(ring_start[p], 0, ring_len - 1) + c * flushed) % ring_len
    num_committed[p] = a + c * ~flushed
    pending[p] = 0
    if update_conv:
        conv_shift[p] = q - a


def replay_materialize(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    A: Tensor,
    page_ids: Tensor,
    window: int | None = None,
    checkpoint_scale: Tensor | None = None,
    sr_seed: Tensor | None = None,
    layer: int = 0,
) -> None:
    """Fold the committed rows of each page into its checkpoint, for one layer.

    Cursors are not touched: after every layer is folded, call
    :func:`replay_reset_cursors`.

    Args:
        checkpoint: (pages, H, P, N). rings as in :func:`replay_verify`.
        A: (H,) fp32. page_ids: (rows,) int32, 0 = skip.
        window: W, the bound ``num_committed`` is read clamped to (``R`` if None).
        checkpoint_scale, sr_seed, layer: as in :func:`replay_verify` (every folded page is rewritten).
    """
    check_checkpoint_scale(checkpoint, checkpoint_scale)
    R = x_ring.shape[2]
    W = R if window is None else window
    for p in page_ids.tolist():
        if p == 0:
            continue
        c = _clamp(num_committed[p], 0, W)
        if c == 0:
            continue
        rows = _ring_rows(_clamp(ring_start[p], 0, R - 1), c, R, x_ring.device)
        S = fold(read_checkpoint(checkpoint, checkpoint_scale, p), x_ring[p][:, rows].transpose(0, 1),
                 B_ring[p][:, rows].transpose(0, 1), dt_ring[p][:, rows].transpose(0, 1), A.float())
        write_checkpoint(checkpoint, checkpoint_scale, p, S, sr_seed, layer)


def replay_reset_cursors(ring_start: Tensor, num_committed: Tensor, page_ids: Tensor, ring_len: int,
                         window: int | None = None) -> None:
    """After a materialize of every layer: ``ring_start += c (mod R)``, ``c = 0`` (cursors read clamped, ``c`` to
    ``[0, window]``, ``[0, R]`` if None)."""
    valid = page_ids != 0
    p = page_ids.long()
    rs, c = clamp_ring_cursors(ring_start[p], num_committed[p], ring_len if window is None else window, ring_len)
    ring_start[p] = torch.where(valid, (rs + c) % ring_len, ring_start[p])
    num_committed[p] = torch.where(valid, torch.zeros_like(c), num_committed[p])


def replay_read_state(
    checkpoint: Tensor, x_ring: Tensor, B_ring: Tensor, dt_ring: Tensor,
    ring_start: Tensor, num_committed: Tensor, A: Tensor | None, page: int, window: int | None = None,
    checkpoint_scale: Tensor | None = None,
) -> Tensor:
    """(H, P, N) fp32 state of ``page`` with its committed rows applied; changes nothing (``num_committed`` read
    clamped to ``[0, window]``, ``[0, R]`` if None; an 8-bit checkpoint decoded with ``checkpoint_scale``)."""
    check_checkpoint_scale(checkpoint, checkpoint_scale)
    R = x_ring.shape[2]
    c = _clamp(num_committed[page], 0, R if window is None else window)
    S = read_checkpoint(checkpoint, checkpoint_scale, page)
    if c == 0:
        return S
    if A is None:
        from ssmstate.errors import LifecycleError
        raise LifecycleError(f"page {page} has {c} committed rows but no A was given")
    rows = _ring_rows(_clamp(ring_start[page], 0, R - 1), c, R, x_ring.device)
    return fold(S, x_ring[page][:, rows].transpose(0, 1), B_ring[page][:, rows].transpose(0, 1),
                dt_ring[page][:, rows].transpose(0, 1), A.float())


# -- conv ---------------------------------------------------------------------

def conv_update(
    conv_window: Tensor,
    conv_shift: Tensor,
    xBC: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    out: Tensor,
    activation: str | None = "silu",
    row_shift: Tensor | None = None,
) -> Tensor:
    """Causal depthwise conv1d over the window tokens, with the history taken from the page.

    The history is the ``k - 1`` columns ending ``conv_shift[page]`` columns before
    the right end of the window (the rejected tail of the last step). The new
    window holds the last ``min(width, k - 1 + q)`` columns of history + inputs,
    right-aligned; the commit sets ``conv_shift = q - a``.

    Args:
        conv_window: (pages, conv_dim, width) conv dtype, updated in place.
        conv_shift: (pages,) int32 cursor, read only (clamped to ``[0, width - (k - 1)]``).
        xBC: (tokens, conv_dim). weight: (conv_dim, k); the last column multiplies
            the current token. bias: (conv_dim,) or None.
        page_ids: (rows,) int32, 0 = padding. cu_seqlens: (rows + 1,) int32.
        out: (tokens, conv_dim), written. activation: "silu" or None.
        row_shift: (rows,) int32 or None: each row's page's ``conv_shift`` as the step gathered it
            (``StepPlan.row_conv_shift``); checked to equal the cursor, as the kernels read it instead.
    """
    if row_shift is not None:
        check_row_shift(row_shift, conv_shift, page_ids, cu_seqlens)
    width = conv_window.shape[2]
    k = weight.shape[1]
    wf = weight.float()
    cu = cu_seqlens.tolist()
    for r, p in enumerate(page_ids.tolist()):
        lo, hi = cu[r], cu[r + 1]
        q = hi - lo
        if p == 0 or q == 0:
            continue
        end = width - clamp_conv_shift(conv_shift[p], width, k)
        hist = conv_window[p][:, end - (k - 1): end].float()  # (D, k-1)
        seq = torch.cat([hist, xBC[lo:hi].float().transpose(0, 1)], dim=1)  # (D, k-1+q)
        win = seq.unfold(1, k, 1)  # (D, q, k)
        y = torch.einsum("dqk,dk->qd", win, wf)
        if bias is not None:
            y = y + bias.float()
        if activation == "silu":
            y = F.silu(y)
        out[lo:hi] = y.to(out.dtype)
        keep = min(width, k - 1 + q)
        conv_window[p][:, width - keep:] = seq[:, -keep:].to(conv_window.dtype)
    return out


def split_xbc(y: Tensor, H: int, P: int, G: int, N: int) -> tuple[Tensor, Tensor, Tensor]:
    """A conv output (tokens, H·P + 2·G·N) split in Nemotron-H's channel order: x (tokens, H, P), then B and C
    (tokens, G, N) each."""
    L = y.shape[0]
    x, B, C = torch.split(y, [H * P, G * N, G * N], dim=-1)
    return x.reshape(L, H, P), B.reshape(L, G, N), C.reshape(L, G, N)


def replay_conv_verify(
    checkpoint: Tensor,
    x_ring: Tensor,
    B_ring: Tensor,
    dt_ring: Tensor,
    ring_start: Tensor,
    num_committed: Tensor,
    conv_window: Tensor,
    conv_shift: Tensor,
    xBC: Tensor,
    dt: Tensor,
    A: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    window: int,
    out: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    z: Tensor | None = None,
    activation: str | None = "silu",
    dt_softplus: bool = True,
    row_cursors: Tensor | None = None,
    counters: Tensor | None = None,
) -> Tensor:
    """One layer's decode step: :func:`conv_update` of ``xBC``, its output split into x, B, C
    (:func:`split_xbc`), then :func:`replay_verify`. The conv output is an internal temporary here; the fused
    kernel never writes it to memory.

    Args:
        checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed: as in :func:`replay_verify`.
        conv_window: (pages, H·P + 2·G·N, width) conv dtype, updated in place. conv_shift: (pages,) int32, read.
        xBC: (tokens, H·P + 2·G·N) in the rings' dtype. dt: (tokens, H) raw. A: (H,) fp32, negative.
        weight: (conv_dim, k). bias: (conv_dim,) or None. page_ids, cu_seqlens, window, out, D, dt_bias, z,
            dt_softplus, row_cursors: as in :func:`replay_verify`. activation: the conv's, "silu" or None.
        counters: (pages, G) int32, the fused kernel's arrival counters (zero before and after a launch);
            unused here (rows run one after another).
    Returns:
        ``out``.
    """
    if row_cursors is not None:  # a stale copy raises before the conv window is written
        check_row_cursors(row_cursors, ring_start, num_committed, page_ids, cu_seqlens)
    H, P, N, G = checkpoint.shape[1], checkpoint.shape[2], checkpoint.shape[3], B_ring.shape[1]
    y = torch.zeros(xBC.shape, dtype=xBC.dtype, device=xBC.device)
    conv_update(conv_window, conv_shift, xBC, weight, bias, page_ids, cu_seqlens, y, activation=activation)
    x, B, C = split_xbc(y, H, P, G, N)
    return replay_verify(checkpoint, x_ring, B_ring, dt_ring, ring_start, num_committed, x, dt, A, B, C, page_ids,
                         cu_seqlens, window, out, D=D, dt_bias=dt_bias, z=z, dt_softplus=dt_softplus,
                         row_cursors=row_cursors)
