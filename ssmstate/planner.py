"""Capacity planning: how many concurrent requests a deployment holds, for three ways of keeping Mamba state.

The budget is vLLM's: ``total x gpu_utilization`` is everything vLLM may own on one GPU; the model
weights and the runtime reserve of its start-up profile (:mod:`ssmstate.weights`) come out of it
(:mod:`ssmstate.budget`) and the rest holds request state and attention KV. ``kv_cache_memory`` gives
that rest directly (what vLLM logs as "Available KV cache memory").

The three schemes:

* **native**: vLLM's own Mamba2 spec decode, ``1 + K`` full state pages per request;
* **vllm_replayssm**: vLLM's built-in ReplaySSM (FlashInfer): one page, our page less one conv column
  (its conv window is ``conv_kernel - 1 + K``), usable only while the ring history ``W <= 16`` and ``1 + K <= W``;
* **replay**: ssmstate's page (one checkpoint, rings of ``W + T`` rows, conv window ``conv_kernel - 1 + T``),
  any W.
vLLM's built-in schemes hold no 8-bit state: beside an int8/fp8 ssmstate page they are planned at fp32.

Every Mamba byte comes from :class:`~ssmstate.layout.PageLayout` and every
attention byte from :meth:`~ssmstate.geometry.AttentionGeometry.kv_bytes_per_token`;
this module only combines them with a memory budget.

Two figures per scheme:

* **ideal** (:class:`SchemeCapacity`): the most requests whose state, cursors and
  attention KV at ``max_model_len`` fit in the budget, with the null page charged
  exactly as :class:`~ssmstate.StateManager` allocates it. With attention left out,
  a ``StateManager`` given ``layout.max_pages(budget)`` pages admits exactly
  ``max_concurrency`` requests.
* **vLLM-compatible** (:class:`VllmCapacity`): vLLM 0.33.0's "Maximum concurrency
  for N tokens per request" arithmetic for a hybrid model: the Mamba page padded
  up to an attention page whose block size is raised to cover it, layers split
  into KV-cache groups of equal size that share one block pool, ``1 +
  num_speculative_blocks`` Mamba blocks per request natively and 1 for replay.
  See docs/capacity.md for the derivation and the vLLM functions it mirrors.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import attrs

from ssmstate.budget import (
    check_gpu_utilization,
    check_positive_int,
    profile_sizes,
    resolve_gpu_memory,
    state_budget,
)
from ssmstate.dtypes import dtype_size, is_quantized, to_dtype
from ssmstate.errors import CapacityError, ConfigError
from ssmstate.geometry import AttentionGeometry, Mamba2Geometry, ModelConfig, load_model
from ssmstate.gpus import format_size
from ssmstate.layout import PageLayout, SpecConfig
from ssmstate.weights import DEFAULT_CUDA_GRAPH_BYTES, DEFAULT_NON_TORCH_BYTES, RuntimeReserve, WeightMemory

#: vLLM's ``CacheConfig.DEFAULT_BLOCK_SIZE``: the attention block size before hybrid alignment.
VLLM_DEFAULT_BLOCK_SIZE = 16
#: Smallest kernel block of vLLM's attention backends on Hopper/Blackwell
#: (FlashAttention and Triton: ``MultipleOf(16)``; FlashInfer: 16, 32, 64):
#: the raised block size is a multiple of it.
VLLM_KERNEL_BLOCK_ALIGNMENT = 16
#: vLLM's FlashInfer ReplaySSM takes a ring history (``replayssm_buffer_len``) of at most this many tokens.
VLLM_REPLAYSSM_MAX_WINDOW = 16
#: The schemes a plan compares, in print order.
SCHEMES = ("native", "vllm_replayssm", "replay")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@attrs.frozen
class SchemeCapacity:
    """Ideal per-request cost and concurrency of one scheme (one tensor-parallel rank).

    Attributes:
        scheme: ``"native"``, ``"vllm_replayssm"`` or ``"replay"``.
        pages_per_request: 1 + K (native) or 1 (the replay schemes).
        page_bytes: one page over all Mamba layers (``PageLayout.page_bytes``).
        layer_page_bytes: one page of one Mamba layer (``PageLayout.layer_page_bytes``).
        allocated_bytes_per_page: ``page_bytes`` plus the page's cursors.
        mamba_bytes_per_request: Mamba state of one request, cursors excluded.
        mamba_allocated_bytes_per_request: the same with cursors.
        attention_bytes_per_request: attention KV at ``max_model_len`` tokens (0 if not counted).
        total_bytes_per_request: ``mamba_allocated_bytes_per_request + attention_bytes_per_request``.
        num_pages: pages (null page included) a ``StateManager`` gets for this plan.
        max_concurrency: most requests that fit, null page included in the charge.
    """

    scheme: str
    pages_per_request: int
    page_bytes: int
    layer_page_bytes: int
    allocated_bytes_per_page: int
    mamba_bytes_per_request: int
    mamba_allocated_bytes_per_request: int
    attention_bytes_per_request: int
    total_bytes_per_request: int
    num_pages: int
    max_concurrency: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class VllmCapacity:
    """vLLM 0.33.0's max-concurrency arithmetic for one scheme (one rank).

    Attributes:
        scheme: ``"native"`` (vLLM's own Mamba2 spec decode) or ``"replay"`` (our page).
        mamba_page_bytes: one layer's Mamba page before padding (``MambaSpec`` page).
        attention_page_bytes_per_token: one attention layer's KV for one token.
        block_size: the attention block size after hybrid alignment (None: no attention).
        page_bytes: the unified page every group's block has; Mamba is padded to it.
        num_speculative_blocks: K natively, 0 for replay.
        mamba_blocks_per_request: ``1 + num_speculative_blocks`` (``mamba_cache_mode="none"``).
        attention_blocks_per_request: ``cdiv(max_model_len, block_size)``.
        group_size: layers per KV-cache group.
        num_attention_groups, num_mamba_groups: groups of each kind.
        blocks_per_request: Σ over groups of ``cdiv(max_memory_usage_bytes, page_size_bytes)``.
        bytes_per_block: one block of the shared pool (all layers of the widest group).
        available_memory: the KV-cache memory vLLM would be given.
        num_blocks: ``available_memory // bytes_per_block`` (the null block included, as in vLLM).
        max_concurrency: ``num_blocks / blocks_per_request``, the logged float.
        kv_cache_size_tokens: ``int(max_concurrency * max_model_len)``, vLLM's "GPU KV cache size".
    """

    scheme: str
    mamba_page_bytes: int
    attention_page_bytes_per_token: int
    block_size: int | None
    page_bytes: int
    num_speculative_blocks: int
    mamba_blocks_per_request: int
    attention_blocks_per_request: int
    group_size: int
    num_attention_groups: int
    num_mamba_groups: int
    blocks_per_request: int
    bytes_per_block: int
    available_memory: int
    num_blocks: int
    max_concurrency: float
    kv_cache_size_tokens: int

    @property
    def padding_fraction(self) -> float:
        """Share of each Mamba page that is padding (0 when pages already match)."""
        return (self.page_bytes - self.mamba_page_bytes) / self.page_bytes

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["padding_fraction"] = self.padding_fraction
        return d


@attrs.frozen
class CapacityPlan:
    """Concurrency of native vs replay state for one model, GPU budget and spec shape.

    All byte counts are per tensor-parallel rank (what one GPU holds).

    Attributes:
        model: model name (preset or path).
        geometry: the per-rank Mamba geometry used (dtypes, TP included).
        spec: K and W.
        gpu: GPU name, or None when ``gpu_memory`` was given.
        gpu_memory: bytes of one GPU.
        gpu_utilization: vLLM's ``gpu_memory_utilization``: the share of the GPU for weights, runtime
            reserve, Mamba state and attention KV together.
        requested_bytes: ``ceil(gpu_memory * gpu_utilization)``, what vLLM may own.
        weights: the model weights on one rank (None when ``kv_cache_memory`` was given).
        reserve: the runtime reserve (None when ``kv_cache_memory`` was given).
        budget_bytes: what is left for Mamba state + attention KV: ``requested - weights - reserve``, or
            ``kv_cache_memory``.
        max_model_len: tokens each request may reach (attention KV is charged at it).
        count_attention: whether attention KV is charged.
        num_attention_layers: attention layers of the model (0 if none).
        attention_bytes_per_token: KV bytes per token over all attention layers on one rank.
        native, replay: the ideal figures.
        vllm_replayssm: vLLM's built-in ReplaySSM, ideal figure (None where it does not run: W or 1 + K over 16).
        vllm_replayssm_window: the ring history vLLM's ReplaySSM is planned with (``min(W, 16)``).
        vllm_native, vllm_replay: vLLM's figures (None unless ``vllm_compatible``).
        builtin_geometry: ``geometry`` at the state dtype vLLM's built-in schemes (native, ReplaySSM) run.
    """

    model: str
    geometry: Mamba2Geometry
    spec: SpecConfig
    gpu: str | None
    gpu_memory: int
    gpu_utilization: float
    requested_bytes: int
    weights: WeightMemory | None
    reserve: RuntimeReserve | None
    budget_bytes: int
    max_model_len: int
    count_attention: bool
    num_attention_layers: int
    attention_bytes_per_token: int
    native: SchemeCapacity
    replay: SchemeCapacity
    vllm_replayssm: SchemeCapacity | None = None
    vllm_replayssm_window: int = VLLM_REPLAYSSM_MAX_WINDOW
    vllm_native: VllmCapacity | None = None
    vllm_replay: VllmCapacity | None = None
    vllm_vllm_replayssm: VllmCapacity | None = None
    builtin_geometry: Mamba2Geometry | None = None

    @property
    def replayssm_bytes_ratio(self) -> float | None:
        """ssmstate's Mamba bytes per request over vLLM's built-in ReplaySSM's (None where it does not run)."""
        if self.vllm_replayssm is None:
            return None
        return self.replay.mamba_bytes_per_request / self.vllm_replayssm.mamba_bytes_per_request

    @property
    def tp_size(self) -> int:
        return self.geometry.tp_size

    @property
    def num_speculative_tokens(self) -> int:
        return self.spec.num_speculative_tokens

    @property
    def concurrency_ratio(self) -> float:
        """``replay.max_concurrency / native.max_concurrency`` (ideal figures)."""
        return self.replay.max_concurrency / self.native.max_concurrency

    @property
    def mamba_bytes_ratio(self) -> float:
        """Native over replay Mamba state bytes per request: how much smaller replay is."""
        return self.native.mamba_bytes_per_request / self.replay.mamba_bytes_per_request

    @property
    def vllm_ratio(self) -> float | None:
        """``vllm_replay.max_concurrency / vllm_native.max_concurrency``, or None."""
        if self.vllm_native is None or self.vllm_replay is None:
            return None
        return self.vllm_replay.max_concurrency / self.vllm_native.max_concurrency

    def scheme(self, name: str) -> SchemeCapacity:
        if name not in ("native", "replay"):
            raise ConfigError(f"scheme must be 'native' or 'replay', got {name!r}")
        return self.native if name == "native" else self.replay

    @property
    def kv_cache_memory_given(self) -> bool:
        """True when the state + KV budget was given, not derived from weights and reserve."""
        return self.weights is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "geometry": self.geometry.describe(),
            "num_speculative_tokens": self.spec.num_speculative_tokens,
            "window": self.spec.window,
            "ring_len": self.spec.ring_len,
            "gpu": self.gpu,
            "gpu_memory": self.gpu_memory,
            "gpu_utilization": self.gpu_utilization,
            "requested_bytes": self.requested_bytes,
            "weights": None if self.weights is None else self.weights.to_dict(),
            "reserve": None if self.reserve is None else self.reserve.to_dict(),
            "budget_bytes": self.budget_bytes,
            "tp_size": self.tp_size,
            "max_model_len": self.max_model_len,
            "count_attention": self.count_attention,
            "num_attention_layers": self.num_attention_layers,
            "attention_bytes_per_token": self.attention_bytes_per_token,
            "native": self.native.to_dict(),
            "replay": self.replay.to_dict(),
            "vllm_replayssm": None if self.vllm_replayssm is None else self.vllm_replayssm.to_dict(),
            "vllm_replayssm_window": self.vllm_replayssm_window,
            "concurrency_ratio": self.concurrency_ratio,
            "mamba_bytes_ratio": self.mamba_bytes_ratio,
            "vllm_native": None if self.vllm_native is None else self.vllm_native.to_dict(),
            "vllm_replay": None if self.vllm_replay is None else self.vllm_replay.to_dict(),
            "vllm_vllm_replayssm": None if self.vllm_vllm_replayssm is None else self.vllm_vllm_replayssm.to_dict(),
            "vllm_ratio": self.vllm_ratio,
            "builtin_state_dtype": str((self.builtin_geometry or self.geometry).state_dtype).removeprefix("torch."),
            "replayssm_bytes_ratio": self.replayssm_bytes_ratio,
        }


