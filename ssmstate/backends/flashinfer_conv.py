"""The FlashInfer backend's conv: vLLM's Triton ``causal_conv1d_update`` on the replay conv window.

vLLM pairs FlashInfer's ``checkpointing_ssu`` with its own Triton conv update, so the backend uses that kernel
(imported from ``vllm.model_executor.layers.mamba.ops.causal_conv1d``; where vLLM is not installed, a process may
provide the same module from vLLM's kernel source, as ``tests/gpu/vllm_kernel_shim.py`` does). One launch per layer,
no host synchronization: a step captures in a CUDA graph.

How our window maps onto vLLM's speculative form. Our window is ``width = k - 1 + T`` columns; a row's history is
the ``k - 1`` columns ending ``conv_shift`` columns before the right end, and after ``q`` tokens the last ``k - 1 + q``
columns of history + inputs are stored right-aligned (:func:`ssmstate.ops.reference.conv_update`). vLLM's kernel, with
``num_accepted_tokens = na``, reads its ``k - 1`` history columns from column ``na - 1`` of a conv-state line and
stores ``[history[1:], inputs]`` (``k - 2 + q`` columns) from column 0. Two differences, two mappings:

* *Where*: a line is addressed as ``line * stride(0)`` elements, so the backend passes the window tensor viewed
  with a line stride of one element (``as_strided``, same storage) and, per row, the line index
  ``page * page_stride + base * column_stride`` with ``base = width - (k - 1) - q``: vLLM's column 0 then lands on
  the row's first right-aligned column, whatever ``q`` is. ``na = q - conv_shift[page]`` puts its read at the
  row's history (``na - 1`` may be negative; the read stays inside the page's window, see below). Padding rows get
  line ``-1``, passed as vLLM's ``null_block_id``.
* *What*: vLLM always keeps the bonus token (``na >= 1``), so it drops the oldest history column; our window keeps
  it, so that a fully rejected step (0 accepted) rolls back too. The backend therefore runs vLLM's kernel with a
  kernel one tap wider, ``k + 1``, whose first weight column is zero: it reads ``k`` history columns (the column
  before our history, then our history) and stores our ``k - 1`` history columns plus the inputs, exactly the
  reference's ``k - 1 + q`` columns. The extra tap adds ``0 * value``: the outputs equal a ``k``-tap conv whenever
  that value is finite. It is the column just left of the row's history; for a row whose previous step accepted
  nothing (``conv_shift = T``, never under vLLM, which always keeps the bonus token) that is outside the window:
  the element ``conv_dim`` before the row's column 0 (in a :class:`StateCache`'s own tensor the same channel of the
  previous page's newest column; in engine pages the bytes just before the window), always inside the storage and
  never written. A non-finite value there would turn that one output into NaN; the reference does not read it.

A step whose rows all have ``T`` tokens goes in vLLM's dense form (``(rows, conv_dim, T)`` views of the packed
tensors), any other in its varlen form (``query_start_loc``, ``max_query_len = T``); the Triton interpreter runs
only the dense form (the varlen loop bound is a loaded value), so CPU tests cover uniform steps and the GPU tests
the rest. The per-row line index and ``na`` are computed on the device once per step (at the step's first conv; the conv
cursors do not move until the commit) into per-cache buffers. vLLM's kernel multiplies in the activation dtype
(bf16 products, fp32 sums), so outputs match the reference (fp32) to rounding; the window's columns are copies
and match bit for bit.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import attrs
import torch

from ssmstate.cache import StateCache
from ssmstate.errors import BackendUnavailableError
from ssmstate.plan import StepPlan

Tensor = torch.Tensor
VLLM_CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"


def import_vllm_conv() -> Callable[..., Tensor]:
    """vLLM's Triton ``causal_conv1d_update``, or :class:`BackendUnavailableError` saying why not."""
    try:
        import importlib

        mod = importlib.import_module(VLLM_CONV)
    except Exception as exc:  # ImportError, or a vLLM that fails at import time
        raise BackendUnavailableError(
            f"vLLM's Triton causal_conv1d_update cannot be imported ({type(exc).__name__}: {exc})"
        ) from None
    fn = getattr(mod, "causal_conv1d_update", None)
    if fn is None or getattr(fn, "__module__", "") != VLLM_CONV or not hasattr(mod, "_causal_conv1d_update_kernel"):
        raise BackendUnavailableError(
            f"{VLLM_CONV}.causal_conv1d_update is not the Triton kernel here (vLLM's CPU platform swaps it)"
        )
    return fn


