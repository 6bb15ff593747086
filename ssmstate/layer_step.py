"""The fused layer verb of :class:`~ssmstate.manager.StateManager`: a layer's conv update and verify as one call
(one kernel on the "triton" backend). A base of the manager, which provides the checks and the open step."""

from __future__ import annotations

import torch

from ssmstate.backends import Backend
from ssmstate.cache import StateCache
from ssmstate.checks import check_conv_verify_inputs
from ssmstate.errors import LifecycleError, SSMStateError
from ssmstate.layout import PageLayout
from ssmstate.plan import StepPlan

Tensor = torch.Tensor


class LayerStep:
    """``conv_verify``, the verb a runner's decode step calls once per layer."""

    # set by StateManager
    layout: PageLayout
    device: torch.device
    backend: Backend
    cache: StateCache
    _A: list[Tensor | None]

    def conv_verify(self, layer: int, plan: StepPlan, xBC: Tensor, dt: Tensor, A: Tensor, weight: Tensor,
                    bias: Tensor | None = None, D: Tensor | None = None, dt_bias: Tensor | None = None,
                    z: Tensor | None = None, activation: str | None = "silu", out: Tensor | None = None) -> Tensor:
        """:meth:`conv` then :meth:`verify` of one layer in one call: the conv output of ``xBC``, split into x, B
        and C in Nemotron-H's channel order (x: H·P channels, then B and C: G·N each), is the verify's input.

        The "triton" backend runs it as one kernel that never writes the conv output to memory on a GPU where the
        step's verify grid is small (the launch table's ``fused.max_programs_per_sm`` programs per SM: batch 1-2 at
        128 heads, 1-4 at 64) on 16/32-bit checkpoints rounded to nearest, else its conv and verify
        kernels (larger steps, 8-bit or stochastically rounded checkpoints); the others run their conv and verify.
        The layer counts as both conv'd and verified in the step. Bad arguments raise before anything is changed.

        Args:
            xBC: (tokens, conv_dim) act dtype, the conv input. dt: (tokens, H) raw, float. A: (H,) float, negative.
            weight: (conv_dim, conv_kernel); the last column multiplies the current token. bias: (conv_dim,).
            D: (H,) skip. dt_bias: (H,). z: (tokens, H, P) gate. activation: the conv's, "silu" or None.
            out: (tokens, H, P) act dtype, written (CUDA-graph safe); allocated if None.
        Returns:
            y: (tokens, H, P) act dtype.
        """
        self._check_open(plan, "conv_verify")  # type: ignore[attr-defined]
        layer = self._check_layer(layer)  # type: ignore[attr-defined]
        if layer in plan.conv_layers or layer in plan.verified_layers:
            raise LifecycleError(f"conv_verify: layer {layer} already ran its conv or verify in step {plan.step_id}")
        if activation not in ("silu", None):
            raise SSMStateError(f"activation must be 'silu' or None, got {activation!r}")
        g, L = self.layout.geometry, plan.total_tokens
        check_conv_verify_inputs(g, self.device, L, xBC, dt, A, weight, bias, D, dt_bias, z, out)
        if out is None:
            out = torch.zeros((L, g.heads_per_rank, g.head_dim), dtype=g.act_dtype, device=self.device)
        self._check_A(layer, A)  # type: ignore[attr-defined]
        self._A[layer] = A
        y = self.backend.conv_verify(self.cache, layer, plan, xBC, dt, A, weight, bias, activation, D, dt_bias, z,
                                     out)
        plan.conv_layers.add(layer)
        plan.verified_layers.add(layer)
        return y
