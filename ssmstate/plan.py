"""Step plans: which pages a verify step touches and how its tokens are packed."""

from __future__ import annotations

from typing import Hashable

import attrs
import torch

RequestId = Hashable


@attrs.define(eq=False)
class StepPlan:
    """One verify step over a batch of rows (requests, then padding rows).

    Tokens of all rows are packed: row ``r`` owns tokens
    ``cu_seqlens[r] : cu_seqlens[r + 1]`` of every per-token input. Device
    tensors are views of buffers the :class:`~ssmstate.StateManager` owns, at
    fixed addresses, so a step can be captured in a CUDA graph and replayed
    with new contents. ``*_host`` fields are CPU copies for host-side checks.

    Attributes:
        step_id: increasing step number.
        request_ids: ids of the real rows, in row order.
        num_tokens: q per row, padding rows included.
        page_ids: (rows,) int32 device; the (first) page of each row, 0 for padding.
        page_table: (rows, pages_per_request) int32 device; all pages of each row.
        cu_seqlens: (rows + 1,) int32 device.
        page_ids_host, page_table_host, cu_seqlens_host: CPU copies.
        max_seqlen: the longest row; ``total_tokens``: sum of ``num_tokens``.
        external: built by :meth:`~ssmstate.StateManager.begin_step_from_tensors` from an
            engine's device tensors (pages owned by the engine, ``request_ids`` empty,
            ``max_seqlen`` an upper bound); committed with a device count tensor only.
        row_cursors: (2, rows) int32 device (replay layouts on a backend that reads them, ``triton`` and
            ``reference``; None otherwise): each row's page's
            ``ring_start`` and ``num_committed``, gathered once when the step began so that verify
            kernels read a row's cursors beside its page id instead of one dependent load later.
            Cursors only move at commit (the step's rows are locked until then), and
            :meth:`~ssmstate.StateManager.reset_cursors` on an open step gathers them again.
        row_conv_shift: (rows,) int32 device, with ``row_cursors`` (None where it is): each row's page's
            ``conv_shift``, gathered in the same copy, so a conv update reads it beside the page id.
    """

    step_id: int
    request_ids: tuple[RequestId, ...]
    num_tokens: tuple[int, ...]
    page_ids: torch.Tensor
    page_table: torch.Tensor
    cu_seqlens: torch.Tensor
    page_ids_host: torch.Tensor
    page_table_host: torch.Tensor
    cu_seqlens_host: torch.Tensor
    max_seqlen: int
    total_tokens: int
    verified_layers: set[int] = attrs.field(factory=set)
    conv_layers: set[int] = attrs.field(factory=set)
    committed: bool = False
    external: bool = False
    row_cursors: torch.Tensor | None = None
    row_conv_shift: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.num_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)
