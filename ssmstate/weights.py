"""What a deployment holds besides request state: model weights and vLLM's runtime reserve.

Weights are counted parameter by parameter from the model config, the way vLLM builds a NemotronH
model (``vllm/model_executor/models/nemotron_h.py`` and ``MambaMixer2``):

* embeddings ``vocab x hidden``; ``lm_head`` the same unless tied;
* per Mamba2 layer: ``in_proj`` ``hidden -> 2 d_inner + 2 G N + H`` (z, x, B, C, dt), the depthwise conv
  (``conv_dim x k`` plus a bias), ``A``, ``D`` and ``dt_bias`` (H each), the gated norm (d_inner),
  ``out_proj`` ``d_inner -> hidden``, the layer's RMSNorm;
* per attention layer: ``qkv_proj`` ``hidden -> (q + 2 kv) head_dim``, ``o_proj``, the RMSNorm;
* per MLP layer: up and down (squared ReLU; SwiGLU adds a gate), the RMSNorm;
* per MoE layer: the router (``hidden x E`` plus a bias), E experts of up and down, the shared experts,
  and for a latent MoE the projections into and out of the latent width; the RMSNorm;
* the final norm.

Quantization (``--weight-dtype``) applies to the projection matrices (Mamba in/out, attention,
MLP and expert matrices); embeddings, ``lm_head``, norms, conv, ``A``/``D``/``dt_bias`` and the router
stay in bf16. fp8 is 1 byte a weight; nvfp4 is 4 bits plus one fp8 scale per 16 weights (0.5625 bytes).

Tensor parallelism splits every matrix, conv and head vector over the ranks and replicates the norms
and the router, as vLLM does; the result is per rank.

The runtime reserve models vLLM's ``Worker.determine_available_memory``: the KV cache gets
``total x gpu_memory_utilization`` minus weights, minus the memory outside PyTorch (CUDA context,
cuBLAS/NCCL workspaces), minus the transient peak of the profile run (a forward pass over
``max_num_batched_tokens`` tokens, then the sampler over ``max_num_seqs`` rows), minus the CUDA-graph
estimate. The first and last are measured by vLLM at start-up and are constants here; the profile
peak is computed from the model's widest per-token tensors. See docs/capacity.md for how close these
come to what vLLM logs.
"""

from __future__ import annotations

from typing import Any

import attrs

from ssmstate.errors import ConfigError
from ssmstate.geometry import ModelConfig

GiB = 1 << 30

#: Bytes per weight of a quantized projection matrix, per ``weight_dtype``.
WEIGHT_DTYPES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}
_WEIGHT_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8", "fp4": "nvfp4"}
#: Unquantized tensors (embeddings, norms, conv, A/D, router) are kept at this many bytes.
UNQUANTIZED_BYTES = 2

#: Memory outside PyTorch's allocator that vLLM counts as consumed (CUDA context, cuBLAS and NCCL
#: workspaces); an assumption, overridable.
DEFAULT_NON_TORCH_BYTES = GiB // 2
#: vLLM's CUDA-graph memory estimate (``profile_cudagraph_memory``), an assumption, overridable.
DEFAULT_CUDA_GRAPH_BYTES = GiB // 2
#: vLLM's defaults on an H100/H200 for ``vllm serve``: tokens per step and concurrent sequences.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 1024


