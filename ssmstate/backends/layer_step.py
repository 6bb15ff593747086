"""What the backends share for ``conv_verify`` (a layer's conv update and verify as one verb): the unfused
form (the backend's own ``conv``, then its ``verify`` on views of the conv's output) and the persistent buffers
both forms use, allocated once per cache and reused by every layer and step (a verb allocates nothing, so a step
can be captured in a CUDA graph once it has run once)."""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import torch

from ssmstate.backends.base import Backend
from ssmstate.cache import StateCache
from ssmstate.ops.reference import split_xbc
from ssmstate.plan import StepPlan

Tensor = torch.Tensor


@attrs.define(eq=False)
class _Buffers:
    conv_out: Tensor | None = None  # (tokens, conv_dim) act dtype: the unfused form's conv output
    counters: Tensor | None = None  # (pages, G) int32, zero between launches: the fused kernel's
    retired: list[Tensor] = attrs.field(factory=list)  # outgrown buffers, kept alive for graphs captured with them


_BUFFERS: weakref.WeakKeyDictionary[StateCache, _Buffers] = weakref.WeakKeyDictionary()


def _buffers(cache: StateCache) -> _Buffers:
    buf = _BUFFERS.get(cache)
    if buf is None:
        buf = _BUFFERS[cache] = _Buffers()
    return buf


def plan_capacity(plan: StepPlan) -> int:
    """Rows the plan's persistent buffers hold (the manager's ``max_batch``), at least the plan's rows."""
    pt = plan.page_table
    try:
        cap = pt.untyped_storage().nbytes() // (pt.shape[1] * pt.element_size())
    except (RuntimeError, ZeroDivisionError):
        cap = 0
    return max(plan.num_rows, cap)


def conv_out_buffer(cache: StateCache, plan: StepPlan, dtype: torch.dtype) -> Tensor:
    """A (plan.total_tokens, conv_dim) ``dtype`` buffer of ``cache``'s, sized once for the manager's
    ``max_batch`` rows of T tokens."""
    buf = _buffers(cache)
    g, T = cache.layout.geometry, cache.layout.spec.num_tokens
    L = plan.total_tokens
    t = buf.conv_out
    if t is None or t.shape[0] < L or t.dtype != dtype:
        if t is not None:
            buf.retired.append(t)
        t = buf.conv_out = torch.zeros((max(L, plan_capacity(plan) * T), g.conv_dim_per_rank), dtype=dtype,
                                       device=cache.device)
    return t[:L]


def fused_counters(cache: StateCache) -> Tensor:
    """``cache``'s (pages, G) int32 arrival counters of the fused kernel (zero between launches; shared by every
    layer, whose launches run one after another in the stream, as the steps of one cache do)."""
    buf = _buffers(cache)
    if buf.counters is None:
        buf.counters = torch.zeros((cache.num_pages, cache.layout.geometry.groups_per_rank), dtype=torch.int32,
                                   device=cache.device)
    return buf.counters


def unfused_conv_verify(backend: Backend, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, dt: Tensor,
                        A: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, D: Tensor | None,
                        dt_bias: Tensor | None, z: Tensor | None, out: Tensor, **launch: Any) -> Tensor:
    """``backend.conv`` into the cache's conv-output buffer, then ``backend.verify`` on its x, B, C views
    (Nemotron-H's channel order, :func:`~ssmstate.ops.reference.split_xbc`); ``launch``: keywords both take on
    this backend (the triton backend's ``pdl``)."""
    g = cache.layout.geometry
    y = backend.conv(cache, layer, plan, xBC, weight, bias, activation, conv_out_buffer(cache, plan, xBC.dtype),
                     **launch)
    x, B, C = split_xbc(y, g.heads_per_rank, g.head_dim, g.groups_per_rank, g.state_size)
    return backend.verify(cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out, **launch)
