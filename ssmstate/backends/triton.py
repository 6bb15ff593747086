"""The "triton" backend: the fast path on the GPU, and on CPU tensors under ``TRITON_INTERPRET=1``.

Every verb is one launch on the shared page layout, with no host
synchronization and no allocation, so a whole decode step (conv + verify for
every layer + commit from a device count tensor) can be captured in a CUDA
graph (see :mod:`ssmstate.cuda_graph`).
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from ssmstate.backends.layer_step import fused_counters, unfused_conv_verify
from ssmstate.cache import StateCache
from ssmstate.errors import BackendUnavailableError, ConfigError
from ssmstate.layout import SCALE_NAME, PageLayout
from ssmstate.plan import StepPlan

try:
    import triton  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only where triton is absent
    _TRITON_ERROR: str | None = f"triton is not importable ({_exc}); pip install triton, or pip install -e '.[triton]' from a checkout"
else:
    _TRITON_ERROR = None

Tensor = torch.Tensor

#: Limits of the kernels' tiling (register budget of one program, tl.dot tile of 16 tokens).
MAX_HEAD_DIM = 256
MAX_STATE_SIZE = 256
MAX_TOKENS = 16
MAX_RING_LEN = 128


def arch_problems(layout: PageLayout, capability: tuple[int, int]) -> list[str]:
    """What a GPU of this compute capability cannot run of ``layout``: the kernels' 16-bit tensor-core products need
    8.0 (Ampere), e4m3 checkpoints the conversion unit's fp8 type, 8.9 (Ada). Before 9.0 every verify runs the
    portable kernel (no TMA), and ``pdl`` launches plainly."""
    major, minor = capability
    if (major, minor) < (8, 0):
        return [f"compute capability {major}.{minor} < 8.0 (bf16/tf32 tensor-core products)"]
    if layout.geometry.state_dtype == torch.float8_e4m3fn and (major, minor) < (8, 9):
        return [f"float8_e4m3fn checkpoints need compute capability 8.9+ (the fp8 conversions), this GPU is "
                f"{major}.{minor}: use int8, bf16 or fp32 checkpoints"]
    return []


def _ops() -> ModuleType:
    """:mod:`ssmstate.ops.triton`, imported on first use (importing it decorates the kernels)."""
    import ssmstate.ops.triton as ops
    return ops


class TritonBackend:
    """ReplaySSM verify (both routes), commit, materialize, conv update and the fused conv + verify in Triton, on
    fp32/bf16/fp16 and 8-bit (int8, fp8_e4m3fn, with their decode scales) checkpoints, stochastically rounded when
    the cache's ``checkpoint_seed`` is set (the fused conv + verify runs unquantized layouts; 8-bit ones take the
    conv, verify pair).

    Args:
        pdl: launch ``conv`` and ``verify`` as programmatic dependents (a GPU of compute capability 9.0 or later;
            no effect before it or in the interpreter).
            A layer's conv then waits for the kernel before it and lets its verify launch at once; the verify
            reads its page ids, cursors and first checkpoint tile while the conv runs and the conv's outputs
            after it ends. The launch latency and the state's first DRAM round trip leave the critical path
            (``docs/performance.md`` has what that buys in a layer). Results are bit-identical. The one rule: the kernel
            issued right before ``manager.verify(layer)`` must not write that layer's checkpoint or rings, the
            cursors or the plan's buffers (``manager.conv`` of the layer, which writes only the conv window, or
            any of the caller's kernels, qualifies; a ``commit``, ``materialize`` or another verify of the same
            layer does not). A kernel before it that triggers its dependents early must have waited first.
            ``conv_verify`` (the layer as one launch) reads its page ids, cursors and first checkpoint tile before
            it waits: the same rule holds for the kernel issued right before it, which must not write the layer's
            conv window either (another layer's ``conv_verify`` qualifies).
    """

    name = "triton"
    reads_row_cursors = True  # the TMA kernel loads them beside the page id
    supports_stochastic_rounding = True  # flush and materialize writes, bit for bit as ssmstate.ops.quant

    def __init__(self, pdl: bool = False) -> None:
        if not isinstance(pdl, bool):
            raise ConfigError(f"pdl must be a bool, got {pdl!r}")
        self.pdl = pdl

    def check(self, layout: PageLayout, device: torch.device) -> None:
        if _TRITON_ERROR is not None:
            raise BackendUnavailableError(_TRITON_ERROR)
        if layout.scheme != "replay":
            raise BackendUnavailableError(
                f"the triton backend serves the replay layout only, got scheme {layout.scheme!r}; "
                f"use backend='reference' for the native scheme"
            )
        device = torch.device(device)
        interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
        if device.type == "cpu":
            if not interpreted:
                raise BackendUnavailableError(
                    "the triton backend runs on CPU tensors only under the Triton interpreter: set "
                    "TRITON_INTERPRET=1 before importing ssmstate (or use a CUDA device / backend='reference')"
                )
            if not _ops().INTERPRETED:
                raise BackendUnavailableError(
                    "TRITON_INTERPRET=1 was set after ssmstate's Triton kernels were imported; "
                    "set it before the first import"
                )
        elif device.type != "cuda":
            raise BackendUnavailableError(f"the triton backend needs a CUDA device (or CPU + TRITON_INTERPRET=1), got {device}")
        g, s = layout.geometry, layout.spec
        problems = []
        if device.type == "cuda" and not interpreted and torch.cuda.is_available():
            problems += arch_problems(layout, torch.cuda.get_device_capability(device))
        if g.head_dim > MAX_HEAD_DIM:
            problems.append(f"head_dim {g.head_dim} > {MAX_HEAD_DIM}")
        if g.state_size > MAX_STATE_SIZE:
            problems.append(f"state_size {g.state_size} > {MAX_STATE_SIZE}")
        if s.num_tokens > MAX_TOKENS:
            problems.append(f"T = 1 + K = {s.num_tokens} > {MAX_TOKENS}")
        if s.ring_len > MAX_RING_LEN:
            problems.append(f"ring length R = W + T = {s.ring_len} > {MAX_RING_LEN}")
        if problems:
            raise BackendUnavailableError("the triton backend cannot serve this layout: " + "; ".join(problems))

    def verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor,
               B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
               out: Tensor, pdl: bool | None = None) -> Tensor:
        """``pdl``: None for the backend's option (the layer pair of :meth:`conv_verify` may set it)."""
        t = cache.layers[layer]
        return _ops().replay_verify(
            t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start, cache.num_committed,
            x, dt, A, B, C, plan.page_ids, plan.cu_seqlens, cache.layout.spec.window, out,
            D=D, dt_bias=dt_bias, z=z, row_cursors=plan.row_cursors, pdl=self.pdl if pdl is None else pdl,
            checkpoint_scale=t.get(SCALE_NAME), sr_seed=cache.checkpoint_seed, layer=layer,
        )

    def conv(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor,
             bias: Tensor | None, activation: str | None, out: Tensor, pdl: bool | None = None) -> Tensor:
        """``pdl``: None for the backend's option (the layer pair of :meth:`conv_verify` may set it)."""
        return _ops().conv_update(cache.layers[layer]["conv"], cache.conv_shift, xBC, weight, bias,
                                  plan.page_ids, plan.cu_seqlens, out, activation=activation,
                                  pdl=self.pdl if pdl is None else pdl, row_shift=plan.row_conv_shift)

    def conv_verify(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, dt: Tensor, A: Tensor,
                    weight: Tensor, bias: Tensor | None, activation: str | None, D: Tensor | None,
                    dt_bias: Tensor | None, z: Tensor | None, out: Tensor) -> Tensor:
        """One fused launch (:func:`~ssmstate.ops.triton.replay_conv_verify`) for small steps
        (:func:`~ssmstate.ops.triton.config.fused_takes`: at most the launch table's ``fused.max_programs_per_sm``
        programs per SM, on a GPU), else ``conv`` then ``verify``; the pair too for what the fused kernel does not
        write: an 8-bit checkpoint (decode scales) or a stochastically rounded one (``checkpoint_seed`` set). With
        ``pdl`` the launch waits for the kernel before it, then lets the next one launch.

        The fused kernel always launches as a programmatic dependent (it reads the step's inputs only after its
        wait, its page and first tile before it); the pair does where the launch table's ``pair_pdl.max_rows``
        says that is faster (small steps; fp32/bf16/fp16 checkpoints): its verify reads only its own conv's output
        early, and the conv waits for everything before it.
        """
        t = cache.layers[layer]
        ops = _ops()
        plain = t["checkpoint"].dtype in ops.conv_verify.STATE_DTYPES and cache.checkpoint_seed is None
        _, H, P, N = t["checkpoint"].shape
        fused = plain and ops.config.fused_takes(plan.num_rows, H, P, N, xBC.device)
        pdl = self.pdl or fused or (plain and plan.num_rows <= ops.config.pair_pdl_max_rows())
        if not fused:
            return unfused_conv_verify(self, cache, layer, plan, xBC, dt, A, weight, bias, activation, D, dt_bias,
                                       z, out, pdl=pdl)
        return ops.replay_conv_verify(
            t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start, cache.num_committed,
            t["conv"], cache.conv_shift, xBC, dt, A, weight, bias, plan.page_ids, plan.cu_seqlens,
            cache.layout.spec.window, out, D=D, dt_bias=dt_bias, z=z, activation=activation,
            row_cursors=plan.row_cursors, counters=fused_counters(cache), pdl=pdl, row_shift=plan.row_conv_shift,
        )

    def commit(self, cache: StateCache, plan: StepPlan, accepted: Tensor, update_conv: bool,
               error_flag: Tensor) -> None:
        spec = cache.layout.spec
        _ops().replay_commit(cache.ring_start, cache.num_committed, cache.pending, cache.conv_shift,
                                    plan.page_ids, accepted, spec.window, spec.ring_len, update_conv, error_flag)

    def materialize(self, cache: StateCache, layer: int, A: Tensor, page_ids: Tensor) -> None:
        t = cache.layers[layer]
        _ops().replay_materialize(t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"],
                                  cache.ring_start, cache.num_committed, A, page_ids,
                                  window=cache.layout.spec.window, checkpoint_scale=t.get(SCALE_NAME),
                                  sr_seed=cache.checkpoint_seed, layer=layer)
