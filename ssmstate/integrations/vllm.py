"""ssmstate inside vLLM's Model Runner V2 (vLLM 0.32.x, 0.33.x, 0.34.x), through vLLM's plugin hooks.

Turn it on with ``SSMSTATE_VLLM=1`` in the environment of every vLLM process;
``--additional-config '{"ssmstate": {...}}'`` carries its settings (window,
backend, pdl), never the switch. vLLM loads
:func:`ssmstate.integrations.vllm_plugin.register` from the
``vllm.general_plugins`` entry point in every process; it imports this module
(and so vLLM's internals) only while the switch is on. See docs/vllm.md.

The embedding, hook by hook:

* **Pages.** vLLM's ``BlockPool`` owns the block ids and *they are our page ids*
  (block 0 is vLLM's null block and our null page). Each Mamba layer's page
  holds the DESIGN layout (checkpoint, x/B/dt rings, conv window):
  :class:`SSMStateMambaSpec` is a ``MambaSpec`` whose shapes are
  :attr:`PageLayout.tensors`, so its page is ``PageLayout.layer_page_bytes``,
  and whose ``num_speculative_blocks`` is always 0: one block per request and
  group whatever K is. It is registered with vLLM's own ``MambaManager``.
* **Page sizing.** vLLM sizes pages twice: at config time from the model
  classmethods ``get_mamba_state_shape_from_config``/``..._dtype_...`` (the
  platform raises the attention block size to cover the Mamba page) and at init
  from each layer's ``get_state_shape``. Both come from :func:`layout_for`, so
  they cannot disagree (the mismatch that crashes vLLM at init).
* **Layers.** :class:`SSMStateMambaMixer2` replaces ``MambaMixer2`` (vLLM's
  out-of-tree pluggable-layer hook). Prefill rows run vLLM's own prefill path on
  our checkpoint and conv views; decode / verify rows run
  ``StateManager.conv`` and ``StateManager.verify`` on a :class:`StepPlan`
  built from vLLM's Mamba2 decode metadata (``state_indices_tensor_d[:, 0]``,
  ``query_start_loc_d``, padding rows on ``NULL_BLOCK_ID = 0``), with no host
  sync.
* **Model state.** :class:`SSMStateNemotronHForCausalLM` returns
  :class:`SSMStateModelState` from ``get_model_state_cls``. It builds each
  step's plans in ``prepare_attn``, commits ``num_sampled`` into our cursors on
  the device in ``postprocess_state`` (right after rejection sampling) and zeroes
  a new request's cursors in ``add_request``.

With the switch on, every configuration the plugin cannot serve is refused
with :class:`~ssmstate.errors.UnsupportedConfigError` while vLLM builds its
config (:func:`check_config`), before any model is loaded. The settings, the refusals and the
layout both sizing paths use live in :mod:`ssmstate.integrations.vllm_config`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
from vllm.v1.attention.backends.utils import NULL_BLOCK_ID
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

from ssmstate.cache import StateCache
from ssmstate.errors import ConfigError, SSMStateError
from ssmstate.integrations.engine_pages import page_views, plan_from_mamba2_metadata  # noqa: F401  (re-exported)
from ssmstate.integrations.prefill import (
    needs_staging,
    prefill_conv_view,
    settle_conv_history,
    stage_checkpoints,
    store_staged,
)
from ssmstate.integrations.vllm_config import (  # the configuration side; its names are re-exported here
    CONFIG_KEY,  # noqa: F401
    CONFIG_SETTINGS,  # noqa: F401
    MAMBA2_ARCHITECTURES,  # noqa: F401
    SUPPORTED_ARCHITECTURES,
    VllmSettings,  # noqa: F401
    check_config,  # noqa: F401
    checkpoint_dtype,
    is_enabled,
    layout_for,
    layout_from_vllm_config,
    mamba2_dtypes,
    register_config_checks,
    settings_from_vllm_config,
)
from ssmstate.integrations.vllm_plugin import (  # the switch and versions live with the entry point
    ENV_SWITCH,  # noqa: F401  (re-exported)
    SUPPORTED_VLLM_SERIES,  # noqa: F401  (re-exported)
    check_vllm_version,
    installed_vllm_version,
    switch_on,
)
from ssmstate.layout import CURSORS_PER_PAGE, PageLayout
from ssmstate.manager import StateManager
from ssmstate.plan import StepPlan

assert NULL_BLOCK_ID == 0, "ssmstate's null page is page 0; vLLM's null block must be block 0"


# -- KV-cache spec -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SSMStateMambaSpec(MambaSpec):
    """A Mamba page in ssmstate's replay layout: one block per request whatever K is.

    ``shapes``/``dtypes`` are :attr:`PageLayout.tensors` in order, so
    ``state_content_size_bytes == PageLayout.layer_page_bytes``. Cursors (16 bytes
    per block, shared by a group's layers) live outside the page.
    """

    window: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_speculative_blocks != 0:
            raise ConfigError(
                "SSMStateMambaSpec verifies the whole window off one checkpoint: "
                f"num_speculative_blocks must be 0, got {self.num_speculative_blocks}"
            )
        if self.mamba_cache_mode != "none":
            raise ConfigError(f"SSMStateMambaSpec needs mamba_cache_mode='none', got {self.mamba_cache_mode!r}")


def spec_from_layout(layout: PageLayout, vllm_config: VllmConfig) -> SSMStateMambaSpec:
    """The KV-cache spec vLLM allocates and schedules for one of our Mamba layers."""
    cc = vllm_config.cache_config
    return SSMStateMambaSpec(
        shapes=tuple(t.shape for t in layout.tensors),
        dtypes=tuple(t.dtype for t in layout.tensors),
        block_size=cc.mamba_block_size,
        page_size_padded=cc.mamba_page_size_padded,
        mamba_cache_mode=cc.mamba_cache_mode,
        num_speculative_blocks=0,
        window=layout.spec.window,
    )


# -- model class: config-time shape hooks and the model-state hook -------------------

class SSMStateNemotronHForCausalLM(NemotronHForCausalLM):
    """NemotronH whose Mamba pages are ssmstate pages (when enabled for the config)."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        if not is_enabled(vllm_config):
            return super().get_mamba_state_shape_from_config(vllm_config)
        return tuple(t.shape for t in layout_from_vllm_config(vllm_config).tensors)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        if not is_enabled(vllm_config):
            return super().get_mamba_state_dtype_from_config(vllm_config)
        return tuple(t.dtype for t in layout_from_vllm_config(vllm_config).tensors)

    def get_model_state_cls(self) -> type[MambaHybridModelState]:
        cfg = getattr(self, "vllm_config", None) or get_current_vllm_config()
        return SSMStateModelState if is_enabled(cfg) else MambaHybridModelState


# -- layer ------------------------------------------------------------------------------

class SSMStateMambaMixer2(MambaMixer2):
    """``MambaMixer2`` whose decode/verify rows run through a :class:`StateManager`.

    Installed with vLLM's out-of-tree pluggable-layer hook, so every in-tree
    ``MambaMixer2(...)`` builds this class; with ssmstate disabled it behaves
    exactly like the stock layer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = get_current_vllm_config()
        self.ssmstate_enabled = is_enabled(cfg)
        self.ssmstate_layout: PageLayout | None = None
        #: set by :class:`VllmStateRuntime`: (group, index of this layer in the group).
        self.ssmstate_slot: tuple[_GroupState, int] | None = None
        self.ssmstate_views: dict[str, torch.Tensor] = {}
        self.ssmstate_prefill_conv: torch.Tensor | None = None
        if self.ssmstate_enabled:
            conv, _, act = mamba2_dtypes(cfg)
            settings = settings_from_vllm_config(cfg)
            self.ssmstate_layout = layout_for(
                num_heads=self.num_heads, head_dim=self.head_dim, state_size=self.ssm_state_size,
                n_groups=self.n_groups, conv_kernel=self.conv_kernel_size, tp_size=self.tp_size,
                ssm_dtype=checkpoint_dtype(cfg, settings), act_dtype=act, conv_dtype=conv,
                num_speculative_tokens=self.num_spec, window=settings.window,
            )
            config_layout = layout_from_vllm_config(cfg)
            if config_layout.layer_page_bytes != self.ssmstate_layout.layer_page_bytes:
                raise ConfigError(
                    f"layer {self.prefix}: page {self.ssmstate_layout.layer_page_bytes} B differs from the "
                    f"config-time page {config_layout.layer_page_bytes} B"
                )

    def get_state_shape(self):
        if self.ssmstate_layout is None:
            return super().get_state_shape()
        return tuple(t.shape for t in self.ssmstate_layout.tensors)

    def get_state_dtype(self):
        if self.ssmstate_layout is None:
            return super().get_state_dtype()
        return tuple(t.dtype for t in self.ssmstate_layout.tensors)

    def get_kv_cache_spec(self, vllm_config: VllmConfig):
        if self.ssmstate_layout is None:
            return super().get_kv_cache_spec(vllm_config)
        return spec_from_layout(self.ssmstate_layout, vllm_config)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Slice the raw page into our named views; expose (conv, ssm) to vLLM's prefill path."""
        if self.ssmstate_layout is None:
            return super().bind_kv_cache(kv_cache)
        self.ssmstate_views = page_views(self.ssmstate_layout, kv_cache)
        self.ssmstate_prefill_conv = prefill_conv_view(self.ssmstate_views["conv"], self.conv_kernel_size,
                                                       is_conv_state_dim_first())
        self.kv_cache = (self.ssmstate_prefill_conv, self.ssmstate_views["checkpoint"])

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        if self.ssmstate_layout is None:
            return super().conv_ssm_forward(projected_states, output)
        md_all = get_forward_context().attn_metadata
        if md_all is not None and not isinstance(md_all, dict):
            raise SSMStateError("ssmstate needs one attention-metadata dict per step (micro-batching is unsupported)")
        md = md_all.get(self.prefix) if md_all is not None else None
        staged = self.ssmstate_slot is not None and needs_staging(self.ssmstate_slot[0].manager)
        if md is None or (md.num_decodes == 0 and not staged):
            return super().conv_ssm_forward(projected_states, output)
        nd = md.num_decode_tokens
        if md.num_prefills > 0:
            # vLLM's own prefill path on our checkpoint/conv views (or staged copies), prefill tokens only.
            md_all[self.prefix] = dataclasses.replace(
                md, num_decodes=0, num_decode_tokens=0, state_indices_tensor_d=None, query_start_loc_d=None,
                num_accepted_tokens=None)
            try:
                if staged:
                    self.ssmstate_staged_prefill(projected_states[nd:], output[nd:], md_all, md)
                else:
                    super().conv_ssm_forward(projected_states[nd:], output[nd:])
            finally:
                md_all[self.prefix] = md
        if md.num_decodes > 0:
            self.ssmstate_decode(projected_states[:nd], output[:nd])

    def ssmstate_staged_prefill(self, projected_states: torch.Tensor, output: torch.Tensor,
                                md_all: dict[str, Any], md: Any) -> None:
        """vLLM's prefill kernels on fp32 staging copies of the rows' states; then ssmstate encodes them.

        vLLM's kernels write a plain cast of the final state into the tensor they get: they cannot
        write 8-bit codes with scales, nor round stochastically. Each prefill row's state is decoded
        into an ``(1 + n, H, P, N)`` fp32 staging tensor and its conv history copied out; the prefill runs
        on those (state indices 1..n: vLLM's kernels skip index 0, its null block); the result is encoded
        back (``store_staged``, which leaves the null page alone) and the history copied back. All on the
        device, no host sync; the staging lives for this call only.
        """
        group, index = self.ssmstate_slot  # type: ignore[misc]
        sid = md.state_indices_tensor_p
        # staging row 0 stands for vLLM's null block (its kernels skip index 0): the rows go to 1..n
        p = torch.cat([torch.zeros_like(sid[:1]), sid]).long()
        has = md.has_initial_states_p
        has = None if has is None else torch.cat([torch.zeros_like(has[:1]), has])
        conv_view = self.ssmstate_prefill_conv
        ssm_stage = stage_checkpoints(group.manager, index, p.to(torch.int32), has)
        conv_stage = conv_view[p]
        md_all[self.prefix] = dataclasses.replace(md_all[self.prefix], state_indices_tensor_p=torch.arange(
            1, sid.shape[0] + 1, dtype=sid.dtype, device=sid.device))
        self.kv_cache = (conv_stage, ssm_stage)
        try:
            super().conv_ssm_forward(projected_states, output)
        finally:
            self.kv_cache = (conv_view, self.ssmstate_views["checkpoint"])
        live = (p != 0).view(-1, *([1] * (conv_stage.dim() - 1)))
        conv_view[p] = torch.where(live, conv_stage, conv_view[p])
        store_staged(group.manager, index, p.to(torch.int32), ssm_stage)

    def ssmstate_decode(self, projected_states: torch.Tensor, output: torch.Tensor) -> None:
        """Decode/verify rows: conv + SSM through the group's :class:`StateManager` and open plan."""
        if self.ssmstate_slot is None:
            raise SSMStateError(f"layer {self.prefix} was never attached to an ssmstate runtime")
        group, index = self.ssmstate_slot
        plan = group.plan
        if plan is None:
            raise SSMStateError(f"layer {self.prefix}: decode rows but no open ssmstate step")
        if group.dry and index in plan.conv_layers:
            # CUDA-graph capture and warm-up run the forward again on the same metadata. A dry plan
            # points every row at the null page, which no kernel writes, so a rerun changes nothing.
            plan.conv_layers.discard(index)
            plan.verified_layers.discard(index)
        nd = plan.total_tokens
        xBC, dt = torch.split(projected_states[:nd, self.tped_intermediate_size:],
                              [self.tped_conv_size, self.tped_dt_size], dim=-1)
        m = group.manager
        g = m.geometry
        # one verb per layer: the conv output (x, B, C in the split order of split_hidden_states_B_C_fn) feeds
        # the verify inside the backend (one kernel on the triton backend)
        m.conv_verify(index, plan, xBC.contiguous(), dt.contiguous(), self.A, self.conv_weights, self.conv1d.bias,
                      D=self.D, dt_bias=self.dt_bias, activation=self.activation,
                      out=output[:nd].view(nd, g.heads_per_rank, g.head_dim))


# -- runtime: plans from vLLM metadata, commit, reset ------------------------------------

@attrs.define(eq=False)
class _GroupState:
    """One Mamba KV-cache group: its layers share block ids, so they share a manager and a plan."""

    group_id: int
    layer_names: list[str]
    manager: StateManager
    plan: StepPlan | None = None
    #: the open plan belongs to a dummy, profile or capture forward: every row on the null page.
    dry: bool = False


def attach_group(group_id: int, layer_names: list[str], layer_layout: PageLayout,
                 views: Sequence[dict[str, torch.Tensor]], cursors: torch.Tensor, device: torch.device,
                 backend: str, max_batch: int, backend_options: Mapping[str, Any] | None = None,
                 stochastic_rounding: bool = False, seed: int = 0) -> _GroupState:
    """A :class:`StateManager` over one KV-cache group's page views (vLLM's block ids = pages)."""
    layout = PageLayout.replay(attrs.evolve(layer_layout.geometry, num_layers=len(views)), layer_layout.spec)
    cache = StateCache.from_tensors(layout, list(views), cursors)
    manager = StateManager(layout, cursors.shape[1], device, backend=backend, max_batch=max_batch, cache=cache,
                           backend_options=backend_options, stochastic_rounding=stochastic_rounding, seed=seed)
    return _GroupState(group_id, layer_names, manager)


class VllmStateRuntime:
    """ssmstate's side of one vLLM worker: a manager per Mamba KV-cache group over vLLM's pages.

    Args:
        groups: one :class:`_GroupState` per Mamba KV-cache group (:func:`attach_group`).
        device: the worker device. max_batch: most decode rows (padding included).

    Cursors are one ``(4, num_blocks)`` int32 tensor shared by every group:
    groups draw distinct block ids from one pool, so each block's cursors belong
    to exactly one group's request.
    """

    def __init__(self, groups: Sequence[_GroupState], device: torch.device, max_batch: int) -> None:
        self.device = torch.device(device)
        self.groups = list(groups)
        self.graph_replayed = False
        self._accepted = torch.zeros((max_batch,), dtype=torch.int32, device=self.device)

    @classmethod
    def from_kv_cache_config(cls, kv_cache_config: KVCacheConfig, layers: Mapping[str, Any],
                             device: torch.device, backend: str, max_batch: int,
                             backend_options: Mapping[str, Any] | None = None,
                             stochastic_rounding: bool = False, seed: int = 0) -> "VllmStateRuntime":
        """Attach to every :class:`SSMStateMambaSpec` group of a worker whose layers are bound."""
        device = torch.device(device)
        num_blocks = kv_cache_config.num_blocks
        cursors = torch.zeros((CURSORS_PER_PAGE, num_blocks), dtype=torch.int32, device=device)
        groups = []
        for gid, group in enumerate(kv_cache_config.kv_cache_groups):
            if not isinstance(group.kv_cache_spec, SSMStateMambaSpec):
                continue
            group_layers = [layers[name] for name in group.layer_names]
            state = attach_group(gid, list(group.layer_names), group_layers[0].ssmstate_layout,
                                 [lyr.ssmstate_views for lyr in group_layers], cursors, device, backend, max_batch,
                                 backend_options, stochastic_rounding, seed + gid)
            for i, lyr in enumerate(group_layers):
                lyr.ssmstate_slot = (state, i)
            groups.append(state)
        return cls(groups, device, max_batch)

    def begin_step(self, attn_metadata: Mapping[str, Any], query_start_loc_cpu: torch.Tensor | None,
                   cudagraph_mode: CUDAGraphMode = CUDAGraphMode.NONE, real: bool = True) -> None:
        """Open this step's plan in every group (``prepare_attn``, before the forward).

        Real batches (``real``) first hand their prefill rows' pages over to
        vLLM's prefill kernels (:meth:`hand_over_prefills`). A batch that is not
        real (a dummy, profile or CUDA-graph capture forward, which vLLM may run
        more than once on the same metadata) gets a dry plan: every row on the
        null page, so its forwards and its close change no page and no cursor.
        A plan still open here was never sampled: a dry one is closed, a real one
        rolled back.
        """
        self.graph_replayed = cudagraph_mode == CUDAGraphMode.FULL
        for g in self.groups:
            self._close_unsampled(g)
            md = attn_metadata.get(g.layer_names[0])
            if md is None:
                continue
            if real and md.num_prefills > 0:
                self.hand_over_prefills(g, md)
            g.plan = plan_from_mamba2_metadata(g.manager, md, query_start_loc_cpu, dry=not real)
            g.dry = not real

    @staticmethod
    def hand_over_prefills(group: _GroupState, metadata: Any) -> None:
        """Make each prefill row's page what vLLM's prefill kernels expect, on the device.

        A row that continues a request (``has_initial_states_p``: after earlier
        chunks, decode rows or a one-token decode-row tail) gets its committed ring
        rows folded into the checkpoint and its conv history moved under
        :func:`prefill_conv_view`, because the prefill reads both as the state. A
        row that starts a request (a new one, or one recomputed after preemption)
        gets all cursors zeroed: nothing a block's earlier owner committed is
        replayed, and the history vLLM's prefill writes is where the next conv reads it.
        """
        sid = metadata.state_indices_tensor_p.to(torch.int32)
        has_state = metadata.has_initial_states_p
        if has_state is None:
            has_state = torch.zeros_like(sid, dtype=torch.bool)
        zero = torch.zeros_like(sid)
        continuing = torch.where(has_state, sid, zero)
        group.manager.materialize_pages(continuing)
        settle_conv_history(group.manager, continuing)
        group.manager.reset_cursors(torch.where(has_state, zero, sid))
        group.manager.cache.advance_seed()  # staged prefill writes draw fresh bits even in prefill-only steps

    @staticmethod
    def _close_unsampled(group: _GroupState) -> None:
        plan = group.plan
        group.plan, dry, group.dry = None, group.dry, False
        if plan is None or plan.committed:
            return
        if dry:
            # Rows on the null page only: the rollback writes nothing, whatever ran.
            L = group.manager.num_layers
            plan.verified_layers.update(range(L))
            plan.conv_layers.update(range(L))
        group.manager.rollback(plan)

    def commit(self, num_sampled: torch.Tensor | int) -> None:
        """Commit ``num_sampled`` (per batch row, decodes first; bonus included) on the device.

        ``max(num_sampled, 1)`` like vLLM's own Mamba bookkeeping: a one-token
        prompt tail run as a decode row samples nothing yet consumed its token.
        """
        for g in self.groups:
            plan = g.plan
            if plan is None or plan.committed:
                continue
            if g.dry:
                self._close_unsampled(g)
                continue
            rows = plan.num_rows
            acc = self._accepted[:rows]
            if isinstance(num_sampled, int):
                acc.fill_(max(num_sampled, 1))
            else:
                n = min(rows, num_sampled.shape[0])
                acc.fill_(1)
                acc[:n].copy_(torch.clamp(num_sampled[:n], min=1))
            if self.graph_replayed and not plan.verified_layers:
                # A replayed full CUDA graph ran every layer's conv and verify on the device.
                L = g.manager.num_layers
                plan.verified_layers.update(range(L))
                plan.conv_layers.update(range(L))
            g.manager.commit(plan, acc)
            g.plan = None

    def reset_blocks(self, block_ids: Sequence[Sequence[int]]) -> None:
        """Zero the cursors of a new request's blocks (``block_ids`` per KV-cache group)."""
        ids = [b for g in self.groups if g.group_id < len(block_ids) for b in block_ids[g.group_id]]
        if ids:
            self.groups[0].manager.reset_cursors(torch.tensor(ids, dtype=torch.int32, device=self.device))


class SSMStateModelState(MambaHybridModelState):
    """Model Runner V2 model state with ssmstate's Mamba lifecycle.

    ``prepare_attn`` opens each group's plan from the metadata vLLM built,
    ``postprocess_state`` commits ``num_sampled`` right after rejection sampling
    (device-side, no sync), ``add_request`` zeroes the new request's cursors.
    A batch whose requests were not all added here (vLLM's dummy, profile and
    CUDA-graph capture batches use made-up request ids) gets a dry plan.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ssmstate: VllmStateRuntime | None = None
        self._pending_blocks: list[tuple[list[int], ...]] = []
        self._live_requests: set[str] = set()

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig, block_tables: Any) -> None:
        super().initialize_kv_cache(kv_cache_config, block_tables)
        settings = settings_from_vllm_config(self.vllm_config)
        layers = self.vllm_config.compilation_config.static_forward_context
        seed = self.vllm_config.model_config.seed
        self.ssmstate = VllmStateRuntime.from_kv_cache_config(
            kv_cache_config, layers, self.device, settings.backend, max_batch=self.max_num_reqs,
            backend_options=settings.backend_options, stochastic_rounding=settings.stochastic_rounding,
            seed=seed if isinstance(seed, int) else 0)
        for block_ids in self._pending_blocks:
            self.ssmstate.reset_blocks(block_ids)
        self._pending_blocks.clear()

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)
        self._live_requests.add(new_req_data.req_id)
        if self.ssmstate is None:
            self._pending_blocks.append(new_req_data.block_ids)
        else:
            self.ssmstate.reset_blocks(new_req_data.block_ids)

    def remove_request(self, req_id: str) -> None:
        super().remove_request(req_id)
        self._live_requests.discard(req_id)

    def is_real_batch(self, input_batch: Any) -> bool:
        """True when every request of the batch is one vLLM added (not a dummy or capture batch)."""
        ids = input_batch.req_ids[: input_batch.num_reqs]
        return bool(ids) and all(rid in self._live_requests for rid in ids)

    def prepare_attn(self, input_batch: Any, cudagraph_mode: CUDAGraphMode, *args: Any, **kwargs: Any):
        attn_metadata = super().prepare_attn(input_batch, cudagraph_mode, *args, **kwargs)
        if self.ssmstate is not None:
            qsl_cpu = torch.from_numpy(input_batch.query_start_loc_np)
            self.ssmstate.begin_step(attn_metadata, qsl_cpu, cudagraph_mode, real=self.is_real_batch(input_batch))
        return attn_metadata

    def postprocess_state(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor | int,
                          num_computed_tokens: torch.Tensor | None = None) -> None:
        if self.ssmstate is not None:
            self.ssmstate.commit(num_sampled)
        super().postprocess_state(idx_mapping, num_sampled, num_computed_tokens)


# -- plugin entry point -----------------------------------------------------------------

_MODEL_CLASS = f"{__name__}:SSMStateNemotronHForCausalLM"


def register() -> None:
    """Register the plugin's hooks in vLLM; idempotent (vLLM calls it in every process).

    Nothing unless ``SSMSTATE_VLLM=1`` (``0`` or unset: vLLM is left exactly as it
    is; any other value raises). With the switch on, checks the vLLM version, then
    registers the spec (with vLLM's ``MambaManager``, grouped as a ``MambaSpec``),
    the ``MambaMixer2`` replacement, the NemotronH model override and the
    config-time refusals (:func:`check_config`). vLLM's entry point is
    :func:`ssmstate.integrations.vllm_plugin.register`, which checks the switch and
    the version before it imports this module.

    Raises:
        ConfigError: a switch value other than 0/1, or another plugin's ``MambaMixer2``.
        UnsupportedVersionError: a vLLM outside :data:`SUPPORTED_VLLM_SERIES`.
    """
    if not switch_on():
        return
    check_vllm_version(installed_vllm_version())
    # Built-in specs register lazily, only while the registry is empty: fill it first.
    KVCacheSpecRegistry._ensure_registered()
    KVCacheSpecRegistry.register(SSMStateMambaSpec, MambaManager, uniform_type_base_spec=MambaSpec)
    current = op_registry_oot.get("MambaMixer2")
    if current is None:
        PluggableLayer.register_oot(SSMStateMambaMixer2, name="MambaMixer2")
    elif current is not SSMStateMambaMixer2:
        raise ConfigError(f"another plugin already replaced MambaMixer2 with {current!r}")
    from vllm import ModelRegistry

    for arch in SUPPORTED_ARCHITECTURES:
        ModelRegistry.register_model(arch, _MODEL_CLASS)
    register_config_checks()