def vllm_serve_defaults(gpu_memory: int) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` picks for a GPU of this much memory.

    Mirrors vLLM 0.33's ``EngineArgs.get_batch_defaults`` for the OpenAI server: 16384 / 1024 from 160 GiB
    (B200, B300), 8192 / 1024 from 70 GiB (H100, H200; vLLM also keeps A100 and GB10 on the small tier),
    2048 / 256 below.
    """
    if gpu_memory >= 160 * GiB:
        return 16384, 1024
    if gpu_memory >= 70 * GiB:
        return DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
    return 2048, 256
#: Bytes per vocabulary entry per sampled row in vLLM's sampler warm-up: bf16 logits, then fp32 logits
#: and fp32 probabilities.
SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4


def normalize_weight_dtype(name: str) -> str:
    key = str(name).strip().lower()
    key = _WEIGHT_ALIASES.get(key, key)
    if key not in WEIGHT_DTYPES:
        raise ConfigError(f"unknown weight dtype {name!r}; use one of {', '.join(WEIGHT_DTYPES)}")
    return key


@attrs.frozen
class ParamGroup:
    """Parameters of one part of the model: ``sharded`` split over TP ranks, ``replicated`` on each;
    ``quantized`` of the sharded ones are projection matrices that take the weight dtype."""

    quantized: int = 0
    sharded: int = 0
    replicated: int = 0

    @property
    def total(self) -> int:
        return self.quantized + self.sharded + self.replicated

    def __add__(self, other: "ParamGroup") -> "ParamGroup":
        return ParamGroup(self.quantized + other.quantized, self.sharded + other.sharded,
                          self.replicated + other.replicated)

    def times(self, n: int) -> "ParamGroup":
        return ParamGroup(n * self.quantized, n * self.sharded, n * self.replicated)


def _require(cfg: ModelConfig, field: str) -> int:
    value = getattr(cfg, field)
    if value is None:
        raise ConfigError(f"model {cfg.name!r} does not give {field}; weights cannot be counted "
                          f"(pass --weights-memory to give them)")
    return int(value)


def count_parameters(cfg: ModelConfig) -> dict[str, ParamGroup]:
    """Parameters per part: ``embedding``, ``lm_head``, ``mamba``, ``attention``, ``mlp``, ``moe``, ``norm``."""
    hidden = _require(cfg, "hidden_size")
    vocab = _require(cfg, "vocab_size")
    H, P, N, G, k = cfg.num_heads, cfg.head_dim, cfg.state_size, cfg.n_groups, cfg.conv_kernel
    d_inner = H * P
    conv_dim = d_inner + 2 * G * N
    mamba_layer = ParamGroup(
        quantized=hidden * (2 * d_inner + 2 * G * N + H) + d_inner * hidden,
        sharded=conv_dim * k + conv_dim + 3 * H + d_inner,
        replicated=hidden,
    )
    parts = {
        "embedding": ParamGroup(sharded=vocab * hidden),
        "lm_head": ParamGroup() if cfg.tie_word_embeddings else ParamGroup(sharded=vocab * hidden),
        "mamba": mamba_layer.times(cfg.num_mamba_layers),
        "attention": ParamGroup(),
        "mlp": ParamGroup(),
        "moe": ParamGroup(),
        "norm": ParamGroup(replicated=hidden),
    }
    attn = cfg.attention
    if attn is not None:
        q_heads = cfg.num_attention_heads if cfg.num_attention_heads is not None else attn.num_kv_heads
        q = q_heads * attn.head_dim
        kv = attn.num_kv_heads * attn.head_dim
        parts["attention"] = ParamGroup(quantized=hidden * (q + 2 * kv) + q * hidden,
                                        replicated=hidden).times(attn.num_layers)
    if cfg.mlp is not None:
        mats = 3 if cfg.mlp.gated else 2
        parts["mlp"] = ParamGroup(quantized=mats * hidden * cfg.mlp.intermediate_size,
                                  replicated=hidden).times(cfg.mlp.num_layers)
    if cfg.moe is not None:
        m = cfg.moe
        mats = 3 if m.gated else 2
        width = m.latent_size if m.latent_size is not None else hidden
        quant = m.num_experts * mats * width * m.intermediate_size + mats * hidden * m.shared_intermediate_size
        if m.latent_size is not None:
            quant += 2 * hidden * m.latent_size
        parts["moe"] = ParamGroup(quantized=quant, replicated=hidden * m.num_experts + m.num_experts + hidden
                                  ).times(m.num_layers)
    return parts


@attrs.frozen
class WeightMemory:
    """Weight bytes on one rank.

    Attributes:
        weight_dtype: ``bf16``, ``fp16``, ``fp8`` or ``nvfp4`` (the projection matrices).
        num_parameters: all parameters of the model (all ranks).
        parameters: parameters per part of the model.
        bytes_per_part: bytes per part on one rank.
        total_bytes: weight bytes on one rank.
        measured: True when the figure was given (``weights_memory``), not counted.
    """

    weight_dtype: str
    num_parameters: int
    parameters: dict[str, int]
    bytes_per_part: dict[str, int]
    total_bytes: int
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def weight_memory(cfg: ModelConfig, weight_dtype: str = "bf16", tp_size: int = 1) -> WeightMemory:
    """Weight bytes per rank for ``cfg`` with its projection matrices in ``weight_dtype``."""
    dtype = normalize_weight_dtype(weight_dtype)
    per_weight = WEIGHT_DTYPES[dtype]
    parts = count_parameters(cfg)
    per_part = {
        name: int(-(-g.quantized * per_weight // tp_size)) + -(-g.sharded * UNQUANTIZED_BYTES // tp_size)
        + g.replicated * UNQUANTIZED_BYTES
        for name, g in parts.items()
    }
    return WeightMemory(
        weight_dtype=dtype,
        num_parameters=sum(g.total for g in parts.values()),
        parameters={name: g.total for name, g in parts.items()},
        bytes_per_part=per_part,
        total_bytes=sum(per_part.values()),
    )


def measured_weights(total_bytes: int, weight_dtype: str = "bf16") -> WeightMemory:
    """A weight figure the user measured (vLLM's "Model loading took X GiB")."""
    return WeightMemory(weight_dtype=normalize_weight_dtype(weight_dtype), num_parameters=0, parameters={},
                        bytes_per_part={}, total_bytes=int(total_bytes), measured=True)


@attrs.frozen
class RuntimeReserve:
    """What vLLM's start-up profile takes from the budget besides weights (one rank).

    Attributes:
        max_num_batched_tokens: tokens of the profile forward pass.
        max_num_seqs: rows of the profile sampler pass.
        activation_bytes: transient peak of the forward pass (widest per-token tensors x tokens, plus the
            Mamba chunked-scan states).
        sampler_bytes: transient peak of the sampler pass (logits in bf16, then fp32 logits and probabilities).
        non_torch_bytes: memory outside PyTorch (assumed).
        cuda_graph_bytes: the CUDA-graph estimate (assumed; 0 with ``enforce_eager``).
        total_bytes: ``max(activation, sampler) + non_torch + cuda_graph``; the two passes run one after the
            other, so only the larger peak counts.
        measured: True when given by the user (``reserve``), not modelled.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    activation_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    total_bytes: int
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _per_token_activation_bytes(cfg: ModelConfig, tp_size: int) -> int:
    """Bytes per token of the widest layer's live tensors in the profile pass (bf16), on one rank.

    Residual and normed hidden state (2 x hidden) plus the layer's own intermediates: Mamba's in_proj
    output, conv output and gated output; attention's qkv and output; the MLP's hidden (twice for SwiGLU);
    the MoE's routed copies (top_k x expert width) and router logits.
    """
    hidden = _require(cfg, "hidden_size")
    base = 2 * hidden
    d_inner = cfg.num_heads * cfg.head_dim
    conv_dim = d_inner + 2 * cfg.n_groups * cfg.state_size
    widths = [(2 * d_inner + 2 * cfg.n_groups * cfg.state_size + cfg.num_heads + conv_dim + d_inner) // tp_size]
    if cfg.attention is not None:
        q = (cfg.num_attention_heads or cfg.attention.num_kv_heads) * cfg.attention.head_dim
        widths.append((q + 2 * cfg.attention.num_kv_heads * cfg.attention.head_dim + q) // tp_size)
    if cfg.mlp is not None:
        widths.append((2 if cfg.mlp.gated else 1) * cfg.mlp.intermediate_size // tp_size)
    if cfg.moe is not None:
        m = cfg.moe
        width = m.latent_size if m.latent_size is not None else hidden
        widths.append(m.top_k * (2 * width + m.intermediate_size // tp_size) + m.num_experts
                      + m.shared_intermediate_size // tp_size)
    return 2 * (base + max(widths))


def runtime_reserve(
    cfg: ModelConfig,
    tp_size: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
    cuda_graph_bytes: int = DEFAULT_CUDA_GRAPH_BYTES,
    chunk_size: int = 128,
) -> RuntimeReserve:
    """The profile-run reserve for ``cfg`` (see the module docstring)."""
    tokens = max_num_batched_tokens
    vocab = _require(cfg, "vocab_size")
    chunks = -(-tokens // chunk_size)
    scan_states = chunks * (cfg.num_heads // tp_size) * cfg.head_dim * cfg.state_size * 4
    activation = tokens * _per_token_activation_bytes(cfg, tp_size) + scan_states
    rows = min(max_num_seqs, tokens)
    sampler = rows * -(-vocab // tp_size) * SAMPLER_BYTES_PER_LOGIT
    return RuntimeReserve(
        max_num_batched_tokens=tokens, max_num_seqs=max_num_seqs, activation_bytes=activation,
        sampler_bytes=sampler, non_torch_bytes=non_torch_bytes, cuda_graph_bytes=cuda_graph_bytes,
        total_bytes=max(activation, sampler) + non_torch_bytes + cuda_graph_bytes,
    )


def measured_reserve(total_bytes: int) -> RuntimeReserve:
    """A reserve the user measured (vLLM's non-KV memory less the weights)."""
    return RuntimeReserve(max_num_batched_tokens=0, max_num_seqs=0, activation_bytes=0, sampler_bytes=0,
                          non_torch_bytes=0, cuda_graph_bytes=0, total_bytes=int(total_bytes), measured=True)
