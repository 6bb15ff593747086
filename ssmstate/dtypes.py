"""Dtype names accepted on the command line and in configs."""

from __future__ import annotations

import torch

from ssmstate.errors import ConfigError

_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def to_dtype(value: torch.dtype | str) -> torch.dtype:
    """Return a torch dtype for a dtype or one of its common names ("fp32", "bfloat16", ...)."""
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
