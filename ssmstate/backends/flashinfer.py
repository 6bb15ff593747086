"""FlashInfer backend: ``flashinfer.mamba`` kernels run directly on the shared page layout.

The ReplaySSM layout of ssmstate *is* FlashInfer's ``checkpointing_ssu`` layout
(checkpoint ``(pages, H, P, N)``, x ring ``(pages, H, R, P)``, B ring
``(pages, G, R, N)``, fp32 processed-dt ring ``(pages, H, R)``, ring exactly
``R = W + T`` rows), so verify hands the cache tensors and the cursors to the
kernel with no copy:

* ``ring_start`` → ``ring_start``, ``num_committed`` (c) → ``prev_num_accepted_tokens``;
* ``plan.page_ids`` → ``state_batch_indices`` with ``pad_slot_id=0`` (the null page);
* ``softplus(dt + dt_bias)`` inside (``dt_softplus=True``); A, D, dt_bias and dt
  are tied over head_dim through stride-0 expands, as FlashInfer requires.

The kernel takes the flush decision per row in-kernel
(``prev_k + seq_len > max_window`` with ``max_window = R - T``); the commit of
the reference (:func:`ssmstate.ops.reference.replay_commit`, device-side
torch ops) applies the same rule ``c + q > W``, so cursors stay in step. That is
why every call is JIT-specialised on ``T`` (``max_seqlen = T`` in varlen mode even
when the longest row is shorter): a smaller ``T`` would silently widen FlashInfer's
window to ``R - max_seqlen``.

Two input forms: a step with ``T`` tokens on every row (``tokens == rows * T``;
no row has more) goes dense, ``(rows, T, H, P)``, the form FlashInfer's autotuner
covers; anything else goes packed varlen, ``(1, tokens, H, P)`` with ``cu_seqlens``
(this also holds for plans built from an engine's tensors, whose per-row lengths
the host may not know). The two-kernel scratch
(:func:`flashinfer.mamba.allocate_checkpointing_ssu_scratch`) is allocated once
per cache for the manager's ``max_batch`` rows, on first use (or by
:meth:`FlashInferBackend.reserve`), and shared by every layer, so a verify
allocates nothing and can be captured in a CUDA graph once it has run once.

The native scheme (:meth:`PageLayout.native`) runs FlashInfer's
``selective_state_update`` in its multi-token form: the row starts from the
state of the last accepted token (page ``page_table[r, state_slot + 1 - 1]``
through ``num_accepted_tokens``) and writes the state after window token ``i``
to ``page_table[r, i]``, exactly :func:`ssmstate.ops.reference_native.native_verify`.

The conv update is vLLM's Triton ``causal_conv1d_update`` (the conv vLLM pairs
with ``checkpointing_ssu``) on the replay window, one launch per layer, graph
capturable (:mod:`ssmstate.backends.flashinfer_conv` has the mapping); where vLLM's
kernel cannot be imported, and on the native scheme, it is the reference function
(a host loop: not capturable). The commit is the Triton one-launch commit on a CUDA
device when Triton is importable, else the reference (device-side torch ops);
materialize is the reference.

``algorithm="auto"`` passes, per form (dense or varlen) and batch, the algorithm
:meth:`FlashInferBackend.tune` measured fastest (:mod:`ssmstate.backends.flashinfer_tune`);
before any tune, FlashInfer's own choice. flashinfer-python is optional: this module
imports without it, and every check that does not need it runs first, so CPU CI can
test the errors.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import attrs
import torch

from ssmstate.backends import flashinfer_tune as ft
from ssmstate.backends.flashinfer_checks import (  # noqa: F401 (the layout checks are this module's API too)
    MAX_NATIVE_TOKENS,
    MAX_WINDOW,
    QUANT_HEAD_DIM,
    check_device,
    check_gpu,
    check_layout,
    import_flashinfer,
    unsupported_reasons,
)
from ssmstate.backends.flashinfer_checks import OTHERS as _OTHERS
from ssmstate.backends.flashinfer_conv import VllmConv, import_vllm_conv
from ssmstate.backends.flashinfer_tune import autotune
from ssmstate.backends.layer_step import plan_capacity
from ssmstate.backends.reference import ReferenceBackend
from ssmstate.cache import StateCache
from ssmstate.dtypes import is_quantized
from ssmstate.errors import BackendUnavailableError, ConfigError, ShapeError
from ssmstate.layout import SCALE_NAME, PageLayout
from ssmstate.plan import StepPlan

Tensor = torch.Tensor

#: ``algorithm`` values of ``checkpointing_ssu``: FlashInfer's choice (its autotuned
#: tactic for dense calls, else two-kernel when ``rows * H >= SMs``), or forced.
ALGORITHMS = ("auto", "monolith", "two-kernel")
#: ``algorithm`` values of the native ``selective_state_update`` path.
NATIVE_ALGORITHMS = ("auto", "simple")
#: ``conv`` values: vLLM's Triton kernel where importable else the reference, vLLM's or nothing, the reference.
CONVS = ("auto", "vllm", "reference")
#: checkpoint dtypes whose writes checkpointing_ssu rounds stochastically with a ``rand_seed`` (Philox bits: the
#: same distribution as ssmstate.ops.quant's rounding, not the same bits); a bf16 checkpoint it rounds to nearest
SR_STATES = (torch.float16, torch.int8, torch.float8_e4m3fn)


# -- per-call argument checks (after the manager's shape/dtype checks) ---------------

def _check_rows(name: str, t: Tensor, inner: int, last: int) -> None:
    """``t`` is (tokens, inner, last): each token's (inner, last) block contiguous and 16-byte aligned."""
    es = t.element_size()
    if t.stride(2) != 1 or t.stride(1) != last:
        raise ShapeError(
            f"flashinfer backend: {name} needs its last two dims contiguous (strides (*, {last}, 1)), "
            f"got strides {tuple(t.stride())}; pass {name}.contiguous()"
        )
    if t.data_ptr() % 16 or (t.shape[0] > 1 and (t.stride(0) * es) % 16):
        raise ShapeError(
            f"flashinfer backend: {name} must be 16-byte aligned per token (address {t.data_ptr():#x}, "
            f"token stride {t.stride(0)} elements)"
        )


