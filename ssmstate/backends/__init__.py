"""Backends: the kernels a :class:`~ssmstate.StateManager` runs, selected by name.

A backend works on a :class:`~ssmstate.cache.StateCache` and a
:class:`~ssmstate.plan.StepPlan`; the manager does all validation and
bookkeeping before it calls one, so backends only compute.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Protocol

import torch

from ssmstate.cache import StateCache
from ssmstate.errors import BackendUnavailableError, ConfigError
from ssmstate.ops import reference as ref
from ssmstate.layout import PageLayout
from ssmstate.plan import StepPlan

Tensor = torch.Tensor


class Backend(Protocol):
    name: str
    #: verify takes ``StepPlan.row_cursors`` (the manager gathers them per step only for such a backend)
    reads_row_cursors: bool

    def check(self, layout: PageLayout, device: torch.device) -> None:
        """Raise :class:`BackendUnavailableError` if this backend cannot serve ``layout`` on ``device``."""

    def verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor,
               B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
               out: Tensor) -> Tensor: ...

    def conv(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor,
             bias: Tensor | None, activation: str | None, out: Tensor) -> Tensor: ...

    def commit(self, cache: StateCache, plan: StepPlan, accepted: Tensor, update_conv: bool,
               error_flag: Tensor) -> None: ...

    def materialize(self, cache: StateCache, layer: int, A: Tensor, page_ids: Tensor) -> None: ...


class ReferenceBackend:
    """Pure PyTorch on any device; the ground truth for every verb, both schemes."""

    name = "reference"
    reads_row_cursors = True  # checked against the pages on every verify

    def check(self, layout: PageLayout, device: torch.device) -> None:
        return None

    def verify(self, cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out):
        t = cache.layers[layer]
        if cache.layout.scheme == "native":
            return ref.native_verify(t["state"], cache.state_slot, plan.page_table_host, x, dt, A, B, C,
                                     plan.cu_seqlens_host, out, D=D, dt_bias=dt_bias, z=z)
        return ref.replay_verify(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start,
                                 cache.num_committed, x, dt, A, B, C, plan.page_ids_host, plan.cu_seqlens_host,
                                 cache.layout.spec.window, out, D=D, dt_bias=dt_bias, z=z,
                                 row_cursors=plan.row_cursors)

    def conv(self, cache, layer, plan, xBC, weight, bias, activation, out):
        return ref.conv_update(cache.layers[layer]["conv"], cache.conv_shift, xBC, weight, bias,
                               plan.page_ids_host, plan.cu_seqlens_host, out, activation=activation)

    def commit(self, cache, plan, accepted, update_conv, error_flag):
        if cache.layout.scheme == "native":
            ref.native_commit(cache.state_slot, cache.pending, cache.conv_shift, plan.page_ids, accepted,
                              update_conv, error_flag)
        else:
            spec = cache.layout.spec
            ref.replay_commit(cache.ring_start, cache.num_committed, cache.pending, cache.conv_shift,
                              plan.page_ids, accepted, spec.window, spec.ring_len, update_conv, error_flag)

    def materialize(self, cache, layer, A, page_ids):
        t = cache.layers[layer]
        ref.replay_materialize(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start,
                               cache.num_committed, A, page_ids)


#: name -> "module:Class" for backends imported on first use.
_LAZY = {
    "triton": "ssmstate.backends.triton:TritonBackend",
    "flashinfer": "ssmstate.backends.flashinfer:FlashInferBackend",
}


def backend_names() -> list[str]:
    return ["reference", *_LAZY]


def get_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """The backend called ``name`` ("reference", "triton", "flashinfer"; "native" = "reference"), built with
    ``options`` (keyword arguments of its class, e.g. ``{"pdl": True}`` for "triton")."""
    options = dict(options or {})
    if name in ("reference", "native"):
        if options:
            raise ConfigError(f"backend {name!r} takes no options, got {sorted(options)}")
        return ReferenceBackend()
    target = _LAZY.get(name)
    if target is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; choose from {backend_names()}")
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot be imported here ({exc}); the 'reference' backend runs everywhere"
        ) from None
    cls = getattr(module, cls_name)
    try:
        return cls(**options)
    except TypeError as exc:  # an unknown option
        raise ConfigError(f"backend {name!r}: bad options {sorted(options)} ({exc})") from None
