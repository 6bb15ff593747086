"""Triton causal conv1d update on the replay conv window, with rollback by ``conv_shift``.

Same contract and signature as :func:`ssmstate.ops.reference.conv_update`.
One program per (row, block of channels). Its tile is ``(sequence column, channel)``:
the ``k - 1`` history columns ending ``conv_shift`` columns before the right end of
the page's window, then the row's ``q`` new tokens. The window is stored channel-
contiguous (:class:`~ssmstate.layout.PageLayout`), as are the tokens, so every
column is one run of contiguous channels: each thread loads and stores 16 bytes of
channels per column, and every product of a tap and a column is a register
product in that layout (no shuffles, no shared memory). After every load (and a
barrier, as the window is updated in place) the program stores the last ``k - 1 + q``
columns right-aligned, then the ``q`` outputs. Padding rows (page 0) are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmstate.checks import check_tensor
from ssmstate.errors import ConfigError, ShapeError
from ssmstate.ops.triton.common import KernelLaunch, pdl_wait
from ssmstate.ops.triton.config import conv_block, device_class

Tensor = torch.Tensor


@triton.jit
def _seq_tile(wbase, x_ptr, cols, end, lo, q, offs_d, md, s_win_c, s_x_t, s_x_d, KW: tl.constexpr):
    """Sequence columns ``cols`` (history columns ``end - KW + c`` for ``c < KW``, then the row's tokens; beyond
    ``KW + q``: 0) of the program's channels, as an fp32 (len(cols), BLOCK_D) tile."""
    hist = tl.load(wbase + (end - KW + cols)[:, None] * s_win_c, mask=(cols < KW)[:, None] & md[None, :], other=0.0)
    tok = (lo + tl.maximum(cols - KW, 0)).to(tl.int64)
    new = tl.load(x_ptr + tok[:, None] * s_x_t + offs_d[None, :].to(tl.int64) * s_x_d,
                  mask=((cols >= KW) & (cols < KW + q))[:, None] & md[None, :], other=0.0)
    return tl.where((cols < KW)[:, None], hist.to(tl.float32), new.to(tl.float32))


@triton.jit
def _column(cv, m, KW: tl.constexpr):
    """Sequence column ``m``'s base pointer (channel 0): the window's history column ``end - KW + m`` for ``m < KW``,
    else the row's token ``m - KW`` (the window and the tokens share a dtype)."""
    (xbc_ptr, s_x_t, win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu) = cv
    return tl.where(m < KW, win_pg + (end - KW + m) * s_win_c, xbc_ptr + (lo + m - KW) * s_x_t)


@triton.jit
def window_loads(cv, ch, BLOCK_L: tl.constexpr, KW: tl.constexpr):
    """Channels ``ch``'s sequence columns as a (``BLOCK_L``, channels) tile in the window's dtype: the ``KW`` history
    columns ending at the window's ``end``, then the row's ``q`` tokens, then zeros; what :func:`store_window`
    stores. One load: each column's pointer is the window's or the tokens' (they share a dtype,
    :func:`~ssmstate.ops.triton.conv_verify.conv_verify_launches` checks it)."""
    (xbc_ptr, s_x_t, win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu) = cv
    ll = tl.arange(0, BLOCK_L)
    return tl.load(_column(cv, ll, KW)[:, None] + ch[None, :], mask=(ll < KW + q)[:, None], other=0.0)


@triton.jit
def conv_loads(cv, ch, KW: tl.constexpr, BLOCK_T: tl.constexpr):
    """Channels ``ch``'s conv inputs for the row's tokens, loads only: the fused layer issues them beside its other
    loads and its tile's copy, and computes (:func:`conv_outputs`) once they are in. Returns the ``KW + 1`` taps'
    (``BLOCK_T``, channels) tiles (token ``t``'s tap ``j`` is sequence column ``t + j``: the window's, then the row's
    tokens; tokens past ``q`` are 0), the taps' weights and the bias (``b_ptr`` when there is none), each loaded as a
    whole (``BLOCK_T``, channels) tile of repeated rows: a loaded (1, channels) row broadcast over the tokens would
    change layout right at its load, and that layout change waits for the load before the next one goes out.
    ``cv``: :func:`conv_operands`."""
    (xbc_ptr, s_x_t, win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu) = cv
    t = tl.arange(0, BLOCK_T)
    rows = tl.zeros((BLOCK_T, 1), dtype=tl.int32)  # every token's row of the weights and bias
    # the channels times a runtime 1 (q > 0 on every row that gets here): the compiler cannot prove them contiguous,
    # so it loads each tap element by element straight into the layout conv_outputs computes in. Proven contiguous,
    # they load 16 bytes at a time in another layout, changed right at the load, which waits for it before the next
    # load goes out: the program's loads then go out one round trip after another
    ch = ch * (q > 0).to(ch.dtype)
    taps = ()
    wts = ()
    for j in tl.static_range(KW + 1):
        taps = taps + (tl.load(_column(cv, t + j, KW)[:, None] + ch[None, :], mask=(t < q)[:, None], other=0.0),)
        wts = wts + (tl.load(w_ptr + rows + ch[None, :] * s_w_d + j * s_w_k),)
    if b_ptr is not None:
        bias = tl.load(b_ptr + rows + ch[None, :])
    else:
        bias = b_ptr
    return taps, wts, bias


