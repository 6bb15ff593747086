"""Import vLLM's copied Mamba prefill kernels without vLLM installed (see copy_vllm_kernels.py).

The kernel files import a few vLLM names; this module provides minimal stand-ins for exactly those
(``vllm.platforms.current_platform``, ``vllm.triton_utils``, ``vllm.v1.attention.backends.utils``,
``vllm.envs``, ``vllm.logger``, ``vllm._custom_ops``, ``vllm.utils.platform_utils``) and maps
``vllm.model_executor.layers.mamba.ops`` onto the copied folder. Call :func:`load` before anything
imports the real vLLM in this process.
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import torch

OPS = "vllm.model_executor.layers.mamba.ops"


class _Platform:
    """The questions the kernel files ask of vLLM's platform, answered from torch."""

    @staticmethod
    def is_cuda() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def is_cpu() -> bool:
        return False  # always the Triton paths (interpreted on a CPU machine)

    @staticmethod
    def is_xpu() -> bool:
        return False

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def is_device_capability(capability: int) -> bool:
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor == capability

    @staticmethod
    def is_arch_support_pdl() -> bool:
        # vLLM's CUDA platform's rule (compute capability 9 and up): its conv update then launches with PDL, as in
        # a real engine on a Hopper GPU
        if not torch.cuda.is_available():
            return False
        return torch.cuda.get_device_capability()[0] >= 9


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load(kernel_dir: str | Path) -> dict[str, types.ModuleType]:
    """Install the stand-ins, import the copied kernels; returns {"causal_conv1d": ..., "ssd_combined": ...}."""
    import triton
    import triton.language as tl

    kernel_dir = Path(kernel_dir)
    if not (kernel_dir / "causal_conv1d.py").exists():
        raise FileNotFoundError(f"{kernel_dir} has no causal_conv1d.py: run tests/gpu/copy_vllm_kernels.py")
    if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "_ssmstate_shim", False):
        raise RuntimeError("the real vLLM is already imported in this process; load the copied kernels first")
    device_name = torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() else "cpu"
    _module("vllm", _ssmstate_shim=True, __path__=[])
    _module("vllm.platforms", current_platform=_Platform(), __path__=[])
    _module("vllm.triton_utils", tl=tl, triton=triton, HAS_TRITON=True)
    _module("vllm.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm._custom_ops")
    _module("vllm.utils", __path__=[])
    _module("vllm.utils.platform_utils", get_device_name_as_file_name=lambda: device_name)
    for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.model_executor",
                 "vllm.model_executor.layers", "vllm.model_executor.layers.mamba"):
        _module(name, __path__=[])
    _module("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0, PAD_SLOT_ID=-1)
    _module(OPS, __path__=[str(kernel_dir)])
    import importlib

    return {name: importlib.import_module(f"{OPS}.{name}") for name in ("causal_conv1d", "ssd_combined")}


def smallest_configs_only() -> int:
    """Keep only the smallest-tiled config (block sizes times pipeline stages) of every ``@triton.autotune`` kernel
    among the loaded copies, so a test compiles one build per kernel instead of tuning tens of them. The math is the
    same in every config, only the tiling differs. The smallest, not the first: the first of one kernel's list needs
    288 KB of shared memory, more than an H100 has (the tuner would have dropped it). Returns how many were trimmed."""
    import math

    from triton.runtime.autotuner import Autotuner

    def size(cfg) -> int:
        blocks = [v for k, v in cfg.kwargs.items() if k.startswith("BLOCK") and isinstance(v, int)]
        return math.prod(blocks) * max(cfg.num_stages or 1, 1)

    trimmed = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith(OPS + "."):
            continue
        for obj in vars(mod).values():
            if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                obj.configs = [min(obj.configs, key=size)]
                trimmed += 1
    return trimmed
