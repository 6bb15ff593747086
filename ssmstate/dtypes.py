"""Dtype names accepted on the command line and in configs."""

from __future__ import annotations

import torch

from ssmstate.errors import ConfigError

_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "int8": torch.int8,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3fn": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn, "e4m3": torch.float8_e4m3fn,
}

#: 8-bit checkpoint dtypes: stored with an fp32 decode scale per (page, head, head-dim row).
QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn)
#: Checkpoint dtypes. The 8-bit ones are quantized (see ssmstate.ops.quant).
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, *QUANT_DTYPES)
#: Checkpoint dtypes that may be written with stochastic rounding (everything narrower than fp32).
SR_DTYPES = (torch.bfloat16, torch.float16, *QUANT_DTYPES)
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_QUANT_MAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def to_dtype(value: torch.dtype | str) -> torch.dtype:
    """Return a torch dtype for a dtype or one of its common names ("fp32", "bfloat16", "int8", "fp8", ...)."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        key = value.lower().removeprefix("torch.")
        if key in _NAMES:
            return _NAMES[key]
    raise ConfigError(f"unknown dtype {value!r}; use one of {sorted(set(_NAMES))}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def is_quantized(dtype: torch.dtype) -> bool:
    """True for the 8-bit checkpoint dtypes, which carry a per-row fp32 decode scale."""
    return dtype in QUANT_DTYPES


def quant_max(dtype: torch.dtype) -> float:
    """QMAX of an 8-bit checkpoint dtype: the code a row's largest magnitude encodes to (127 or 448)."""
    if dtype not in _QUANT_MAX:
        raise ConfigError(f"{dtype} is not an 8-bit checkpoint dtype; use int8 or float8_e4m3fn")
    return _QUANT_MAX[dtype]