@triton.jit
def _rows_at(y, idx, BLOCK_T: tl.constexpr):
    """``y[idx]`` for a (``BLOCK_T``, channels) tile ``y`` and (rows,) ``idx`` in ``[0, BLOCK_T)``, in ``y``'s layout:
    each row taken out bit for bit (an integer sum of it and zeros) and put where ``idx`` names it."""
    IT: tl.constexpr = tl.int16 if y.dtype.primitive_bitwidth == 16 else tl.int32
    bits = y.to(IT, bitcast=True).to(tl.int32)
    tt = tl.arange(0, BLOCK_T)
    out = tl.zeros((idx.shape[0], y.shape[1]), dtype=tl.int32)
    for t in tl.static_range(BLOCK_T):
        row = tl.sum(tl.where((tt == t)[:, None], bits, 0), axis=0)
        out = tl.where((idx == t)[:, None], row[None, :], out)
    return out.to(IT).to(y.dtype, bitcast=True)


@triton.jit
def conv_outputs(cv, pre, seq, KW: tl.constexpr, BLOCK_T: tl.constexpr, GATHER: tl.constexpr,
                 PLACE: tl.constexpr = True):
    """The conv outputs of :func:`conv_loads`'s channels (``pre``) at sequence rows ``seq`` of the row's tokens
    (``seq``: a (rows,) index, row r holding token ``seq[r]`` where ``0 <= seq[r] < q``; others: any token's value,
    to be masked), rounded to the inputs' dtype as the pair's conv stores them: a (len(seq), channels) tile, as the
    fused layer kernel places its verify inputs (``PLACE`` False: ``seq`` is ``arange(BLOCK_T)``, the compact tile
    as it is).

    ``act(bias + Σ_j w_j col(t + j))`` on the compact (``BLOCK_T``, channels) tile of the row's tokens, summed in
    :func:`_conv_update_kernel`'s order, then put into place: the sequence tiles are mostly history rows, which
    need no conv. ``GATHER``: by ``tl.gather``, whose layout Triton before 3.7 gave the loads too; else by selects
    in the loads' own layout (:func:`_rows_at`). From Triton 3.7 the loads keep a layout of their own and a gather
    converts every tap and weight right at its load, which waits for that load before the next goes out (the
    program's conv loads then go out one round trip after another); the selects keep them in one."""
    (xbc_ptr, s_x_t, win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu) = cv
    taps, wts, bias = pre
    y = tl.zeros(taps[0].shape, dtype=tl.float32)
    if b_ptr is not None:
        y += bias.to(tl.float32)
    for j in tl.static_range(KW + 1):
        y += wts[j].to(tl.float32) * taps[j].to(tl.float32)
    if silu:
        y = y * tl.sigmoid(y)
    y = y.to(xbc_ptr.dtype.element_ty)
    if not PLACE:
        return y
    idx = tl.minimum(tl.maximum(seq, 0), BLOCK_T - 1)
    if GATHER:
        return tl.gather(y, tl.broadcast_to(idx[:, None], (seq.shape[0], y.shape[1])), 0)
    else:
        return _rows_at(y, idx, BLOCK_T)


