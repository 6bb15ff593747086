"""Handing a page over between an engine's own prefill kernels and ssmstate's conv + verify.

Engine-neutral (no vLLM import): the vLLM plugin uses it, and so can any runner whose prefill kernels
keep a causal-conv history in the first ``k - 1`` columns of the conv state they are given (vLLM's
``causal_conv1d_fn`` does, and the Mamba reference implementations it derives from).
"""

from __future__ import annotations

import torch

from ssmstate.dtypes import is_quantized
from ssmstate.layout import SCALE_NAME
from ssmstate.manager import StateManager
from ssmstate.ops.quant import dequantize, quantize


def manager_sr_seed(manager: StateManager) -> torch.Tensor | None:
    """The manager's device seed when it rounds checkpoints stochastically, else None."""
    return manager.cache.checkpoint_seed


def prefill_conv_view(conv: torch.Tensor, conv_kernel: int, dim_first: bool) -> torch.Tensor:
    """The conv state vLLM's prefill kernels get: the last ``k - 1`` columns of our conv window.

    ``causal_conv1d_fn`` reads a continuing request's history from columns
    ``0 .. k-2`` of the conv state it is given and writes the history after the
    chunk there; ssmstate's conv reads the ``k - 1`` columns ending ``conv_shift``
    before the window's right end. Handing vLLM this view puts both at the same
    bytes whenever ``conv_shift == 0``, which :func:`settle_conv_history` makes
    true before every continuing prefill and :meth:`StateManager.reset_cursors`
    before every fresh one. vLLM transposes an SD-layout conv state back to
    ``(dim, width)`` itself, so the SD view is the transposed one.

    vLLM's prefill kernels take the conv state's strides as given (neither its
    Triton ``causal_conv1d_fn`` nor the CPU platform's torch one requires a unit
    stride), so the window's channel-contiguous order passes as it is: the SD
    view has strides ``(page, conv_dim, 1)``, what vLLM allocates for SD itself.

    Args:
        conv: ``(blocks, conv_dim, k - 1 + T)`` page view, channels contiguous (the layout's
            order). dim_first: vLLM's ``is_conv_state_dim_first()``.
    Returns:
        ``(blocks, conv_dim, k - 1)`` (``dim_first``) or ``(blocks, k - 1, conv_dim)``, a view (no copy).
    """
    tail = conv[:, :, conv.shape[-1] - (conv_kernel - 1):]
    return tail if dim_first else tail.transpose(-1, -2)


def settle_conv_history(manager: StateManager, page_ids: torch.Tensor) -> None:
    """Move each page's conv history to the window's last ``k - 1`` columns and set ``conv_shift = 0``.

    The conv analogue of :meth:`StateManager.materialize_pages`: afterwards the
    history sits where vLLM's prefill kernels read it (:func:`prefill_conv_view`).
    Device-side gathers at fixed shapes, no host sync; 0 entries (the null page)
    write their own values back.

    Args:
        page_ids: (n,) int32 on the manager's device.
    """
    if page_ids.numel() == 0:
        return
    cache = manager.cache
    p = page_ids.long()
    shift = cache.conv_shift[p]
    k1 = manager.geometry.conv_kernel - 1
    live = (p != 0)[:, None, None]
    for layer in cache.layers:
        conv = layer["conv"]
        width, dim = conv.shape[-1], conv.shape[-2]
        cols = (width - k1 - shift.long())[:, None] + torch.arange(k1, device=conv.device)
        window = conv[p]
        hist = torch.gather(window, 2, cols[:, None, :].expand(-1, dim, -1))
        conv[p, :, width - k1:] = torch.where(live, hist, window[:, :, width - k1:])
    cache.conv_shift[p] = torch.where(p != 0, torch.zeros_like(shift), shift)


# -- staged prefills: a checkpoint the engine's kernels cannot write (8-bit, or stochastically rounded) --

def needs_staging(manager: StateManager) -> bool:
    """True when an engine's prefill kernels cannot write the checkpoint themselves.

    They write the final state with a plain cast into the tensor they are given: right for an fp32,
    bf16 or fp16 checkpoint rounded to nearest, wrong for an 8-bit one (codes + scales) or for
    stochastic rounding. Those prefill into an fp32 staging state that :func:`store_staged` encodes.
    """
    return is_quantized(manager.geometry.state_dtype) or manager_sr_seed(manager) is not None


def stage_checkpoints(manager: StateManager, layer: int, page_ids: torch.Tensor,
                      has_state: torch.Tensor | None) -> torch.Tensor:
    """The fp32 state each prefill row starts from: its decoded checkpoint, or zeros for a fresh row.

    Call after :meth:`StateManager.materialize_pages` folded the continuing rows' ring rows in. A fresh
    row's page may hold an earlier owner's bytes (garbage codes, an inf scale): ``where`` drops them.

    Args:
        page_ids: (n,) int32 pages of the prefill rows, on the manager's device.
        has_state: (n,) bool, the rows that continue a request (None: none do).
    Returns:
        (n, H, P, N) fp32, a new tensor the engine's prefill reads and overwrites.
    """
    t = manager.cache.layers[layer]
    p = page_ids.long()
    scale = t[SCALE_NAME][p] if SCALE_NAME in t else None
    state = dequantize(t["checkpoint"][p], scale)
    if has_state is None:
        return torch.zeros_like(state)
    return torch.where(has_state[:, None, None, None], state, torch.zeros_like(state))


def store_staged(manager: StateManager, layer: int, page_ids: torch.Tensor, staged: torch.Tensor) -> None:
    """Encode the staged prefill states into their pages' checkpoints (and scales), on the device.

    The same :func:`~ssmstate.ops.quant.quantize` every checkpoint write uses, stochastic when the
    manager rounds stochastically; rows on page 0 (the null page) write its own bytes back.

    Args:
        page_ids: (n,) int32 pages. staged: (n, H, P, N) fp32 from :func:`stage_checkpoints`, after the prefill.
    """
    t = manager.cache.layers[layer]
    p = page_ids.long()
    stored, scale = quantize(staged, manager.geometry.state_dtype, seed=manager_sr_seed(manager), layer=layer,
                             pages=p)
    live = (p != 0)[:, None, None]
    t["checkpoint"][p] = torch.where(live[..., None], stored, t["checkpoint"][p])
    if scale is not None:
        t[SCALE_NAME][p] = torch.where(live, scale, t[SCALE_NAME][p])
