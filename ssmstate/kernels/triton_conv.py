"""Triton causal conv1d update on the replay conv window, with rollback by ``conv_shift``.

Same contract and signature as :func:`ssmstate.kernels.reference.conv_update`.
One program per (row, block of channels): it loads the ``k - 1`` history
columns ending ``conv_shift`` columns before the right end of the page's window
plus the row's ``q`` new columns, writes the ``q`` outputs, then (after a
barrier, as the window is updated in place) stores the last ``k - 1 + q``
columns right-aligned. Padding rows (page 0) are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmstate.errors import ConfigError, ShapeError
from ssmstate.kernels.triton_replay import _compiled, _pdl_wait

Tensor = torch.Tensor


@triton.jit
def _conv_update_kernel(
    win_ptr, shift_ptr, x_ptr, w_ptr, b_ptr, out_ptr, page_ptr, cu_ptr,
    Dc, width,
    s_win_pg, s_win_d, s_win_c,
    s_x_t, s_x_d,
    s_w_d, s_w_k,
    s_o_t, s_o_d,
    KW: tl.constexpr, TMAX: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, GDC: tl.constexpr,
):
    pid = tl.program_id(0)
    if GDC:  # a programmatic dependent (pdl=True): everything after the kernel before has ended; only then may the
        # next kernel (the layer's verify) launch, so its early reads never overlap a kernel before this one
        _pdl_wait()
    row = tl.program_id(1)
    page = tl.load(page_ptr + row).to(tl.int64)
    lo = tl.load(cu_ptr + row)
    q = tl.load(cu_ptr + row + 1) - lo
    if (page != 0) & (q > 0):
        offs_d = pid * BLOCK_D + tl.arange(0, BLOCK_D).to(tl.int64)
        md = offs_d < Dc
        shift = tl.load(shift_ptr + page)
        end = (width - shift).to(tl.int64)
        # sequence columns l: l < KW are history (window columns end-KW+l), then the q inputs
        ll = tl.arange(0, BLOCK_L).to(tl.int64)
        is_hist = ll < KW
        is_new = (ll >= KW) & (ll < KW + q)
        wbase = win_ptr + page * s_win_pg + offs_d[:, None] * s_win_d
        hist = tl.load(wbase + (end - KW + ll)[None, :] * s_win_c, mask=md[:, None] & is_hist[None, :], other=0.0)
        tok = lo + tl.maximum(ll - KW, 0)  # int64 (ll is)
        new = tl.load(x_ptr + tok[None, :] * s_x_t + offs_d[:, None] * s_x_d,
                      mask=md[:, None] & is_new[None, :], other=0.0)
        seq = hist.to(tl.float32) + new.to(tl.float32)  # (BLOCK_D, BLOCK_L)
        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(b_ptr + offs_d, mask=md, other=0.0).to(tl.float32)
        for t in tl.static_range(TMAX):
            # y_t = sum_j w[:, j] * seq[:, t + j]
            j = ll - t
            wt = tl.load(w_ptr + offs_d[:, None] * s_w_d + j[None, :] * s_w_k,
                         mask=md[:, None] & (j >= 0)[None, :] & (j < KW + 1)[None, :], other=0.0).to(tl.float32)
            y = tl.sum(seq * wt, axis=1) + bias
            if SILU:
                y = y * tl.sigmoid(y)
            # the row test as a vector, not a scalar ANDed onto one: Triton 3.9's interpreter rejects that mask
            live = md & ((tl.zeros_like(offs_d) + t) < q)
            tl.store(out_ptr + (lo + t).to(tl.int64) * s_o_t + offs_d * s_o_d, y.to(out_ptr.dtype.element_ty), mask=live)
        # new window: the last KW + q sequence columns, right-aligned
        dst = width - (KW + q) + ll
        keep = (ll < KW + q) & (dst >= 0)
        tl.debug_barrier()
        tl.store(wbase + dst[None, :] * s_win_c, seq.to(win_ptr.dtype.element_ty), mask=md[:, None] & keep[None, :])


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
    block_d: int = 256,
    pdl: bool = False,
) -> Tensor:
    """Causal depthwise conv1d of the window tokens (see :func:`reference.conv_update`).

    No allocation, no host synchronization (CUDA-graph safe).

    Args:
        conv_window: (pages, conv_dim, width) conv dtype, updated in place; ``width - (k - 1)``
            is the longest row it accepts (T on the replay layout).
        conv_shift: (pages,) int32 cursor, read only.
        xBC: (tokens, conv_dim) float. weight: (conv_dim, k) float; the last column
            multiplies the current token. bias: (conv_dim,) or None.
        page_ids: (rows,) int32, 0 = padding. cu_seqlens: (rows + 1,) int32.
        out: (tokens, conv_dim), written for every non-padding token.
        activation: "silu" or None. block_d: channels per program.
        pdl: launch as a programmatic dependent of the kernel before (GPU only; ignored in the interpreter):
            each program waits for it to end, then lets the next kernel launch, so that kernel (the layer's
            :func:`~ssmstate.kernels.triton_replay.replay_verify` with ``pdl=True``) starts its own reads while
            this one runs. Only the launch overlaps the kernel before.
    Returns:
        ``out``.
    """
    pages, Dc, width = conv_window.shape
    k = weight.shape[1]
    KW = k - 1
    TMAX = width - KW
    if TMAX < 1:
        raise ShapeError(f"conv window width {width} leaves no room for a token with kernel {k}")
    if not isinstance(pdl, bool):
        raise ConfigError(f"pdl must be a bool, got {pdl!r}")
    gdc = pdl and _compiled(out.device)
    rows = page_ids.shape[0]
    BLOCK_L = triton.next_power_of_2(width)
    BLOCK_D = min(block_d, triton.next_power_of_2(Dc))
    grid = (triton.cdiv(Dc, BLOCK_D), rows)
    _conv_update_kernel[grid](
        conv_window, conv_shift, xBC, weight, bias if bias is not None else weight, out, page_ids, cu_seqlens,
        Dc, width,
        *conv_window.stride(), *xBC.stride(), *weight.stride(), *out.stride(),
        KW=KW, TMAX=TMAX, BLOCK_D=BLOCK_D, BLOCK_L=BLOCK_L,
        HAS_BIAS=bias is not None, SILU=activation == "silu", GDC=gdc, num_warps=4,
        **({"launch_pdl": True} if gdc else {}),
    )
    return out