@triton.jit
def conv_operands(xbc_ptr, s_x_t, win_ptr, page, s_win_pg, s_win_c, shift, lo, q, width, w_ptr, s_w_d, s_w_k,
                  b_ptr, silu, KW: tl.constexpr):
    """The row's conv operands as :func:`conv_loads` and :func:`window_loads` take them: its page's window and its
    right end ``width - shift`` (the shift clamped to ``[0, width - KW]``, as the conv update reads it)."""
    end = width - tl.minimum(tl.maximum(shift, 0), width - KW)
    return (xbc_ptr, s_x_t, win_ptr + page * s_win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu)


@triton.jit
def store_window(cv, seq, ch, KW: tl.constexpr, BLOCK_L: tl.constexpr):
    """Channels ``ch``'s new window: the last ``KW + q`` sequence columns (``seq``, :func:`window_loads`),
    right-aligned (the conv update's), after a barrier: other threads of the program read these channels' old
    columns (in other layouts) and the window is updated in place."""
    (xbc_ptr, s_x_t, win_pg, s_win_c, end, lo, q, width, w_ptr, s_w_d, s_w_k, b_ptr, silu) = cv
    ll = tl.arange(0, BLOCK_L)
    dst = width - (KW + q) + ll
    tl.debug_barrier()
    tl.store(win_pg + dst[:, None] * s_win_c + ch[None, :], seq, mask=((ll < KW + q) & (dst >= 0))[:, None])


@triton.jit
def arrive(cnt, count, total):
    """Count ``count`` heads in at a row's group counter ``cnt``, after a barrier that follows every thread's reads of
    the group's old B/C window columns; True for the program whose heads complete ``total``: every other program of
    the group has read them (their reads happen-before their release, which happens-before its acquire), so it owns
    their window's store, and it resets the counter to 0 for the next launch."""
    tl.debug_barrier()
    before = tl.atomic_add(cnt, count, sem="acq_rel", scope="gpu")
    last = before + count == total
    if last:
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def _conv_update_kernel(
    win_ptr, shift_ptr, rshift_ptr, x_ptr, w_ptr, b_ptr, out_ptr, page_ptr, cu_ptr,
    Dc, width, s_rs,
    s_win_pg, s_win_d, s_win_c,
    s_x_t, s_x_d,
    s_w_d, s_w_k,
    s_o_t, s_o_d,
    KW: tl.constexpr, TMAX: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, GDC: tl.constexpr, ROW_SHIFT: tl.constexpr,
):
    pid = tl.program_id(0)
    if GDC:  # a programmatic dependent (pdl=True): everything after the kernel before has ended; only then may the
        # next kernel (the layer's verify) launch, so its early reads never overlap a kernel before this one
        pdl_wait()
    row = tl.program_id(1)
    page = tl.load(page_ptr + row).to(tl.int64)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if (page != 0) & (q > 0):
        offs_d = pid * BLOCK_D + tl.arange(0, BLOCK_D)
        md = offs_d < Dc
        if ROW_SHIFT:  # gathered per row when the step began: loaded beside the page id, not after it
            shift = tl.load(rshift_ptr + row * s_rs)
        else:
            shift = tl.load(shift_ptr + page)
        shift = tl.minimum(tl.maximum(shift, 0), TMAX)  # a corrupted cursor stays in the window
        end = width - shift
        wbase = win_ptr + page * s_win_pg + offs_d[None, :].to(tl.int64) * s_win_d
        # y[t] = bias + sum_j w[:, j] * seq[t + j]: per tap, the (token, channel) tile of columns j .. j + BLOCK_T - 1
        # (re-read from L1), so every product stays in the columns' own register layout
        tt = tl.arange(0, BLOCK_T)
        y = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_d, mask=md, other=0.0).to(tl.float32)[None, :]
        for j in tl.static_range(KW + 1):
            tap = tl.load(w_ptr + offs_d * s_w_d + j * s_w_k, mask=md, other=0.0).to(tl.float32)
            y += tap[None, :] * _seq_tile(wbase, x_ptr, j + tt, end, lo, q, offs_d, md, s_win_c, s_x_t, s_x_d, KW)
        if SILU:
            y = y * tl.sigmoid(y)
        # new window: the last KW + q sequence columns, right-aligned. Every load comes before the first store: the
        # window is updated in place, and ``out`` may be ``xBC`` itself (as in the reference)
        ll = tl.arange(0, BLOCK_L)
        seq = _seq_tile(wbase, x_ptr, ll, end, lo, q, offs_d, md, s_win_c, s_x_t, s_x_d, KW)
        seq = seq.to(win_ptr.dtype.element_ty)
        dst = width - (KW + q) + ll
        keep = (ll < KW + q) & (dst >= 0)
        tl.debug_barrier()
        tl.store(wbase + dst[:, None] * s_win_c, seq, mask=keep[:, None] & md[None, :])
        tl.store(out_ptr + (lo + tt).to(tl.int64)[:, None] * s_o_t + offs_d[None, :].to(tl.int64) * s_o_d,
                 y.to(out_ptr.dtype.element_ty), mask=(tt < q)[:, None] & md[None, :])


