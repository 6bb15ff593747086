"""StateManager: the lifecycle a runner drives (admit, verify, commit, ..., release)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs
import numpy as np
import torch

from ssmstate.backends import Backend, get_backend
from ssmstate.cache import StateCache
from ssmstate.checks import (FLOATS, check_A_values, check_conv_inputs, check_hashable, check_host_pages,
                             check_page_ids, check_request_ids, check_rounding, check_tensor, check_verify_inputs,
                             host_counts, is_int, resolve_device, step_lengths, step_rows, tensor_version)
from ssmstate.engine_steps import EngineSteps
from ssmstate.errors import (
    ConfigError,
    DeviceCommitError,
    LifecycleError,
    ShapeError,
    SSMStateError,
    UnknownRequestError,
)
from ssmstate.layer_step import LayerStep
from ssmstate.ops import reference as ref
from ssmstate.layout import CURSORS_PER_PAGE, SCALE_NAME, PageLayout
from ssmstate.plan import RequestId, StepPlan
from ssmstate.pool import PagePool
from ssmstate.saved import SavedState, check_saved, restore_pages, save_pages

Tensor = torch.Tensor


@attrs.define(eq=False)
class _Request:
    pages: list[int]


class StateManager(EngineSteps, LayerStep):
    """Owns the pages, cursors and step lifecycle of every request's recurrent state.

    Args:
        layout: :meth:`PageLayout.replay` (one page per request) or :meth:`PageLayout.native` (1 + K pages).
        num_pages: pages to allocate, page 0 (the null page) included.
        device: where the cache lives.
        backend: "reference" (PyTorch, any device), "triton" or "flashinfer".
        backend_options: keyword arguments of the backend's class, e.g. ``{"pdl": True}`` for
            :class:`~ssmstate.backends.triton.TritonBackend`.
        max_batch: most rows (padding included) of a step; sizes the plan buffers. Defaults to ``num_pages``.
        stochastic_rounding: write checkpoints (flush, materialize, write_state) with stochastic rounding
            instead of round-to-nearest (bf16, fp16, int8 and fp8 checkpoints; :mod:`ssmstate.ops.quant`). The
            seed lives on the device and moves on after every commit, materialize and write_state.
        seed: the first stochastic-rounding seed (an int64).
        cache: a :class:`StateCache` over tensors an engine allocated
            (:meth:`StateCache.from_tensors`); ``num_pages`` must equal its page count.
            The engine then owns the pages: steps come from :meth:`begin_step_from_tensors` and fresh pages get
            :meth:`reset_cursors`.

    Host bookkeeping (which request owns which page, which step is open) lives
    here; everything a step reads or writes on the device lives in buffers at
    fixed addresses, so ``verify``/``conv``/``commit`` allocate nothing and never
    synchronize when the caller passes ``out`` tensors and device-side counts.
    """

    def __init__(self, layout: PageLayout, num_pages: int, device: torch.device | str = "cpu",
                 backend: str = "reference", max_batch: int | None = None,
                 cache: StateCache | None = None, backend_options: Mapping[str, Any] | None = None,
                 stochastic_rounding: bool = False, seed: int = 0) -> None:
        if not isinstance(layout, PageLayout):
            raise ConfigError(f"layout must be a PageLayout (PageLayout.replay or .native), got {layout!r:.80}")
        if not is_int(num_pages) or num_pages < 1:
            raise SSMStateError(f"num_pages must be an int >= 1 (page 0 is the null page), got {num_pages!r:.80}")
        num_pages = int(num_pages)
        if max_batch is not None and (not is_int(max_batch) or max_batch < 1):
            raise SSMStateError(f"max_batch must be an int >= 1 or None, got {max_batch!r:.80}")
        if cache is not None and not isinstance(cache, StateCache):
            raise ConfigError(f"cache must be a StateCache (StateCache.from_tensors) or None, got {cache!r:.80}")
        self.layout = layout
        self.device = resolve_device(device)
        self.backend: Backend = get_backend(backend, backend_options)
        self.backend.check(layout, self.device)
        check_rounding(self.backend, layout, stochastic_rounding, seed)
        self.pool = PagePool(num_pages)
        if cache is None:
            self.cache = StateCache(layout, num_pages, self.device)
        else:
            if cache.layout != layout or cache.num_pages != num_pages or cache.device != self.device:
                raise SSMStateError(
                    f"cache has layout/pages/device {cache.num_pages} on {cache.device}, expected "
                    f"{num_pages} pages on {self.device} with the same layout"
                )
            self.cache = cache
        if stochastic_rounding:
            self.cache.enable_stochastic_rounding(int(seed))
        self._requests: dict[RequestId, _Request] = {}
        self._first_page: dict[RequestId, int] = {}  # request -> its (first) page, for begin_step's hot loop
        self._A: list[Tensor | None] = [None] * layout.geometry.num_layers
        # per layer, the A tensor (and its version) last found <= 0: checked once per tensor, not per step
        self._A_checked: list[tuple[Tensor, int] | None] = [None] * layout.geometry.num_layers
        self._open: StepPlan | None = None
        self._open_ids: frozenset[RequestId] = frozenset()
        self._step = 0
        rows = int(max_batch) if max_batch is not None else num_pages
        self.max_batch = rows
        ppr = layout.pages_per_request
        i32 = dict(dtype=torch.int32, device=self.device)
        # Host staging (numpy, with torch views made once): a step writes plain numpy
        # arrays, never builds tensors. On a CPU device the staging *is* the device buffer.
        self._on_cpu = self.device.type == "cpu"
        self._h_table = np.zeros((rows, ppr), dtype=np.int32)
        self._h_cu = np.zeros((rows + 1,), dtype=np.int32)
        self._h_q = np.zeros((rows,), dtype=np.int32)
        self._h_acc = np.zeros((rows,), dtype=np.int32)
        self._t_table, self._t_cu, self._t_q, self._t_acc = (
            torch.from_numpy(a) for a in (self._h_table, self._h_cu, self._h_q, self._h_acc))
        if self._on_cpu:
            self._page_table_buf, self._cu_buf = self._t_table, self._t_cu
            self._qs_buf, self._accepted_buf = self._t_q, self._t_acc
            self._pending_np: np.ndarray | None = self.cache.pending.numpy()
        else:
            self._page_table_buf = torch.zeros((rows, ppr), **i32)
            self._cu_buf = torch.zeros((rows + 1,), **i32)
            self._qs_buf = torch.zeros((rows,), **i32)
            self._accepted_buf = torch.zeros((rows,), **i32)
            self._pending_np = None
        self.error_flag = torch.zeros((1,), **i32)
        # each row's page cursors, gathered per step for a backend that reads them: (rows, 4) so a row's cursors
        # are one gathered row; handed out as (ring_start, num_committed) (2, rows) (StepPlan.row_cursors) and
        # conv_shift (rows,) (StepPlan.row_conv_shift)
        self._row_cursor_buf = torch.zeros((rows, CURSORS_PER_PAGE), **i32) if layout.scheme == "replay" else None

    # -- properties -------------------------------------------------------------
    @property
    def geometry(self):
        return self.layout.geometry

    @property
    def num_layers(self) -> int:
        return self.layout.geometry.num_layers

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    @property
    def open_step(self) -> StepPlan | None:
        return self._open

    def pages_of(self, request_id: RequestId) -> list[int]:
        return list(self._get(request_id).pages)

    def page_of(self, request_id: RequestId) -> int:
        return self._get(request_id).pages[0]

    def can_admit(self, n: int = 1) -> bool:
        if not is_int(n) or n < 0:
            raise SSMStateError(f"can_admit: n must be an int >= 0, got {n!r:.80}")
        return self.pool.can_allocate(int(n) * self.layout.pages_per_request)

    def _get(self, request_id: RequestId) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request {request_id!r} (never admitted, or released)") from None
        except TypeError:
            raise SSMStateError(f"a request id must be hashable, got {type(request_id).__name__}") from None

    def _known(self, request_id: RequestId) -> bool:
        try:
            return request_id in self._requests
        except TypeError:
            return False

    def _idle(self, request_id: RequestId, verb: str) -> _Request:
        req = self._get(request_id)
        if self._open is not None and request_id in self._open_ids:
            raise LifecycleError(f"{verb}: request {request_id!r} is in an open step; commit or roll it back first")
        return req

    def _check_layer(self, layer: object) -> int:
        if not is_int(layer) or not 0 <= layer < self.num_layers:  # type: ignore[operator]
            raise SSMStateError(f"layer must be an int in [0, {self.num_layers}), got {layer!r:.80}")
        return int(layer)  # type: ignore[call-overload]

    def _check_A(self, layer: int, A: Tensor) -> None:
        """Refuse ``A > 0`` once per A tensor (and in-place change of it): a sync the first time a tensor is seen,
        none after. Inside a CUDA-graph capture (no sync possible) an unseen tensor is checked at its next call
        outside one."""
        seen, version = self._A_checked[layer], tensor_version(A)
        if seen is not None and seen[0] is A and seen[1] == version:
            return
        if A.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        check_A_values(A)
        self._A_checked[layer] = (A, version)

    def _conv_end(self, page: int) -> int:
        """The conv window's column after the committed history (``conv_shift`` read clamped, as the kernels)."""
        width = self.layout.conv_width
        return width - int(ref.clamp_conv_shift(int(self.cache.conv_shift[page]), width, self.geometry.conv_kernel))

    # -- admission ----------------------------------------------------------------
    def admit(self, request_id: RequestId) -> int:
        """Allocate a request's page(s), zero its state and cursors; return its (first) page."""
        check_hashable(request_id, "admit")
        if request_id in self._requests:
            raise LifecycleError(f"request {request_id!r} is already admitted")
        pages = self.pool.allocate(self.layout.pages_per_request)
        self.cache.zero_pages(pages)
        self._requests[request_id] = _Request(pages)
        self._first_page[request_id] = pages[0]
        return pages[0]

    def release(self, request_id: RequestId) -> None:
        """Free a request's page(s). Its state is gone."""
        req = self._idle(request_id, "release")
        self.pool.free(req.pages)
        del self._requests[request_id], self._first_page[request_id]

    # -- prefill state -----------------------------------------------------------
    def _committed(self, page: int) -> int:
        if self.layout.scheme == "native":
            return 0
        return int(self.cache.num_committed[page])

    def _state_page(self, req: _Request) -> int:
        if self.layout.scheme == "native":
            return req.pages[int(self.cache.state_slot[req.pages[0]])]
        return req.pages[0]

    def write_state(self, request_id: RequestId, layer: int, ssm_state: Tensor,
                    conv_window: Tensor | None = None) -> None:
        """Install a prefill result as the request's state for one layer.

        Args:
            ssm_state: (H, P, N) any float dtype; stored in the state dtype (8-bit: encoded per ops.quant).
            conv_window: (conv_dim, conv_kernel - 1), oldest column first, or None.

        The request must have no committed ring rows (freshly admitted, or
        materialized): the ring cursors are shared by all layers.
        """
        req = self._idle(request_id, "write_state")
        layer = self._check_layer(layer)
        g = self.geometry
        check_tensor("ssm_state", ssm_state, (g.heads_per_rank, g.head_dim, g.state_size), FLOATS, self.device)
        k = g.conv_kernel
        if conv_window is not None:
            check_tensor("conv_window", conv_window, (g.conv_dim_per_rank, k - 1), FLOATS, self.device)
        page = self._state_page(req)
        if self._committed(page):
            raise LifecycleError(
                f"write_state: request {request_id!r} has committed tokens in its ring; "
                f"call materialize() first"
            )
        t = self.cache.layers[layer]
        ref.write_checkpoint(t[self.cache.state_name()], t.get(SCALE_NAME), page, ssm_state.float(),
                             self.cache.checkpoint_seed, layer)
        self.cache.advance_seed()
        if conv_window is not None:
            end = self._conv_end(req.pages[0])
            t["conv"][req.pages[0], :, end - (k - 1): end] = conv_window.to(g.conv_state_dtype)

    def read_state(self, request_id: RequestId, layer: int) -> Tensor:
        """(H, P, N) fp32: the state with every committed token applied. Changes nothing."""
        req = self._idle(request_id, "read_state")
        layer = self._check_layer(layer)
        t = self.cache.layers[layer]
        if self.layout.scheme == "native":
            return t["state"][self._state_page(req)].float().clone()
        page = req.pages[0]
        A = self._A[layer]
        if A is None and self._committed(page):
            raise LifecycleError(f"read_state: layer {layer} has committed rows but no A was ever given")
        return ref.replay_read_state(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"],
                                     self.cache.ring_start, self.cache.num_committed, A, page,
                                     window=self.layout.spec.window, checkpoint_scale=t.get(SCALE_NAME)).clone()

    def read_conv(self, request_id: RequestId, layer: int) -> Tensor:
        """(conv_dim, conv_kernel - 1): the committed conv history, oldest column first."""
        req = self._idle(request_id, "read_conv")
        layer = self._check_layer(layer)
        k = self.geometry.conv_kernel
        end = self._conv_end(req.pages[0])
        return self.cache.layers[layer]["conv"][req.pages[0], :, end - (k - 1): end].clone()

    def bind_layer(self, layer: int, A: Tensor) -> None:
        """Give a layer's A (H,) ahead of time (``verify`` records it too); materialize needs it.

        ``A > 0`` (or NaN) is refused; this checks it once (one sync), so a later ``verify`` with the
        same tensor checks nothing."""
        layer = self._check_layer(layer)
        check_tensor("A", A, (self.geometry.heads_per_rank,), FLOATS, self.device)
        self._check_A(layer, A)
        self._A[layer] = A

    # -- steps ---------------------------------------------------------------------
    def begin_step(self, request_ids: Sequence[RequestId], num_tokens: int | Sequence[int],
                   pad_to: int | None = None) -> StepPlan:
        """Open a verify step for ``request_ids`` with ``num_tokens`` (1..T) tokens each.

        ``pad_to`` appends padding rows on the null page up to that many rows
        (CUDA-graph batch buckets). With a uniform ``num_tokens`` padding rows get
        that many tokens, otherwise none.
        """
        self._require_no_open_step()
        ids, open_ids = check_request_ids(request_ids, "begin_step")
        n = len(ids)
        if n == 0:
            raise SSMStateError("begin_step needs at least one request")
        uniform, qs, pad_q = step_lengths(num_tokens, n, self.layout.spec.num_tokens)
        rows = step_rows(pad_to, n, self.max_batch)
        table, cu, q = self._h_table, self._h_cu, self._h_q
        try:  # the page lookups raise before the table is written
            if self.layout.pages_per_request == 1:
                table[:n, 0] = np.fromiter(map(self._first_page.__getitem__, ids), np.int32, n)
            else:
                table[:n] = [self._requests[rid].pages for rid in ids]
        except KeyError:
            bad_id = next(rid for rid in ids if not self._known(rid))
            raise UnknownRequestError(f"unknown request {bad_id!r} (never admitted, or released)") from None
        table[n:rows] = 0
        if uniform:
            all_q = (qs,) * rows  # type: ignore[assignment]
            q[:rows] = qs
        else:
            all_q = tuple(qs) + (pad_q,) * (rows - n)  # type: ignore[arg-type]
            q[:rows] = all_q
        cu[0] = 0
        np.cumsum(q[:rows], out=cu[1 : rows + 1])
        table_host, cu_host = self._t_table[:rows], self._t_cu[: rows + 1]
        if self._on_cpu:
            tb, cb = table_host, cu_host
            # pending = q for the real rows; padding rows (and page 0) are never written.
            self._pending_np[table[:n, 0]] = q[:n]  # type: ignore[index]
        else:
            tb, cb = self._page_table_buf[:rows], self._cu_buf[: rows + 1]
            tb.copy_(table_host)
            cb.copy_(cu_host)
            qb = self._qs_buf[:n]
            qb.copy_(self._t_q[:n])
            self.cache.pending.index_copy_(0, tb[:n, 0].long(), qb)
        self._step += 1
        plan = StepPlan(
            step_id=self._step, request_ids=ids, num_tokens=all_q, page_ids=tb[:, 0],
            page_table=tb, cu_seqlens=cb, page_ids_host=table_host[:, 0], page_table_host=table_host,
            cu_seqlens_host=cu_host, max_seqlen=qs if uniform else max(all_q), total_tokens=int(cu[rows]),
            **self._gather_row_cursors(tb[:, 0]),
        )
        self._open_ids = open_ids
        self._open = plan
        return plan

    def _check_open(self, plan: StepPlan, verb: str) -> None:
        if not isinstance(plan, StepPlan):
            raise SSMStateError(f"{verb} needs a StepPlan from begin_step, got {type(plan).__name__}")
        if plan.committed:
            raise LifecycleError(f"{verb}: step {plan.step_id} was already committed")
        if plan is not self._open:
            raise LifecycleError(f"{verb}: step {plan.step_id} is not the open step")

    def verify(self, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, B: Tensor, C: Tensor, A: Tensor,
               D: Tensor | None = None, dt_bias: Tensor | None = None, z: Tensor | None = None,
               out: Tensor | None = None) -> Tensor:
        """SSM outputs for every token of the step, for one layer.

        Args:
            x: (tokens, H, P) act dtype. dt: (tokens, H) raw, float.
            B, C: (tokens, G, N) act dtype. A: (H,) float, negative.
            D: (H,) skip. dt_bias: (H,). z: (tokens, H, P) gate.
            out: (tokens, H, P) act dtype, written (CUDA-graph safe); allocated if None.
        Returns:
            y: (tokens, H, P) act dtype; ``softplus(dt + dt_bias)`` is applied inside.
        """
        self._check_open(plan, "verify")
        layer = self._check_layer(layer)
        if layer in plan.verified_layers:
            raise LifecycleError(f"verify: layer {layer} was already verified in step {plan.step_id}")
        g, dev, L = self.geometry, self.device, plan.total_tokens
        check_verify_inputs(g, dev, L, x, dt, B, C, A, D, dt_bias, z, out)
        if out is None:
            out = torch.zeros((L, g.heads_per_rank, g.head_dim), dtype=g.act_dtype, device=dev)
        self._check_A(layer, A)
        self._A[layer] = A
        y = self.backend.verify(self.cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out)
        plan.verified_layers.add(layer)
        return y

    def conv(self, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor, bias: Tensor | None = None,
             activation: str | None = "silu", out: Tensor | None = None) -> Tensor:
        """Causal conv1d of the step's tokens with the page's conv history, for one layer.

        Args:
            xBC: (tokens, conv_dim) conv input. weight: (conv_dim, conv_kernel); the last
                column multiplies the current token. bias: (conv_dim,). activation: "silu" or None.
            out: (tokens, conv_dim), written; allocated if None.
        Returns:
            (tokens, conv_dim) in xBC's dtype.
        """
        self._check_open(plan, "conv")
        layer = self._check_layer(layer)
        if layer in plan.conv_layers:
            raise LifecycleError(f"conv: layer {layer} already ran its conv in step {plan.step_id}")
        if activation not in ("silu", None):
            raise SSMStateError(f"activation must be 'silu' or None, got {activation!r}")
        g, dev, L = self.geometry, self.device, plan.total_tokens
        check_conv_inputs(g, dev, L, xBC, weight, bias, out)
        if out is None:
            out = torch.zeros((L, g.conv_dim_per_rank), dtype=xBC.dtype, device=dev)
        y = self.backend.conv(self.cache, layer, plan, xBC, weight, bias, activation, out)
        plan.conv_layers.add(layer)
        return y

    def commit(self, plan: StepPlan, num_accepted: int | Sequence[int] | Tensor) -> None:
        """Commit how many tokens of each row were accepted (bonus token included).

        ``num_accepted``: one count per request (or per row, padding included), or one int
        (numpy integers too) for every request; ``0 <= a <= q`` (``a = 0`` rolls the whole window back;
        the native scheme needs ``a >= 1`` once a layer was verified). A list or CPU tensor is checked on the
        host and a bad
        value raises with nothing changed. A device tensor is checked on the
        device without a sync: a bad batch is rolled back as a whole and
        :meth:`raise_device_errors` raises later.
        """
        self._check_open(plan, "commit")
        n, rows = plan.num_requests, plan.num_rows
        verified = len(plan.verified_layers)
        if verified not in (0, self.num_layers):
            missing = sorted(set(range(self.num_layers)) - plan.verified_layers)
            raise LifecycleError(f"commit: layers {missing} were not verified in step {plan.step_id}")
        if len(plan.conv_layers) not in (0, self.num_layers):
            missing = sorted(set(range(self.num_layers)) - plan.conv_layers)
            raise LifecycleError(f"commit: layers {missing} did not run their conv in step {plan.step_id}")
        native = self.layout.scheme == "native"
        if native and verified == 0 and plan.conv_layers and max(plan.num_tokens) > self.layout.spec.num_speculative_tokens:
            raise LifecycleError(
                f"rollback: the native conv window ({self.layout.conv_width} columns) lost the oldest history column "
                f"to a row of T={self.layout.spec.num_tokens} tokens in step {plan.step_id}; verify every layer and "
                f"commit a >= 1 (the replay layout's wider window rolls any step back)"
            )
        low = 1 if native and verified else 0  # a native verify overwrote its source state
        device_counts: Tensor | None = None
        if plan.external and not (isinstance(num_accepted, torch.Tensor) and num_accepted.dtype == torch.int32
                                  and num_accepted.dim() == 1 and num_accepted.shape[0] == rows
                                  and num_accepted.device == self.device):
            raise ShapeError(f"an engine-built step commits an int32 ({rows},) tensor on {self.device}")
        if isinstance(num_accepted, torch.Tensor) and (num_accepted.device.type != "cpu" or plan.external):
            if num_accepted.device != self.device or num_accepted.dtype != torch.int32 \
                    or num_accepted.dim() != 1 or num_accepted.shape[0] not in (n, rows):
                raise ShapeError(f"num_accepted must be int32 ({n},) or ({rows},) on {self.device}")
            if verified == 0 and not plan.external:
                raise LifecycleError("commit: no layer was verified; only rollback() is possible")
            device_counts = num_accepted
        else:
            a = host_counts(num_accepted, n, rows, low, self._h_q[:n], plan.request_ids)  # the open rows' lengths
            if verified == 0 and a.any():
                raise LifecycleError("commit: no layer was verified; only rollback() (0 accepted) is possible")
            acc = self._h_acc
            acc[:n] = a
            acc[n:rows] = 0
            device_counts = self._t_acc[:rows]
            if not self._on_cpu:
                device_counts = self._accepted_buf[:rows].copy_(device_counts)
        if verified == 0:
            self._rollback_unverified(plan)
        else:
            self.backend.commit(self.cache, plan, device_counts, bool(plan.conv_layers), self.error_flag)
            self.cache.advance_seed()
        self._close(plan)

    def _rollback_unverified(self, plan: StepPlan) -> None:
        """Roll back a step no layer verified: nothing was appended or flushed, so clearing ``pending`` is the
        whole rollback, unless the conv ran: it moved every window by the row's ``q`` columns, and
        ``conv_shift = q`` (the commit rule with ``a = 0``) puts the history back where it was."""
        cache = self.cache
        if plan.external:  # on the device, no sync; padding rows write page 0's own values back
            pids = plan.page_ids
            p, live = pids.long(), pids != 0
            q = cache.pending[p]
            if plan.conv_layers:
                cache.conv_shift[p] = torch.where(live, q, cache.conv_shift[p])
            cache.pending[p] = torch.where(live, torch.zeros_like(q), q)
            return
        p = plan.page_ids[: plan.num_requests].long()
        if plan.conv_layers:
            cache.conv_shift.index_copy_(0, p, cache.pending.index_select(0, p))
        cache.pending.index_fill_(0, p, 0)

    def rollback(self, plan: StepPlan) -> None:
        """Commit 0 accepted tokens for every row: the state is as before ``begin_step``."""
        if self.layout.scheme == "native" and plan is self._open and plan.verified_layers:
            raise LifecycleError("rollback: the native scheme overwrote its source state during verify")
        if isinstance(plan, StepPlan) and plan.external:
            self.commit(plan, torch.zeros((plan.num_rows,), dtype=torch.int32, device=self.device))
            return
        self.commit(plan, 0)

    def _close(self, plan: StepPlan) -> None:
        plan.committed = True
        self._open = None
        self._open_ids = frozenset()

    def raise_device_errors(self) -> None:
        """Synchronize and raise :class:`DeviceCommitError` if a device-side commit was rejected."""
        if int(self.error_flag.item()):
            self.error_flag.zero_()
            raise DeviceCommitError(
                "a device-side commit had accepted counts out of range; that step was rolled back"
            )

    # -- materialize / preempt / resume -------------------------------------------
    def materialize(self, request_ids: Sequence[RequestId]) -> None:
        """Fold every committed ring row into the checkpoint (``c = 0``) for these requests (each once)."""
        ids, _ = check_request_ids(request_ids, "materialize")
        reqs = [self._idle(rid, "materialize") for rid in ids]
        if self.layout.scheme == "native" or not reqs:
            return
        self._fold_pages(torch.tensor([r.pages[0] for r in reqs], dtype=torch.int32, device=self.device))

    def _fold_pages(self, pages: Tensor) -> None:
        """Fold the committed rows of ``pages`` (int32, 0 = skip) in every layer, then ``c = 0``."""
        missing = [i for i, A in enumerate(self._A) if A is None]
        if missing and bool((self.cache.num_committed[pages.long()] > 0).any()):
            raise LifecycleError(f"materialize: layers {missing} have committed rows but no A; call bind_layer")
        for layer, A in enumerate(self._A):
            if A is not None:
                self.backend.materialize(self.cache, layer, A, pages)
        ref.replay_reset_cursors(self.cache.ring_start, self.cache.num_committed, pages,
                                 self.layout.spec.ring_len, window=self.layout.spec.window)
        self.cache.advance_seed()

    def materialize_pages(self, page_ids: Tensor) -> None:
        """:meth:`materialize` by page, for engines that own the pages (0 entries are skipped).

        Needed before the engine's own prefill kernels read a page's checkpoint as
        the state (a prefill chunk continuing a request whose earlier tokens went
        through :meth:`verify`). Rows with nothing committed are left as they are.

        Args:
            page_ids: (n,) int32 on the manager's device. A page listed more than once is folded once. On a
                CPU device an id outside ``[0, num_pages)`` is refused; on a GPU (no sync) it is skipped.
        """
        check_page_ids(page_ids, self.device)
        if self._open is not None:
            raise LifecycleError(f"materialize_pages: step {self._open.step_id} is still open")
        if self._on_cpu:
            check_host_pages(page_ids, self.cache.num_pages, "materialize_pages")
        if self.layout.scheme == "native" or page_ids.numel() == 0:
            return
        # each page once (folding a page twice would apply its rows twice, and two programs would race on it):
        # sorted, every repeat made 0 (skipped); no sync
        pages, _ = torch.sort(self._pages_in_range(page_ids))
        repeat = torch.zeros_like(pages, dtype=torch.bool)
        repeat[1:] = pages[1:] == pages[:-1]
        self._fold_pages(pages.masked_fill(repeat, 0).to(torch.int32))

    def preempt(self, request_id: RequestId) -> SavedState:
        """Copy the request's pages and cursors to the host and free its pages."""
        req = self._idle(request_id, "preempt")
        saved = save_pages(self.cache, req.pages, self.layout)
        self.release(request_id)
        return saved

    def resume(self, request_id: RequestId, saved: SavedState) -> int:
        """Admit ``request_id`` again and restore ``saved`` bit for bit; return its (first) page.

        ``saved`` is checked whole before a page is allocated (layout, layer count, every tensor's name, shape
        and dtype, the cursors' shape and ranges); every tensor and cursor of the page is then overwritten, so
        nothing of the page's previous owner remains. A refused or failing resume leaves the pool as it was.
        """
        check_hashable(request_id, "resume")
        if not isinstance(saved, SavedState):
            raise SSMStateError(f"resume needs a SavedState, got {type(saved).__name__}")
        if saved.layout != self.layout:
            raise SSMStateError("resume: the saved state was taken with a different layout")
        if request_id in self._requests:
            raise LifecycleError(f"request {request_id!r} is already admitted")
        check_saved(saved, self.layout)
        pages = self.pool.allocate(self.layout.pages_per_request)
        try:
            restore_pages(self.cache, pages, saved)
        except BaseException:
            self.pool.free(pages)  # free pages hold no one's state: admit zeroes them
            raise
        self._requests[request_id] = _Request(pages)
        self._first_page[request_id] = pages[0]
        return pages[0]
