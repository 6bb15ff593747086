"""Steps for engines that own the pages (vLLM's block pool): a verify step opened from the engine's device
tensors without a host sync, and cursor resets by page id. A base of :class:`~ssmstate.manager.StateManager`,
which provides the cache, the persistent plan buffers and the open step these verbs work on."""

from __future__ import annotations

from typing import Sequence

import torch

from ssmstate.backends import Backend
from ssmstate.cache import StateCache
from ssmstate.checks import (
    check_host_cu_seqlens,
    check_host_pages,
    check_page_ids,
    check_tensor,
    engine_step_sizes,
)
from ssmstate.errors import LifecycleError, ShapeError, SSMStateError
from ssmstate.layout import CONV_SHIFT, NUM_COMMITTED, RING_START, PageLayout
from ssmstate.plan import RequestId, StepPlan

Tensor = torch.Tensor


class EngineSteps:
    """The engine-facing step verbs of :class:`~ssmstate.manager.StateManager`, and the step helpers it shares
    with them."""

    # set by StateManager.__init__
    layout: PageLayout
    device: torch.device
    backend: Backend
    cache: StateCache
    max_batch: int
    _on_cpu: bool
    _open: StepPlan | None
    _open_ids: frozenset[RequestId]
    _step: int
    _page_table_buf: Tensor
    _cu_buf: Tensor
    _row_cursor_buf: Tensor | None

    def begin_step_from_tensors(self, page_ids: Tensor, cu_seqlens: Tensor, total_tokens: int,
                                max_seqlen: int, num_tokens: Sequence[int] | None = None) -> StepPlan:
        """Open a verify step from an engine's device tensors, without a host sync.

        For engines that own the pages (vLLM's block pool): the engine's block ids
        *are* page ids and rows with page 0 are padding. The tensors are copied
        into this manager's persistent plan buffers (CUDA-graph safe), and each
        real row's ``pending`` cursor is set to its length on the device.

        Args:
            page_ids: (rows,) int32 on the manager's device; 0 = padding row.
            cu_seqlens: (rows + 1,) int32 on the device; padding rows may be empty.
            total_tokens: host int, the packed token count the layers pass to verify.
            max_seqlen: host int, an upper bound on any row's length (<= T).
            num_tokens: host row lengths if the engine has them (CPU-side query
                starts); otherwise ``max_seqlen`` is recorded for every row.

        On a CPU device the tensors are host values and are checked (page ids in ``[0, num_pages)``, no page
        twice, ``cu_seqlens`` from 0 by steps of ``[0, max_seqlen]`` to ``total_tokens``). On a GPU that would be
        a sync: a row whose page id is out of range, or repeats an earlier row's, becomes a padding row instead
        (nothing of it is read or written).
        """
        self._require_no_open_step()
        rows = check_page_ids(page_ids, self.device).shape[0]
        if not 1 <= rows <= self.max_batch:
            raise SSMStateError(f"a step needs 1..max_batch={self.max_batch} rows, got {rows}")
        check_tensor("cu_seqlens", cu_seqlens, (rows + 1,), (torch.int32,), self.device)
        max_seqlen, total_tokens, qs = engine_step_sizes(rows, total_tokens, max_seqlen, num_tokens,
                                                         self.layout.spec.num_tokens)
        if self._on_cpu:
            check_host_pages(page_ids, self.cache.num_pages, "begin_step_from_tensors", distinct=True)
            check_host_cu_seqlens(cu_seqlens, total_tokens, max_seqlen, None if num_tokens is None else qs)
        tb, cb = self._page_table_buf[:rows], self._cu_buf[: rows + 1]
        tb[:, 0].copy_(page_ids)
        cb.copy_(cu_seqlens)
        pids = tb[:, 0]
        if not self._on_cpu:  # no sync: an id out of range, or a page a row before already has, becomes a padding
            # row, so no kernel touches memory outside the cache and no two programs race on a page (the host
            # refuses both above)
            repeat = (pids[:, None] == pids[None, :]).tril_(-1).any(dim=1)
            pids.masked_fill_((pids < 0) | (pids >= self.cache.num_pages) | repeat, 0)
        p = pids.long()
        q = cb[1:] - cb[:-1]
        pending = self.cache.pending
        # Padding rows write page 0's own value back: the null page keeps its contents.
        pending[p] = torch.where(pids != 0, q, pending[p])
        self._step += 1
        # No host copies exist without a sync: the *_host fields alias the device
        # tensors, which only the reference paths read (and they sync anyway).
        plan = StepPlan(
            step_id=self._step, request_ids=(), num_tokens=qs, page_ids=pids, page_table=tb, cu_seqlens=cb,
            page_ids_host=pids, page_table_host=tb, cu_seqlens_host=cb, max_seqlen=max_seqlen,
            total_tokens=total_tokens, external=True, **self._gather_row_cursors(pids),
        )
        self._open_ids = frozenset()
        self._open = plan
        return plan

    def reset_cursors(self, page_ids: Tensor) -> None:
        """Zero every cursor of ``page_ids`` on the device (an engine handed these pages to a new request).

        Args:
            page_ids: (n,) int32/int64 on the manager's device; 0 entries are skipped. On a CPU device an id
                outside ``[0, num_pages)`` is refused; on a GPU (no sync) it is skipped.
        """
        if not isinstance(page_ids, torch.Tensor) or page_ids.dim() != 1 or page_ids.device != self.device \
                or page_ids.dtype not in (torch.int32, torch.int64):
            raise ShapeError(f"page_ids must be a 1-D integer tensor on {self.device}")
        if self._on_cpu:
            check_host_pages(page_ids, self.cache.num_pages, "reset_cursors")
        p = self._pages_in_range(page_ids)
        cur = self.cache.cursors
        cur[:, p] = torch.where(p != 0, torch.zeros_like(cur[:, p]), cur[:, p])
        if self._open is not None and self._open.row_cursors is not None:  # keep the open step's copy current
            self._gather_row_cursors(self._open.page_ids)

    def _pages_in_range(self, page_ids: Tensor) -> Tensor:
        """``page_ids`` as int64 with every id outside ``[0, num_pages)`` made 0 (skipped); no sync."""
        p = page_ids.long()
        return p.masked_fill((p < 0) | (p >= self.cache.num_pages), 0)

    def _gather_row_cursors(self, page_ids: Tensor) -> dict[str, Tensor]:
        """Gather each row's page cursors into the persistent buffer, on the device (one index_select, no sync);
        return the plan's views of it: ``row_cursors`` (ring_start, num_committed) (2, rows) and
        ``row_conv_shift`` (rows,), or nothing (the native scheme, or a backend that does not read them)."""
        if self._row_cursor_buf is None or not self.backend.reads_row_cursors:
            return {}
        buf = self._row_cursor_buf[: page_ids.shape[0]]
        torch.index_select(self.cache.cursors.t(), 0, page_ids, out=buf)
        return {"row_cursors": buf[:, RING_START:NUM_COMMITTED + 1].t(), "row_conv_shift": buf[:, CONV_SHIFT]}

    def _require_no_open_step(self) -> None:
        if self._open is not None:
            raise LifecycleError(
                f"step {self._open.step_id} is still open; commit or roll it back before begin_step"
            )