def conv_launch(
    conv_window: Tensor,
    conv_shift: Tensor,
    xBC: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    page_ids: Tensor,
    cu_seqlens: Tensor,
    out: Tensor,
    activation: str | None = "silu",
    pdl: bool = False,
    row_shift: Tensor | None = None,
) -> KernelLaunch:
    """The launch :func:`conv_update` makes for these arguments, without running it (what
    ``tools/kernel_resources.py`` compiles for a GPU on a machine without one)."""
    pages, Dc, width = conv_window.shape
    k = weight.shape[1]
    KW = k - 1
    TMAX = width - KW
    if TMAX < 1:
        raise ShapeError(f"conv window width {width} leaves no room for a token with kernel {k}")
    if not isinstance(pdl, bool):
        raise ConfigError(f"pdl must be a bool, got {pdl!r}")
    if row_shift is not None:
        check_tensor("row_shift", row_shift, (page_ids.shape[0],), (torch.int32,), out.device)
    gdc = pdl and device_class(out.device).pdl
    BLOCK_D, warps = conv_block(Dc, conv_window.element_size())
    grid = (triton.cdiv(Dc, BLOCK_D), page_ids.shape[0])
    args = (conv_window, conv_shift, conv_shift if row_shift is None else row_shift, xBC, weight,
            bias if bias is not None else weight, out, page_ids, cu_seqlens,
            Dc, width, 0 if row_shift is None else row_shift.stride(0),
            *conv_window.stride(), *xBC.stride(), *weight.stride(), *out.stride())
    kwargs = dict(KW=KW, TMAX=TMAX, BLOCK_D=BLOCK_D, BLOCK_L=triton.next_power_of_2(width),
                  BLOCK_T=triton.next_power_of_2(TMAX), HAS_BIAS=bias is not None, SILU=activation == "silu", GDC=gdc,
                  ROW_SHIFT=row_shift is not None,
                  num_warps=warps, **({"launch_pdl": True} if gdc else {}))
    return KernelLaunch(_conv_update_kernel, grid, args, kwargs)


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
    pdl: bool = False,
    row_shift: Tensor | None = None,
) -> Tensor:
    """Causal depthwise conv1d of the window tokens (see :func:`reference.conv_update`).

    No allocation, no host synchronization (CUDA-graph safe). Any strides are served; the speed assumes the
    layout's channel-contiguous window and tokens.

    Args:
        conv_window: (pages, conv_dim, width) conv dtype, owned by the cache, updated in place; ``width - (k - 1)``
            is the longest row it accepts (T on the replay layout).
        conv_shift: (pages,) int32 cursor, owned by the cache, read only (clamped to ``[0, width - (k - 1)]``, as
            the reference).
        xBC: (tokens, conv_dim) float, the caller's step inputs. weight: (conv_dim, k) float, the model's; the last
            column multiplies the current token. bias: (conv_dim,) or None.
        page_ids: (rows,) int32, 0 = padding. cu_seqlens: (rows + 1,) int32; the step plan's.
        out: (tokens, conv_dim), the caller's, written for every non-padding token.
        activation: "silu" or None.
        pdl: launch as a programmatic dependent of the kernel before (GPU only; ignored in the interpreter):
            each program waits for it to end, then lets the next kernel launch, so that kernel (the layer's
            :func:`~ssmstate.ops.triton.verify.replay_verify` with ``pdl=True``) starts its own reads while
            this one runs. Only the launch overlaps the kernel before.
        row_shift: (rows,) int32 or None, the step plan's (``StepPlan.row_conv_shift``): each row's page's
            ``conv_shift``, equal to the cursor (the reference checks it), read beside the page id.
    Returns:
        ``out``.
    """
    conv_launch(conv_window, conv_shift, xBC, weight, bias, page_ids, cu_seqlens, out, activation, pdl,
                row_shift).run()
    return out
