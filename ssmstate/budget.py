"""The memory budget for request state: what vLLM may own on one GPU, less the weights and the runtime reserve.

``total x gpu_utilization`` is everything vLLM may own on one GPU; the model weights and the runtime reserve of
its start-up profile (:mod:`ssmstate.weights`) come out of it and the rest holds Mamba state and attention KV.
A given ``kv_cache_memory`` (vLLM's "Available KV cache memory") is that rest directly.
"""

from __future__ import annotations

import math

import attrs

from ssmstate.errors import CapacityError, ConfigError
from ssmstate.geometry import ModelConfig
from ssmstate.gpus import DEFAULT_GPU, format_size, lookup_gpu, parse_size
from ssmstate.weights import (
    DEFAULT_CUDA_GRAPH_BYTES,
    DEFAULT_NON_TORCH_BYTES,
    RuntimeReserve,
    WeightMemory,
    measured_reserve,
    measured_weights,
    runtime_reserve,
    vllm_serve_defaults,
    weight_memory,
)


@attrs.frozen
class StateBudget:
    """What one rank has for Mamba state and attention KV, and the terms it came from.

    Attributes:
        requested_bytes: ``ceil(gpu_memory * gpu_utilization)``, what vLLM may own.
        weights: the model weights on one rank (None when ``kv_cache_memory`` was given).
        reserve: the runtime reserve (None when ``kv_cache_memory`` was given).
        budget_bytes: ``requested - weights - reserve``, or ``kv_cache_memory``.
    """

    requested_bytes: int
    weights: WeightMemory | None
    reserve: RuntimeReserve | None
    budget_bytes: int


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` when it is an int (not a bool) of at least ``minimum``; ConfigError naming ``name`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_gpu_utilization(gpu_utilization: object) -> None:
    """ConfigError unless ``gpu_utilization`` is a number in (0, 1]."""
    if isinstance(gpu_utilization, bool) or not isinstance(gpu_utilization, (int, float)) \
            or not 0 < gpu_utilization <= 1:
        raise ConfigError(f"gpu_utilization must be in (0, 1], got {gpu_utilization!r}")


def resolve_gpu_memory(gpu_memory: int | str | None, gpu: str | None) -> tuple[int, str | None]:
    """``(bytes of one GPU, GPU name or None)`` from a size or a GPU name (the default GPU when neither)."""
    if gpu_memory is not None and gpu is not None:
        raise ConfigError("give a GPU name or a memory size, not both")
    if gpu_memory is not None:
        return parse_size(gpu_memory), None
    info = lookup_gpu(DEFAULT_GPU if gpu is None else gpu)
    return info.total_bytes, info.name


def profile_sizes(gpu_memory: int, max_num_batched_tokens: int | None,
                  max_num_seqs: int | None) -> tuple[int, int]:
    """The profile run's ``(max_num_batched_tokens, max_num_seqs)``: as given, or ``vllm serve``'s defaults."""
    default_tokens, default_seqs = vllm_serve_defaults(gpu_memory)
    tokens = _given_or("max_num_batched_tokens", max_num_batched_tokens, default_tokens)
    return tokens, _given_or("max_num_seqs", max_num_seqs, default_seqs)


def _given_or(name: str, value: int | None, default: int) -> int:
    return check_positive_int(name, default if value is None else value)


def size_or_zero(value: int | str | None) -> int:
    """A size that may be 0 (``"0"``, 0): the reserve's parts can be absent."""
    if value is None or value == 0 or (isinstance(value, str) and value.strip() in ("0", "0B", "0GiB")):
        return 0
    return parse_size(value)


def state_budget(
    cfg: ModelConfig,
    gpu_memory: int,
    gpu_utilization: float,
    tp_size: int,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    weight_dtype: str = "bf16",
    weights_memory: int | str | None = None,
    reserve_memory: int | str | None = None,
    kv_cache_memory: int | str | None = None,
    cuda_graph_memory: int | str = DEFAULT_CUDA_GRAPH_BYTES,
    non_torch_memory: int | str = DEFAULT_NON_TORCH_BYTES,
) -> StateBudget:
    """The state + KV budget of one rank (arguments as in :func:`ssmstate.planner.plan_capacity`).

    Raises:
        ConfigError: bad sizes, a model whose weights cannot be counted (give ``weights_memory``).
        CapacityError: the weights and reserve leave nothing.
    """
    requested = math.ceil(gpu_memory * gpu_utilization)
    if kv_cache_memory is not None:
        return StateBudget(requested, None, None, parse_size(kv_cache_memory))
    weights = (measured_weights(parse_size(weights_memory), weight_dtype) if weights_memory is not None
               else weight_memory(cfg, weight_dtype, tp_size))
    reserve = (measured_reserve(size_or_zero(reserve_memory)) if reserve_memory is not None
               else runtime_reserve(cfg, tp_size, max_num_batched_tokens, max_num_seqs,
                                    non_torch_bytes=size_or_zero(non_torch_memory),
                                    cuda_graph_bytes=size_or_zero(cuda_graph_memory)))
    budget = requested - weights.total_bytes - reserve.total_bytes
    if budget <= 0:
        raise CapacityError(
            f"{cfg.name} does not fit: {format_size(requested)} ({format_size(gpu_memory)} x {gpu_utilization:g}) "
            f"minus {format_size(weights.total_bytes)} of {weights.weight_dtype} weights and "
            f"{format_size(reserve.total_bytes)} of runtime reserve leaves nothing for request state "
            f"(raise --gpu-utilization or --tp, or use a smaller --weight-dtype)",
            required=weights.total_bytes + reserve.total_bytes, available=requested, unit="bytes",
        )
    return StateBudget(requested, weights, reserve, budget)