# -- the two computations ------------------------------------------------------

def _ideal(layout: PageLayout, budget: int, attention_bytes: int, scheme: str | None = None,
           layer_page_bytes: int | None = None) -> SchemeCapacity:
    """Most requests with ``(1 + n * ppr)`` pages plus ``n`` attention KV reservations in ``budget``.

    ``layer_page_bytes`` replaces the layout's page of one layer (vLLM's ReplaySSM page); the cursors stay.
    """
    layer_page = layout.layer_page_bytes if layer_page_bytes is None else layer_page_bytes
    page_bytes = layer_page * layout.geometry.num_layers
    page = page_bytes + layout.cursor_bytes
    ppr = layout.pages_per_request
    if attention_bytes == 0:
        num_pages = budget // page
        n = max(0, (num_pages - 1) // ppr)
        if layer_page_bytes is None:
            assert (n, num_pages) == (layout.max_requests(budget), layout.max_pages(budget))
    else:
        n = max(0, (budget - page) // (ppr * page + attention_bytes))
        num_pages = 1 + n * ppr
    return SchemeCapacity(
        scheme=layout.scheme if scheme is None else scheme,
        pages_per_request=ppr,
        page_bytes=page_bytes,
        layer_page_bytes=layer_page,
        allocated_bytes_per_page=page,
        mamba_bytes_per_request=ppr * page_bytes,
        mamba_allocated_bytes_per_request=ppr * page,
        attention_bytes_per_request=attention_bytes,
        total_bytes_per_request=ppr * page + attention_bytes,
        num_pages=num_pages,
        max_concurrency=n,
    )


def vllm_replayssm_layer_page_bytes(geometry: Mamba2Geometry, spec: SpecConfig) -> int | None:
    """One layer's page of vLLM's built-in FlashInfer ReplaySSM, or None where it does not run.

    The same checkpoint and x/B/dt rings of ``W + T`` rows as ours, with a conv window of
    ``conv_kernel - 1 + K`` columns (one fewer than ours). It needs ``W <= 16`` and ``1 + K <= W``.
    """
    if spec.window > VLLM_REPLAYSSM_MAX_WINDOW or spec.num_tokens > spec.window:
        return None
    ours = PageLayout.replay(geometry, spec).layer_page_bytes
    return ours - geometry.conv_dim_per_rank * dtype_size(geometry.conv_state_dtype)


def vllm_group_sizes(num_attention_layers: int, num_mamba_layers: int) -> tuple[int, int, int]:
    """``(group_size, num_attention_groups, num_mamba_groups)`` as vLLM groups a hybrid.

    Mirrors ``_get_kv_cache_groups_uniform_page_size``: the group size is the
    smaller layer count, or the larger one when it is under 1.5x the smaller;
    each kind is split into ``cdiv(count, group_size)`` groups.
    """
    if num_attention_layers == 0:
        return num_mamba_layers, 0, 1
    small = min(num_attention_layers, num_mamba_layers)
    large = max(num_attention_layers, num_mamba_layers)
    group_size = large if 2 * large < 3 * small else small
    return group_size, _cdiv(num_attention_layers, group_size), _cdiv(num_mamba_layers, group_size)


def vllm_attention_block_size(mamba_page_bytes: int, attention_page_bytes_per_token: int,
                              block_size: int | None = None) -> int:
    """The attention block size vLLM picks so an attention page covers the Mamba page.

    Mirrors ``Platform._align_hybrid_block_size``: the smallest multiple of the
    kernel alignment (``max(16, block_size)``) whose page is at least the Mamba
    page, rounded up to the backends' alignment (16); never below ``block_size``.
    """
    start = VLLM_DEFAULT_BLOCK_SIZE if block_size is None else block_size
    align = max(VLLM_KERNEL_BLOCK_ALIGNMENT, start)
    raised = align * _cdiv(mamba_page_bytes, align * attention_page_bytes_per_token)
    raised = VLLM_KERNEL_BLOCK_ALIGNMENT * _cdiv(raised, VLLM_KERNEL_BLOCK_ALIGNMENT)
    return max(start, raised)


def _vllm(layout: PageLayout, available_memory: int, max_model_len: int, num_attention_layers: int,
          attention_page_bytes_per_token: int, block_size: int | None, scheme: str | None = None,
          layer_page_bytes: int | None = None) -> VllmCapacity:
    mamba_page = layout.layer_page_bytes if layer_page_bytes is None else layer_page_bytes
    nsb = layout.spec.num_speculative_tokens if layout.scheme == "native" else 0
    num_mamba = layout.geometry.num_layers
    group_size, n_attn, n_mamba = vllm_group_sizes(num_attention_layers, num_mamba)
    if num_attention_layers:
        bs: int | None = vllm_attention_block_size(mamba_page, attention_page_bytes_per_token, block_size)
        page = bs * attention_page_bytes_per_token
        attn_blocks = _cdiv(max_model_len, bs)
        widest = max(_cdiv(num_attention_layers, n_attn), _cdiv(num_mamba, n_mamba))
    else:
        bs, page, attn_blocks, widest = None, mamba_page, 0, num_mamba
    mamba_blocks = _cdiv(page * (1 + nsb), page)
    blocks_per_request = n_attn * attn_blocks + n_mamba * mamba_blocks
    bytes_per_block = widest * page
    num_blocks = available_memory // bytes_per_block
    concurrency = num_blocks / blocks_per_request
    return VllmCapacity(
        scheme=layout.scheme if scheme is None else scheme,
        mamba_page_bytes=mamba_page,
        attention_page_bytes_per_token=attention_page_bytes_per_token,
        block_size=bs,
        page_bytes=page,
        num_speculative_blocks=nsb,
        mamba_blocks_per_request=mamba_blocks,
        attention_blocks_per_request=attn_blocks,
        group_size=group_size,
        num_attention_groups=n_attn,
        num_mamba_groups=n_mamba,
        blocks_per_request=blocks_per_request,
        bytes_per_block=bytes_per_block,
        available_memory=available_memory,
        num_blocks=num_blocks,
        max_concurrency=concurrency,
        kv_cache_size_tokens=int(concurrency * max_model_len),
    )


# -- the schemes of one plan ---------------------------------------------------

@attrs.frozen
class _Schemes:
    """The per-scheme figures of one plan (the :class:`CapacityPlan` fields of the same names)."""

    native: SchemeCapacity
    replay: SchemeCapacity
    vllm_replayssm: SchemeCapacity | None
    vllm_replayssm_window: int
    vllm_native: VllmCapacity | None
    vllm_replay: VllmCapacity | None
    vllm_vllm_replayssm: VllmCapacity | None


def _ideal_fitting(model_name: str, layouts: dict[str, PageLayout], budget: int,
                   attention_bytes: int) -> dict[str, SchemeCapacity]:
    """The ideal figure of each layout; CapacityError where the budget holds no request."""
    ideal = {s: _ideal(layout, budget, attention_bytes) for s, layout in layouts.items()}
    for s, cap in ideal.items():
        if cap.max_concurrency == 0:
            raise CapacityError(
                f"a budget of {format_size(budget)} ({budget} bytes) holds no {s} request of {model_name} "
                f"(one needs {format_size(cap.total_bytes_per_request)} plus the "
                f"{format_size(cap.allocated_bytes_per_page)} null page)",
                required=cap.total_bytes_per_request + cap.allocated_bytes_per_page,
                available=budget, unit="bytes",
            )
    return ideal


def _vllm_replayssm_page(geometry: Mamba2Geometry, num_speculative_tokens: int,
                         window: int) -> tuple[int, PageLayout | None, int | None]:
    """``(window, layout, layer page)`` of vLLM's ReplaySSM; layout and page are None where it does not run."""
    vr_window = min(window, VLLM_REPLAYSSM_MAX_WINDOW)
    if num_speculative_tokens + 1 > vr_window:
        return vr_window, None, None
    vr_spec = SpecConfig(num_speculative_tokens, vr_window)
    return vr_window, PageLayout("replay", geometry, vr_spec), vllm_replayssm_layer_page_bytes(geometry, vr_spec)


def _schemes(model_name: str, geometry: Mamba2Geometry, spec: SpecConfig, budget: int,
             attn: AttentionGeometry | None, per_token: int, max_model_len: int, count_attention: bool,
             vllm_compatible: bool, block_size: int | None, builtin: Mamba2Geometry) -> _Schemes:
    """Every scheme's figures for one budget.

    ``attn`` carries the KV dtype, ``per_token`` is its charged KV bytes per token on one rank (0 when not
    counted), ``geometry`` gives the TP size and ``builtin`` is the geometry of vLLM's built-in schemes.
    """
    tp_size = geometry.tp_size
    layouts = {"native": PageLayout("native", builtin, spec), "replay": PageLayout("replay", geometry, spec)}
    ideal = _ideal_fitting(model_name, layouts, budget, per_token * max_model_len)
    vr_window, vr_layout, vr_page = _vllm_replayssm_page(builtin, spec.num_speculative_tokens, spec.window)
    vllm_replayssm = None
    if vr_layout is not None and vr_page is not None:
        vllm_replayssm = _ideal(vr_layout, budget, per_token * max_model_len, "vllm_replayssm", vr_page)
    vllm: dict[str, VllmCapacity | None] = {"native": None, "replay": None, "vllm_replayssm": None}
    if vllm_compatible:
        vllm_attn_layers = attn.num_layers if (attn is not None and count_attention) else 0
        attn_page_1 = attn.kv_bytes_per_token_per_layer(tp_size) if attn is not None else 0
        for s, layout in layouts.items():
            vllm[s] = _vllm(layout, budget, max_model_len, vllm_attn_layers, attn_page_1, block_size)
        if vr_layout is not None and vr_page is not None:
            vllm["vllm_replayssm"] = _vllm(vr_layout, budget, max_model_len, vllm_attn_layers, attn_page_1,
                                           block_size, "vllm_replayssm", vr_page)
    return _Schemes(ideal["native"], ideal["replay"], vllm_replayssm, vr_window,
                    vllm["native"], vllm["replay"], vllm["vllm_replayssm"])


# -- public entry points -------------------------------------------------------

def plan_capacity(
    model: str | os.PathLike[str] | ModelConfig,
    *,
    gpu_memory: int | str | None = None, gpu: str | None = None, gpu_utilization: float = 0.9, tp_size: int = 1,
    num_speculative_tokens: int = 3, window: int = 16, state_dtype: str = "float32", act_dtype: str = "bfloat16",
    max_model_len: int | None = None, count_attention: bool = True,
    vllm_compatible: bool = False, block_size: int | None = None,
    weight_dtype: str = "bf16", weights_memory: int | str | None = None, reserve_memory: int | str | None = None,
    kv_cache_memory: int | str | None = None, max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None, cuda_graph_memory: int | str = DEFAULT_CUDA_GRAPH_BYTES,
    non_torch_memory: int | str = DEFAULT_NON_TORCH_BYTES, builtin_state_dtype: str | None = None,
) -> CapacityPlan:
    """Plan how many concurrent requests a deployment holds: native (1 + K pages), vLLM's ReplaySSM, ssmstate.

    Args:
        model: a preset name (``"nemotron-h-8b"``), a ``config.json`` path, or a :class:`ModelConfig`.
        gpu_memory: bytes of one GPU, as an int or a size string (``"80GiB"``, ``"141GB"``).
        gpu: a GPU name from :data:`ssmstate.gpus.GPUS` (``"H100-80GB"``, ``"H200"``, ``"B200"``,
            ``"GB200"``); H200 when neither this nor ``gpu_memory`` is given.
        gpu_utilization: vLLM's ``gpu_memory_utilization``: the share of the GPU for everything vLLM owns
            (weights, runtime reserve, Mamba state and attention KV).
        tp_size: tensor-parallel size; must divide heads, groups and conv channels.
        num_speculative_tokens: K.
        window: W, the replay ring history.
        state_dtype, act_dtype: SSM state dtype (fp32, bf16, fp16, int8, fp8) and activation (ring, conv, KV) dtype.
        builtin_state_dtype: state dtype of vLLM's built-in schemes; None: ``state_dtype``, fp32 for an 8-bit one.
        max_model_len: tokens per request for the attention KV charge (the context length); the model's
            maximum when None.
        count_attention: charge attention KV (False: Mamba state only).
        vllm_compatible: also compute vLLM 0.33.0's "Maximum concurrency" figures.
        block_size: vLLM's starting attention block size (``--block-size``); 16 when None.
        weight_dtype: ``bf16``, ``fp16``, ``fp8`` or ``nvfp4`` for the weight count.
        weights_memory: the weights' bytes on one rank as measured (vLLM's "Model loading took"), instead of
            the count from the config.
        reserve_memory: the runtime reserve as measured, instead of the model of vLLM's profile run.
        kv_cache_memory: the state + KV budget itself (vLLM's "Available KV cache memory"); weights and
            reserve are then not subtracted and ``gpu_utilization`` is not used.
        max_num_batched_tokens, max_num_seqs: the profile run's sizes (vLLM's flags of the same names); None:
            what ``vllm serve`` picks for this GPU's memory (8192 and 1024 on an H100 or H200).
        cuda_graph_memory, non_torch_memory: the reserve's two start-up measurements (0 for eager mode).

    Raises:
        ConfigError: unknown model or GPU, bad sizes, TP not dividing the model, a model whose weights
            cannot be counted (give ``weights_memory``).
        CapacityError: the budget holds no request of native or ssmstate's scheme, or the weights and
            reserve leave nothing.
    """
    cfg = model if isinstance(model, ModelConfig) else load_model(model)
    check_gpu_utilization(gpu_utilization)
    check_positive_int("tp_size", tp_size)
    if block_size is not None:
        check_positive_int("block_size", block_size)
    memory, gpu_name = resolve_gpu_memory(gpu_memory, gpu)
    batched_tokens, seqs = profile_sizes(memory, max_num_batched_tokens, max_num_seqs)
    mml = cfg.max_model_len if max_model_len is None else check_positive_int("max_model_len", max_model_len)
    geometry = cfg.mamba_geometry(state_dtype=state_dtype, act_dtype=act_dtype, tp_size=tp_size)
    builtin = _builtin_geometry(geometry, builtin_state_dtype)
    spec = SpecConfig(num_speculative_tokens, window)
    budget = state_budget(cfg, memory, gpu_utilization, tp_size, max_num_batched_tokens=batched_tokens,
                          max_num_seqs=seqs, weight_dtype=weight_dtype, weights_memory=weights_memory,
                          reserve_memory=reserve_memory, kv_cache_memory=kv_cache_memory,
                          cuda_graph_memory=cuda_graph_memory, non_torch_memory=non_torch_memory)
    attn = None if cfg.attention is None else attrs.evolve(cfg.attention, kv_dtype=geometry.act_dtype)
    num_attn = attn.num_layers if attn is not None else 0
    per_token = attn.kv_bytes_per_token(tp_size) if (attn is not None and count_attention) else 0
    schemes = _schemes(cfg.name, geometry, spec, budget.budget_bytes, attn, per_token, mml, count_attention,
                       vllm_compatible, block_size, builtin)
    return CapacityPlan(
        model=cfg.name, geometry=geometry, spec=spec, gpu=gpu_name, gpu_memory=memory,
        gpu_utilization=float(gpu_utilization), requested_bytes=budget.requested_bytes, weights=budget.weights,
        reserve=budget.reserve, budget_bytes=budget.budget_bytes, max_model_len=mml,
        count_attention=count_attention and num_attn > 0, num_attention_layers=num_attn,
        attention_bytes_per_token=per_token, native=schemes.native, replay=schemes.replay,
        vllm_replayssm=schemes.vllm_replayssm, vllm_replayssm_window=schemes.vllm_replayssm_window,
        vllm_native=schemes.vllm_native, vllm_replay=schemes.vllm_replay,
        vllm_vllm_replayssm=schemes.vllm_vllm_replayssm, builtin_geometry=builtin,
    )


def _builtin_geometry(geometry: Mamba2Geometry, builtin_state_dtype: str | None) -> Mamba2Geometry:
    """``geometry`` at the state dtype vLLM's built-in schemes run (never 8-bit)."""
    if builtin_state_dtype is None:
        return attrs.evolve(geometry, state_dtype="float32") if is_quantized(geometry.state_dtype) else geometry
    if is_quantized(to_dtype(builtin_state_dtype)):
        raise ConfigError(f"builtin_state_dtype {builtin_state_dtype!r}: vLLM's built-in schemes hold no 8-bit state")
    return attrs.evolve(geometry, state_dtype=builtin_state_dtype)


def sweep_k(model: str | os.PathLike[str] | ModelConfig, ks: Iterable[int] = range(0, 9),
            **kwargs: Any) -> list[CapacityPlan]:
    """:func:`plan_capacity` for each K in ``ks`` (other arguments as there).

    ``window`` defaults to ``max(16, 1 + max(ks))`` so every K fits the ring.
    """
    ks = list(ks)
    if not ks:
        raise ConfigError("sweep_k needs at least one K")
    if "num_speculative_tokens" in kwargs:
        raise ConfigError("sweep_k sets num_speculative_tokens itself; pass ks")
    kwargs.setdefault("window", max(16, 1 + max(ks)))
    return [plan_capacity(model, num_speculative_tokens=k, **kwargs) for k in ks]


def sweep_k_fitting(model: str | os.PathLike[str] | ModelConfig, ks: Iterable[int] = range(0, 9),
                    **kwargs: Any) -> tuple[list[CapacityPlan], dict[int, str]]:
    """:func:`sweep_k` that keeps going past a K whose plan fails: ``(plans, {K: reason})``.

    A K fails when the budget holds no request (``CapacityError``) or the window cannot hold it
    (``ConfigError`` from :class:`SpecConfig`).
    """
    ks = list(ks)
    if not ks:
        raise ConfigError("sweep_k needs at least one K")
    if "num_speculative_tokens" in kwargs:
        raise ConfigError("sweep_k sets num_speculative_tokens itself; pass ks")
    kwargs.setdefault("window", max(16, 1 + max(ks)))
    plans: list[CapacityPlan] = []
    failed: dict[int, str] = {}
    for k in ks:
        try:
            plans.append(plan_capacity(model, num_speculative_tokens=k, **kwargs))
        except CapacityError as exc:
            failed[k] = str(exc)
    return plans, failed