def _check_dt(dt: Tensor) -> None:
    if dt.shape[1] > 1 and dt.stride(1) != 1:
        raise ShapeError(f"flashinfer backend: dt needs unit stride over heads, got strides {tuple(dt.stride())}")


@attrs.define(eq=False)
class _CacheBuffers:
    """Per-cache persistent buffers; older ones stay alive for graphs captured with them."""

    rows: int = 0
    scratch: tuple[Tensor, Tensor, Tensor] | None = None
    num_accepted: Tensor | None = None  # native: (rows,) int32
    dt32: Tensor | None = None  # native: (rows * T, H) fp32
    retired: list[object] = attrs.field(factory=list)


class FlashInferBackend(ReferenceBackend):
    """FlashInfer kernels on the shared layout; vLLM's Triton conv, Triton commit, reference materialize.

    Args:
        algorithm: ``checkpointing_ssu`` kernel choice: ``"auto"`` (per form and batch, the
            algorithm :meth:`tune` measured fastest; before any tune, FlashInfer's choice: its
            autotuned tactic for dense calls, see :func:`autotune`, else two-kernel when
            ``rows * H >= SMs``), ``"monolith"`` or ``"two-kernel"`` (forced).
        native_algorithm: ``selective_state_update`` algorithm for the native
            scheme (``"auto"`` or ``"simple"``; Hopper runs ``simple`` either way).
        conv: ``"auto"`` (vLLM's Triton conv update on the replay window where it imports, else the
            reference with a warning), ``"vllm"`` (required: :meth:`check` refuses without it) or
            ``"reference"``.

    Set ``backend.algorithm`` after construction to switch (validated), e.g.
    ``StateManager(..., backend="flashinfer").backend.algorithm = "monolith"``.
    """

    name = "flashinfer"
    reads_row_cursors = False  # checkpointing_ssu reads each page's cursors itself: no per-step gather
    #: flush writes take checkpointing_ssu's ``rand_seed`` (the cache's device seed): fp16, int8 and fp8 checkpoints
    #: (:data:`SR_STATES`); verify refuses a bf16 one. Materialize is the reference's (ssmstate.ops.quant's bits).
    supports_stochastic_rounding = True

    def __init__(self, algorithm: str = "auto", native_algorithm: str = "auto", conv: str = "auto") -> None:
        self.algorithm = algorithm
        self.native_algorithm = native_algorithm
        if conv not in CONVS:
            raise ConfigError(f"flashinfer conv must be one of {CONVS}, got {conv!r}")
        self.conv_choice = conv
        self._buffers: weakref.WeakKeyDictionary[StateCache, _CacheBuffers] = weakref.WeakKeyDictionary()
        self._weights: dict[tuple[Any, ...], Tensor] = {}
        self._fim: ModuleType | None = None
        self._vconv: VllmConv | None = None
        self._conv_note: str | None = None
        self._conv_warned = False
        #: (form, rows) -> algorithm, filled by tune(); ``tune_report`` keeps the times behind each choice
        self.chosen: dict[tuple[str, int], str] = {}
        self.tune_report: list[dict[str, Any]] = []
        self._forced: str | None = None

    # -- options ---------------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        return self._algorithm

    @algorithm.setter
    def algorithm(self, value: str) -> None:
        if value not in ALGORITHMS:
            raise ConfigError(f"flashinfer algorithm must be one of {ALGORITHMS}, got {value!r}")
        self._algorithm = value

    @property
    def native_algorithm(self) -> str:
        return self._native_algorithm

    @native_algorithm.setter
    def native_algorithm(self, value: str) -> None:
        if value not in NATIVE_ALGORITHMS:
            raise ConfigError(f"flashinfer native_algorithm must be one of {NATIVE_ALGORITHMS}, got {value!r}")
        self._native_algorithm = value

    # -- protocol ----------------------------------------------------------------------
    def check(self, layout: PageLayout, device: torch.device) -> None:
        """Layout limits first, then the device, then the imports, then the GPU's capability."""
        check_layout(layout)
        device = check_device(device)
        self._fim = import_flashinfer()
        if self.conv_choice == "vllm" and layout.scheme == "replay":
            self._vllm_conv(required=True)
        check_gpu(device)

    @property
    def conv_impl(self) -> str:
        """Which conv runs on the replay layout: ``"vllm-triton"`` or ``"reference"`` (imports on first ask)."""
        return "vllm-triton" if self._vllm_conv(required=False) is not None else "reference"

    def _vllm_conv(self, required: bool) -> VllmConv | None:
        if self._vconv is None and self.conv_choice != "reference" and self._conv_note is None:
            try:
                self._vconv = VllmConv(import_vllm_conv())
            except BackendUnavailableError as exc:
                self._conv_note = str(exc)
        if self._vconv is None and required:
            raise BackendUnavailableError(
                f"flashinfer backend with conv='vllm': {self._conv_note or 'conv=reference was chosen'}; "
                "install vLLM (or provide its kernel module), or pass conv='auto' for the reference conv")
        return self._vconv

    def _mamba(self) -> ModuleType:
        if self._fim is None:
            self._fim = import_flashinfer()
        return self._fim

    def reserve(self, cache: StateCache, max_batch: int) -> None:
        """Allocate ``cache``'s persistent buffers for up to ``max_batch`` rows now (before a capture).

        Replay: FlashInfer's two-kernel scratch. Native: the accepted-count and
        fp32 dt buffers. :meth:`verify` calls this itself on first use with the
        plan's capacity (the manager's ``max_batch``); call it explicitly to size
        for a different batch.
        """
        buf = self._buffers.get(cache)
        if buf is None:
            buf = self._buffers[cache] = _CacheBuffers()
        if max_batch <= buf.rows:
            return
        layout = cache.layout
        g, s = layout.geometry, layout.spec
        H = g.heads_per_rank
        if buf.rows:
            buf.retired.append((buf.scratch, buf.num_accepted, buf.dt32))
        if layout.scheme == "replay":
            buf.scratch = self._mamba().allocate_checkpointing_ssu_scratch(
                max_batch, H, s.num_tokens, s.window, g.act_dtype, cache.device)
        else:
            buf.num_accepted = torch.zeros((max_batch,), dtype=torch.int32, device=cache.device)
            buf.dt32 = torch.zeros((max_batch * s.num_tokens, H), dtype=torch.float32, device=cache.device)
        buf.rows = max_batch

    def release(self, cache: StateCache) -> None:
        """Drop ``cache``'s persistent buffers (graphs captured with them must not be replayed after)."""
        self._buffers.pop(cache, None)

    def _buffers_for(self, cache: StateCache, plan: StepPlan) -> _CacheBuffers:
        buf = self._buffers.get(cache)
        if buf is None or buf.rows < plan.num_rows:
            self.reserve(cache, plan_capacity(plan))
            buf = self._buffers[cache]
        return buf

    def _tied(self, t: Tensor | None, dtype: torch.dtype | None, tag: str) -> Tensor | None:
        """``t`` (H,) with unit stride and ``dtype``: ``t`` itself, or a converted copy made once.

        The copy is cached by address, version and dtype: weights are static, so
        only the first call (before any capture) converts.
        """
        if t is None:
            return None
        want = t.dtype if dtype is None else dtype
        if t.dtype == want and t.stride(0) == 1:
            return t
        try:
            version = t._version
        except RuntimeError:  # inference tensors keep no version: convert every call
            return t.to(want).contiguous()
        key = (tag, t.data_ptr(), version, t.dtype, want, t.shape[0], t.stride(0), t.device)
        hit = self._weights.get(key)
        if hit is None:
            if len(self._weights) > 4096:
                self._weights.clear()
            hit = self._weights[key] = t.to(want).contiguous()
        return hit

    def _zeros(self, H: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = ("zeros", H, dtype, device)
        hit = self._weights.get(key)
        if hit is None:
            hit = self._weights[key] = torch.zeros((H,), dtype=dtype, device=device)
        return hit

    def _check_inputs(self, x: Tensor, dt: Tensor, B: Tensor, C: Tensor, z: Tensor | None, out: Tensor) -> None:
        H, P = x.shape[1], x.shape[2]
        G, N = B.shape[1], B.shape[2]
        _check_rows("x", x, H, P)
        _check_rows("B", B, G, N)
        _check_rows("C", C, G, N)
        _check_rows("out", out, H, P)
        if z is not None:
            _check_rows("z", z, H, P)
        _check_dt(dt)
        if x.shape[0] >= 1 << 23:
            raise ShapeError(f"flashinfer backend: {x.shape[0]} tokens in one step; at most {(1 << 23) - 1}")

    def verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor,
               B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
               out: Tensor) -> Tensor:
        """Outputs of every token of the step for one layer (see the module docstring).

        Args:
            x: (tokens, H, P) bf16/fp16, (H, P) contiguous per token, 16-byte aligned.
            dt: (tokens, H) raw, unit stride over heads, any float dtype.
            A: (H,) float. B, C: (tokens, G, N) like x. D, dt_bias: (H,) or None.
            z: (tokens, H, P) gate or None. out: (tokens, H, P), written.
        Returns:
            ``out``. Replay padding rows are left untouched; the native kernel
            writes padding rows' outputs (``D x`` from a zero state).
        """
        self._check_inputs(x, dt, B, C, z, out)
        if cache.layout.scheme == "native":
            return self._native_verify(cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out)
        scale, seed = self._quant_args(cache, layer)
        fim = self._mamba()
        t = cache.layers[layer]
        g, s = cache.layout.geometry, cache.layout.spec
        H, P, N = g.heads_per_rank, g.head_dim, g.state_size
        T, rows, L = s.num_tokens, plan.num_rows, plan.total_tokens
        buf = self._buffers_for(cache, plan)
        cb_scaled, cumAdt_vec, cb_old = buf.scratch  # type: ignore[misc]
        A1 = self._tied(A, None, "A")
        # D and dt_bias share one JIT weight dtype: keep theirs, or go fp32 (lossless) if they differ.
        wdt = None if D is None or dt_bias is None or D.dtype == dt_bias.dtype else torch.float32
        D1, b1 = self._tied(D, wdt, "D"), self._tied(dt_bias, wdt, "dt_bias")
        A3 = A1.view(H, 1, 1).expand(H, P, N)
        D2 = None if D1 is None else D1.view(H, 1).expand(H, P)
        b2 = None if b1 is None else b1.view(H, 1).expand(H, P)
        if L == rows * T:  # every row has T tokens (none has more): dense
            shape, form = (rows, T), "dense"
            cu, max_seqlen = None, None
        else:
            shape, form = (1, L), "varlen"
            cu, max_seqlen = plan.cu_seqlens, T
        xv, Bv, Cv, ov = (v.unflatten(0, shape) for v in (x, B, C, out))
        zv = None if z is None else z.unflatten(0, shape)
        dtv = dt.unflatten(0, shape).unsqueeze(-1).expand(*shape, H, P)
        fim.checkpointing_ssu(
            t["checkpoint"], t["x_ring"], t["B_ring"], t["dt_ring"], cache.ring_start, cache.num_committed,
            xv, dtv, A3, Bv, Cv, ov, D=D2, z=zv, dt_bias=b2, dt_softplus=True,
            state_batch_indices=plan.page_ids, pad_slot_id=0, cu_seqlens=cu, max_seqlen=max_seqlen,
            cb_scaled=cb_scaled, cumAdt_vec=cumAdt_vec, cb_old=cb_old,
            algorithm=self.algorithm_for(form, rows, quantized=scale is not None), state_scale=scale, rand_seed=seed,
        )
        return out

    def _quant_args(self, cache: StateCache, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """(state_scale, rand_seed) of a replay verify: an 8-bit checkpoint's decode scales (its verify runs the
        monolithic kernel, FlashInfer's only 8-bit one: :meth:`algorithm_for`), the cache's stochastic-rounding
        seed where set. Refuses, before any import or launch, what checkpointing_ssu cannot do."""
        dtype = cache.layout.geometry.state_dtype
        seed = cache.checkpoint_seed
        if seed is not None and dtype not in SR_STATES:
            raise BackendUnavailableError(
                f"flashinfer backend: checkpointing_ssu rounds a {dtype} checkpoint to nearest only; "
                f"stochastic rounding needs an fp16, int8 or fp8 checkpoint here ({_OTHERS})")
        if not is_quantized(dtype):
            return None, seed
        if self.algorithm == "two-kernel":
            raise BackendUnavailableError(
                f"flashinfer backend: checkpointing_ssu's two-kernel path takes no 8-bit checkpoint; use "
                f"algorithm 'auto' or 'monolith' ({_OTHERS})")
        return cache.layers[layer][SCALE_NAME], seed

    def algorithm_for(self, form: str, rows: int, quantized: bool = False) -> str:
        """The ``algorithm`` a ``form`` ("dense" or "varlen") call of ``rows`` rows passes.

        An 8-bit (``quantized``) checkpoint always takes ``"monolith"``, checkpointing_ssu's only 8-bit kernel
        (:meth:`_quant_args` has refused a forced ``"two-kernel"``). Otherwise a forced :attr:`algorithm` wins.
        With ``"auto"``: the choice :meth:`tune` made for that form at ``rows`` (else at the smallest tuned batch
        above it, else the largest tuned one); with no tune for the form, ``"auto"`` (FlashInfer's choice).
        """
        if quantized:
            return "monolith"
        if self._forced is not None:
            return self._forced
        if self.algorithm != "auto":
            return self.algorithm
        sizes = sorted(b for f, b in self.chosen if f == form)
        if not sizes:
            return "auto"
        above = [b for b in sizes if b >= rows]
        return self.chosen[(form, above[0] if above else sizes[-1])]

    def conv(self, cache: StateCache, layer: int, plan: StepPlan, xBC: Tensor, weight: Tensor,
             bias: Tensor | None, activation: str | None, out: Tensor) -> Tensor:
        """vLLM's Triton conv update on the replay window (one launch, capturable); the reference otherwise."""
        vconv = self._vllm_conv(required=False) if cache.layout.scheme == "replay" else None
        if vconv is None:
            if self._conv_note is not None and not self._conv_warned:
                warnings.warn(f"flashinfer backend: reference conv (a host loop, not graph-capturable): "
                              f"{self._conv_note}", RuntimeWarning, stacklevel=3)
                self._conv_warned = True
            return super().conv(cache, layer, plan, xBC, weight, bias, activation, out)
        return vconv(cache, layer, plan, xBC, weight, bias, activation, out, plan_capacity(plan))

    def commit(self, cache: StateCache, plan: StepPlan, accepted: Tensor, update_conv: bool,
               error_flag: Tensor) -> None:
        """The Triton commit (one launch) on a CUDA device where Triton imports; the reference otherwise."""
        if cache.layout.scheme == "replay" and cache.device.type == "cuda":
            try:
                from ssmstate.ops import triton as trk
            except ImportError:
                trk = None
            if trk is not None:
                spec = cache.layout.spec
                trk.replay_commit(cache.ring_start, cache.num_committed, cache.pending, cache.conv_shift,
                                  plan.page_ids, accepted, spec.window, spec.ring_len, update_conv, error_flag)
                return
        super().commit(cache, plan, accepted, update_conv, error_flag)

    def _native_verify(self, cache: StateCache, layer: int, plan: StepPlan, x: Tensor, dt: Tensor, A: Tensor,
                       B: Tensor, C: Tensor, D: Tensor | None, dt_bias: Tensor | None, z: Tensor | None,
                       out: Tensor) -> Tensor:
        fim = self._mamba()
        g, s = cache.layout.geometry, cache.layout.spec
        H, P, N = g.heads_per_rank, g.head_dim, g.state_size
        T, rows, L = s.num_tokens, plan.num_rows, plan.total_tokens
        buf = self._buffers_for(cache, plan)
        # Start state: page_table[r, state_slot]; FlashInfer reads index (num_accepted - 1).
        nat = buf.num_accepted[:rows]  # type: ignore[index]
        torch.index_select(cache.state_slot, 0, plan.page_ids, out=nat)
        nat.add_(1)
        # dt, D and dt_bias share one weight dtype there: fp32 (lossless; weights cast once, dt copied).
        if dt.dtype != torch.float32:
            dt32 = buf.dt32[:L]  # type: ignore[index]
            dt32.copy_(dt)
            dt = dt32
        D1 = self._tied(D, torch.float32, "D") if D is not None else self._zeros(H, torch.float32, x.device)
        b1 = self._tied(dt_bias, torch.float32, "dt_bias")
        A1 = self._tied(A, None, "A")
        A3 = A1.view(H, 1, 1).expand(H, P, N)
        D2 = D1.view(H, 1).expand(H, P)
        b2 = None if b1 is None else b1.view(H, 1).expand(H, P)
        if L == rows * T:
            shape: tuple[int, ...] = (rows, T)
            xv, Bv, Cv, ov = (v.unflatten(0, shape) for v in (x, B, C, out))
            zv = None if z is None else z.unflatten(0, shape)
            dtv = dt.unflatten(0, shape).unsqueeze(-1).expand(rows, T, H, P)
            cu = None
        else:
            xv, Bv, Cv, ov, zv = x, B, C, out, z
            dtv = dt.unsqueeze(-1).expand(L, H, P)
            cu = plan.cu_seqlens
        fim.selective_state_update(
            cache.layers[layer]["state"], xv, dtv, A3, Bv, Cv, D2, z=zv, dt_bias=b2, dt_softplus=True,
            state_batch_indices=plan.page_table, dst_state_batch_indices=plan.page_table, pad_slot_id=0,
            out=ov, cache_steps=T, cu_seqlens=cu, num_accepted_tokens=nat, algorithm=self.native_algorithm,
        )
        return out

    # -- autotuning ----------------------------------------------------------------------
    def autotune(self, batch_sizes: Sequence[int] | None = None,
                 cache: str | os.PathLike[str] | None = None) -> contextlib.AbstractContextManager[None]:
        """:func:`autotune` (a context manager); dense verify calls inside it are profiled."""
        return autotune(batch_sizes, cache)

    def tune(self, layout: PageLayout, device: torch.device | str, batch_sizes: Sequence[int],
             cache: str | os.PathLike[str] | None = None, seed: int = 0, call: ft.CallShape | None = None,
             reps: int = 10) -> list[dict[str, Any]]:
        """Tune ``checkpointing_ssu`` for every batch size a runner will use, before serving (or capturing).

        1. FlashInfer's autotuner profiles one dense verify per batch size, made through :meth:`verify` on a
           private one-layer cache with inputs shaped like the runner's (``call``, default
           :meth:`CallShape.vllm <ssmstate.backends.flashinfer_tune.CallShape.vllm>`: D and dt_bias present),
           so the tactics land under the key the served calls look up. Tactics persist for the process (and
           in ``cache``, a JSON file, when given).
        2. Each batch size is then timed (cold pages, CUDA graphs, ``reps`` replays) on every algorithm its
           form can take (:data:`~ssmstate.backends.flashinfer_tune.CANDIDATES`); with ``algorithm="auto"``
           verify passes the fastest from then on (:meth:`algorithm_for`).

        Returns (and keeps in :attr:`tune_report`) one dict per (form, batch): the times and the choice; on the
        GPU a dense entry also says what FlashInfer's tuner hands its calls (``auto_runs``) and, where that is no
        tactic, why (``tuner_miss``, ``tuner_warnings``).
        The runner's own state is never touched.
        """
        self.check(layout, device)
        if layout.scheme != "replay":
            raise BackendUnavailableError("tune: only the replay scheme (checkpointing_ssu) is autotuned")
        sizes = sorted({int(b) for b in batch_sizes})
        if not sizes or sizes[0] < 1:
            raise BackendUnavailableError(f"tune: batch_sizes must be positive ints, got {list(batch_sizes)}")
        device = torch.device(device)
        call = ft.CallShape.vllm(layout) if call is None else call
        self.tune_report = ft.tune(self, layout, device, sizes, cache, call, seed, reps)
        self.chosen.update({(r["form"], r["batch"]): r["chosen"] for r in self.tune_report})
        return self.tune_report

    @contextlib.contextmanager
    def forcing(self, algorithm: str) -> Iterator[None]:
        """Every replay verify inside the block passes ``algorithm`` (the tuning probes)."""
        saved, self._forced = self._forced, algorithm
        try:
            yield
        finally:
            self._forced = saved

    def run_probe(self, cache: StateCache, pr: ft.Probe, j: int) -> Tensor:
        """One verify of probe ``pr`` on its ``j``-th page set of ``cache`` (layer 0), through :meth:`verify`."""
        i = pr.inputs
        return self.verify(cache, 0, pr.plans[j], i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["dt_bias"],
                           i["z"], i["out"])
