"""CUDA-graph capture of a whole decode step: conv + verify for every layer + the device-side commit.

A :class:`~ssmstate.StateManager` keeps every tensor a step reads (page table,
``cu_seqlens``, cursors, cache) at fixed addresses, and ``begin_step(...,
pad_to=rows)`` always fills the same slices of those buffers. So a step over a
fixed padded batch can be captured once and replayed with new contents:

    graph = DecodeStepGraph(manager, num_rows=8, num_tokens=T, body=run_layers, accepted=acc)
    plan = graph.capture(request_ids)      # captures, then runs this first step
    ...                                    # fill the static inputs, sample into ``acc``
    plan = graph.step(request_ids)         # begin_step (host) + one graph replay

``body(plan)`` issues the step's device work through the manager
(``manager.conv``/``manager.verify`` for every layer) on caller-owned static
input and ``out`` buffers; it may also write ``accepted`` (a sampler), since the
commit runs last in the graph. Host bookkeeping (which layers ran, the open
step) is replayed on the host by :meth:`DecodeStepGraph.step`.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

from ssmstate.errors import BackendUnavailableError, ShapeError, SSMStateError
from ssmstate.manager import StateManager
from ssmstate.plan import StepPlan

RequestId = Hashable


class DecodeStepGraph:
    """One captured decode step for a fixed padded batch on a CUDA device.

    Args:
        manager: a CUDA :class:`StateManager` whose backend never syncs or allocates in
            conv/verify/commit ("triton").
        num_rows: the padded batch every step has (``begin_step(..., pad_to=num_rows)``).
        num_tokens: q of every row (uniform steps only: the packed token count is fixed).
        body: ``body(plan)`` issues conv and verify for every layer (or verify only, for
            every layer) through ``manager``, with static buffers.
        accepted: (num_rows,) int32 on the manager's device; the accepted count of each row
            (padding rows ignored), read by the commit at the end of the graph.
        pool: optional CUDA graph memory pool handle to share with other graphs.
    """

    def __init__(self, manager: StateManager, num_rows: int, num_tokens: int,
                 body: Callable[[StepPlan], object], accepted: torch.Tensor, pool: object | None = None) -> None:
        if manager.device.type != "cuda":
            raise BackendUnavailableError("DecodeStepGraph needs a StateManager on a CUDA device")
        if manager.backend.name == "reference":
            raise BackendUnavailableError(
                "the reference backend synchronizes with the host and cannot be captured; use backend='triton'"
            )
        if not isinstance(num_rows, int) or not 1 <= num_rows <= manager.max_batch:
            raise SSMStateError(f"num_rows must be an int in [1, max_batch={manager.max_batch}], got {num_rows!r}")
        if not isinstance(accepted, torch.Tensor) or accepted.dtype != torch.int32 \
                or tuple(accepted.shape) != (num_rows,) or accepted.device != manager.device:
            raise ShapeError(f"accepted must be an int32 ({num_rows},) tensor on {manager.device}")
        self.manager = manager
        self.num_rows = num_rows
        self.num_tokens = num_tokens
        self.body = body
        self.accepted = accepted
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self._ptrs: tuple[int, int] | None = None
        self._layers: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())

    def _plan(self, request_ids: Sequence[RequestId]) -> StepPlan:
        return self.manager.begin_step(request_ids, self.num_tokens, pad_to=self.num_rows)

    @staticmethod
    def _addresses(plan: StepPlan) -> tuple[int, int]:
        return plan.page_ids.data_ptr(), plan.cu_seqlens.data_ptr()

    def _run(self, plan: StepPlan) -> None:
        self.body(plan)
        self.manager.commit(plan, self.accepted)

    def capture(self, request_ids: Sequence[RequestId]) -> StepPlan:
        """Compile, capture and run the first step for ``request_ids``; return its (committed) plan."""
        if self.graph is not None:
            raise SSMStateError("this DecodeStepGraph was already captured")
        m = self.manager
        # Warm-up (kernel compilation) on a step whose rows are all padding on the device:
        # every kernel runs with the captured arguments and writes nothing.
        dry = self._plan(request_ids)
        dry.page_table.zero_()
        self._run(dry)
        torch.cuda.synchronize(m.device)
        plan = self._plan(request_ids)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._run(plan)  # recorded, not run: the host closes the step here
        self.graph = graph
        self._ptrs = self._addresses(plan)
        self._layers = (frozenset(plan.verified_layers), frozenset(plan.conv_layers))
        graph.replay()
        return plan

    def step(self, request_ids: Sequence[RequestId],
             timing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None) -> StepPlan:
        """Open a step for ``request_ids`` (host work only) and replay the graph; return the committed plan.

        ``timing``: two CUDA events recorded right before and after the replay (to time the step's device work
        alone, without ``begin_step``'s uploads)."""
        if self.graph is None:
            raise SSMStateError("capture() the graph before step()")
        m = self.manager
        plan = self._plan(request_ids)
        if self._addresses(plan) != self._ptrs:
            m.rollback(plan)
            raise SSMStateError("the step plan buffers moved since capture; the graph cannot be replayed")
        if timing is not None:
            timing[0].record()
        self.graph.replay()
        if timing is not None:
            timing[1].record()
        plan.verified_layers.update(self._layers[0])
        plan.conv_layers.update(self._layers[1])
        m._close(plan)  # the commit ran on the device, inside the graph
        return plan
