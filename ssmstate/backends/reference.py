"""The "reference" backend: the PyTorch functions of :mod:`ssmstate.ops.reference` on any device."""

from __future__ import annotations

import torch

from ssmstate.backends.layer_step import unfused_conv_verify
from ssmstate.cache import StateCache
from ssmstate.layout import SCALE_NAME, PageLayout
from ssmstate.ops import reference as ref
from ssmstate.ops import reference_native as refn
from ssmstate.plan import StepPlan

Tensor = torch.Tensor


class ReferenceBackend:
    """Pure PyTorch on any device; the ground truth for every verb, both schemes."""

    name = "reference"
    reads_row_cursors = True  # checked against the pages on every verify
    supports_stochastic_rounding = True

    def check(self, layout: PageLayout, device: torch.device) -> None:
        return None

    def verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor, B: Tensor,
               C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None, out: Tensor) -> Tensor:
        t = cache.layers[layer]
        if cache.layout.scheme == "native":
            return refn.native_verify(t["state"], cache.state_slot, plan.page_table_host, x, dt, A, B, C,
                                      plan.cu_seqlens_host, out, D=D, dt_bias=dt_bias, z=z)
        return ref.replay_verify(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start,
                                 cache.num_committed, x, dt, A, B, C, plan.page_ids_host, plan.cu_seqlens_host,
                                 cache.layout.spec.window, out, D=D, dt_bias=dt_bias, z=z,
                                 row_cursors=plan.row_cursors, checkpoint_scale=t.get(SCALE_NAME),
                                 sr_seed=cache.checkpoint_seed, layer=layer)

    def conv(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor, bias: Tensor | None,
             activation: str | None, out: Tensor) -> Tensor:
        return ref.conv_update(cache.layers[layer]["conv"], cache.conv_shift, xBC, weight, bias,
                               plan.page_ids_host, plan.cu_seqlens_host, out, activation=activation,
                               row_shift=plan.row_conv_shift)

    def conv_verify(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, dt: Tensor, A: Tensor,
                    weight: Tensor, bias: Tensor | None, activation: str | None, D: Tensor | None,
                    dt_bias: Tensor | None, z: Tensor | None, out: Tensor) -> Tensor:
        # this class's conv then its verify (subclasses' own: FlashInfer's checkpointing_ssu), which for this
        # class is ref.replay_conv_verify
        return unfused_conv_verify(self, cache, layer, plan, xBC, dt, A, weight, bias, activation, D, dt_bias, z,
                                   out)

    def commit(self, cache: StateCache, plan: StepPlan, accepted: Tensor, update_conv: bool,
               error_flag: Tensor) -> None:
        if cache.layout.scheme == "native":
            refn.native_commit(cache.state_slot, cache.pending, cache.conv_shift, plan.page_ids, accepted,
                               update_conv, error_flag)
        else:
            spec = cache.layout.spec
            ref.replay_commit(cache.ring_start, cache.num_committed, cache.pending, cache.conv_shift,
                              plan.page_ids, accepted, spec.window, spec.ring_len, update_conv, error_flag)

    def materialize(self, cache: StateCache, layer: int, A: Tensor, page_ids: Tensor) -> None:
        t = cache.layers[layer]
        ref.replay_materialize(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start,
                               cache.num_committed, A, page_ids, window=cache.layout.spec.window,
                               checkpoint_scale=t.get(SCALE_NAME), sr_seed=cache.checkpoint_seed, layer=layer)
