"""The backend protocol: the verbs a :class:`~ssmstate.StateManager` runs on its cache.

A backend works on a :class:`~ssmstate.cache.StateCache` (the manager's: every page tensor and cursor lives there)
and a :class:`~ssmstate.plan.StepPlan` (the step's rows: page ids and ``cu_seqlens`` on the device, their host
copies, and the row cursors). The manager validates every argument and does all bookkeeping before it calls one,
so a backend only computes: it allocates nothing per step and never synchronizes with the host (a step can be
captured in a CUDA graph).

Shapes below: ``tokens`` packed over the step's ``rows`` (row ``r`` owns tokens ``cu_seqlens[r]:cu_seqlens[r+1]``),
``H`` heads of ``P`` head-dim rows, ``G`` groups of state size ``N``, conv channels ``Dc`` and width ``k``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ssmstate.cache import StateCache
from ssmstate.layout import PageLayout
from ssmstate.plan import StepPlan

Tensor = torch.Tensor


class Backend(Protocol):
    """What every backend provides; see the module docstring for the shapes."""

    name: str
    #: verify takes ``StepPlan.row_cursors`` (the manager gathers them per step only for such a backend)
    reads_row_cursors: bool
    #: writes checkpoints with stochastic rounding when ``cache.checkpoint_seed`` is set (the manager refuses
    #: ``stochastic_rounding=True`` for a backend without it); a missing attribute reads as False
    supports_stochastic_rounding: bool

    def check(self, layout: PageLayout, device: torch.device) -> None:
        """Raise :class:`~ssmstate.errors.BackendUnavailableError` if this backend cannot serve ``layout`` on
        ``device`` (called once, when the manager is built)."""

    def verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor,
               B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
               out: Tensor) -> Tensor:
        """Outputs of the step's tokens for ``layer``, from each row's committed state; appends the window's rows to
        the ring (replay) or writes the per-token states (native), never moving a cursor.

        Caller-owned inputs: ``x`` (tokens, H, P) and ``z`` (tokens, H, P) or None in the ring dtype; ``dt``
        (tokens, H) raw, any float; ``B``, ``C`` (tokens, G, N) in the ring dtype; model parameters ``A`` (H,)
        fp32, negative, ``D`` and ``dt_bias`` (H,) or None. ``out`` (tokens, H, P), caller-owned, is written for
        every non-padding token and returned. Cache-owned: the layer's checkpoint (rewritten on flush rows), its
        ``checkpoint_scale`` for an 8-bit checkpoint (rewritten with it, per :mod:`ssmstate.ops.quant`) and
        rings; ``cache.checkpoint_seed`` (int64 (1,), or None) selects stochastic rounding of those writes."""

    def conv(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor,
             bias: Tensor | None, activation: str | None, out: Tensor) -> Tensor:
        """Causal conv1d update of the step's tokens against the layer's conv window (cache-owned, updated in
        place). Caller-owned: ``xBC`` (tokens, Dc), ``weight`` (Dc, k), ``bias`` (Dc,) or None, ``activation``
        None or "silu", ``out`` (tokens, Dc), returned."""

    def conv_verify(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, dt: Tensor, A: Tensor,
                    weight: Tensor, bias: Tensor | None, activation: str | None, D: Tensor | None,
                    dt_bias: Tensor | None, z: Tensor | None, out: Tensor) -> Tensor:
        """``conv`` of ``xBC`` (tokens, H·P + 2·G·N) in the ring dtype, its output split into x, B, C (Nemotron-H's
        channel order), then ``verify``: one verb per layer, fused into one kernel where the backend can (the
        "triton" backend's), else the two verbs with the conv output in a buffer of the cache's
        (:func:`~ssmstate.backends.layer_step.unfused_conv_verify`). Arguments as in ``conv`` and ``verify``;
        ``out`` (tokens, H, P) is returned."""

    def commit(self, cache: StateCache, plan: StepPlan, accepted: Tensor, update_conv: bool,
               error_flag: Tensor) -> None:
        """Move every row's cursors by its accepted count: ``accepted`` (rows,) or (requests,) int32 on the device,
        caller-owned, read only. A batch with any count outside ``[0, q]`` commits nothing and sets the cache-owned
        ``error_flag`` (1,) int32. ``update_conv``: also roll the conv windows back by ``q - a``."""

    def materialize(self, cache: StateCache, layer: int, A: Tensor, page_ids: Tensor) -> None:
        """Fold each page's committed ring rows into its checkpoint for ``layer`` (replay; cursors untouched),
        written as verify writes it. ``A`` (H,) fp32; ``page_ids`` (rows,) int32 on the device, 0 = skip."""