@attrs.define(eq=False)
class _RowBuffers:
    """Per-cache, per-step row arguments of vLLM's kernel (device), sized for the manager's ``max_batch``."""

    line: Tensor  # (rows,) int64: line index in the strided view, -1 for padding rows
    accepted: Tensor  # (rows,) int32: vLLM's num_accepted_tokens, q - conv_shift
    plan: Any = None  # weakref to the plan they were computed for


def line_view(win: Tensor) -> Tensor:
    """``win`` (pages, Dc, width) as vLLM's conv state with a line stride of one element, same storage.

    Line ``page * stride(0) + col * stride(2)`` is then the window of ``page`` from column ``col`` on. vLLM reads
    the line count (dim 0) as the bound of a valid line, so it spans every line whose first column lies in the
    storage; the last dim (vLLM overwrites its length from the kernel width) is 1, which keeps the view in bounds.
    """
    Dc = win.shape[1]
    lines = win.untyped_storage().nbytes() // win.element_size() - win.storage_offset() - (Dc - 1) * win.stride(1)
    return win.as_strided((lines, Dc, 1), (1, win.stride(1), win.stride(2)), win.storage_offset())


class VllmConv:
    """Runs vLLM's conv update on the replay layout's window (see the module docstring)."""

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.fn = fn
        self._rows: weakref.WeakKeyDictionary[StateCache, _RowBuffers] = weakref.WeakKeyDictionary()
        self._weights: dict[tuple[Any, ...], Tensor] = {}

    def padded_weight(self, weight: Tensor) -> Tensor:
        """``weight`` (Dc, k) with a zero first column, (Dc, k + 1) contiguous; made once per weight tensor."""
        try:
            version = weight._version
        except RuntimeError:  # inference tensors keep no version: pad every call
            version = None
        key = (weight.data_ptr(), version, weight.dtype, tuple(weight.shape), weight.stride(), weight.device)
        hit = self._weights.get(key) if version is not None else None
        if hit is None:
            hit = torch.cat([weight.new_zeros(weight.shape[0], 1), weight], dim=1).contiguous()
            if version is not None:
                if len(self._weights) > 4096:
                    self._weights.clear()
                self._weights[key] = hit
        return hit

    def _row_buffers(self, cache: StateCache, plan: StepPlan, max_rows: int) -> _RowBuffers:
        buf = self._rows.get(cache)
        if buf is None or buf.line.shape[0] < plan.num_rows:
            n = max(max_rows, plan.num_rows)
            buf = _RowBuffers(torch.empty(n, dtype=torch.int64, device=cache.device),
                              torch.empty(n, dtype=torch.int32, device=cache.device))
            self._rows[cache] = buf
        return buf

    def rows(self, cache: StateCache, win: Tensor, plan: StepPlan, max_rows: int) -> tuple[Tensor, Tensor]:
        """This step's ``(line, accepted)`` for every row, computed on the device at the step's first conv."""
        buf = self._row_buffers(cache, plan, max_rows)
        n = plan.num_rows
        line, acc = buf.line[:n], buf.accepted[:n]
        if buf.plan is not None and buf.plan() is plan:
            return line, acc
        KW = cache.layout.geometry.conv_kernel - 1
        width = win.shape[2]
        pages = plan.page_ids
        q = plan.cu_seqlens[1:] - plan.cu_seqlens[:-1]
        shift = cache.conv_shift.index_select(0, pages).clamp_(0, width - KW)
        torch.sub(q, shift, out=acc)
        base = (width - KW) - q.long()
        torch.add(pages.long() * win.stride(0), base * win.stride(2), out=line)
        line.masked_fill_(pages == 0, -1)
        buf.plan = weakref.ref(plan)
        return line, acc

    def __call__(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor,
                 bias: Tensor | None, activation: str | None, out: Tensor, max_rows: int) -> Tensor:
        """Conv update of ``layer`` for the plan's rows; arguments as :meth:`Backend.conv`."""
        win = cache.layers[layer]["conv"]
        Dc = win.shape[1]
        line, acc = self.rows(cache, win, plan, max_rows)
        view = line_view(win)
        T, rows = cache.layout.spec.num_tokens, plan.num_rows
        if plan.total_tokens == rows * T:  # every row T tokens: vLLM's dense (batch, dim, seqlen) form, views
            x3, o3 = (t.view(rows, T, Dc).transpose(1, 2) for t in (xBC, out))
            self.fn(x3, view, self.padded_weight(weight), bias=bias, activation=activation,
                    conv_state_indices=line, num_accepted_tokens=acc, null_block_id=-1, out=o3)
        else:
            self.fn(xBC, view, self.padded_weight(weight), bias=bias, activation=activation,
                    conv_state_indices=line, num_accepted_tokens=acc, query_start_loc=plan.cu_seqlens,
                    max_query_len=T, null_block_id=-1, out=out)
        return out
