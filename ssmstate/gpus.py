"""GPU memory sizes and size strings, for the capacity planner.

A planner multiplies a GPU's memory by ``gpu_utilization`` the way vLLM does
(``gpu_memory_utilization`` times the total the driver reports), so the table
holds the total a driver reports where a public ``nvidia-smi`` listing was
found, and the datasheet capacity otherwise. Each entry says which.
"""

from __future__ import annotations

import re

import attrs

from ssmstate.errors import ConfigError

MiB = 1 << 20
GiB = 1 << 30


@attrs.frozen
class GpuMemory:
    """One GPU model's memory.

    Attributes:
        name: canonical name (``"H200"``).
        total_bytes: memory the planner budgets from.
        basis: ``"nvidia-smi"`` (driver-reported total) or ``"datasheet"`` (marketed
            decimal GB; the driver reports a little less).
        source: where the number comes from.
    """

    name: str
    total_bytes: int
    basis: str
    source: str


#: The GPU the planner assumes when neither a name nor a memory size is given.
DEFAULT_GPU = "H200"

_MODAL = "nvidia-smi totals listed in modal-labs/modal-client#2797"

GPUS: dict[str, GpuMemory] = {
    g.name: g
    for g in (
        GpuMemory("A100-40GB", 40960 * MiB, "nvidia-smi", _MODAL),
        GpuMemory("A100-80GB", 81920 * MiB, "nvidia-smi", _MODAL),
        GpuMemory("L40S", 46068 * MiB, "nvidia-smi", _MODAL),
        GpuMemory("H100-80GB", 81559 * MiB, "nvidia-smi", _MODAL),
        GpuMemory("H100-NVL", 94 * 10**9, "datasheet", "NVIDIA H100 NVL datasheet: 94 GB HBM3"),
        GpuMemory("H200", 143771 * MiB, "nvidia-smi",
                  "nvidia-smi memory.total (driver 580.159.04), recorded in docs/results/max_concurrency_h200.json"),
        GpuMemory("B200", 183359 * MiB, "nvidia-smi", "nvidia-smi output in NVIDIA/TensorRT-LLM#10278"),
        GpuMemory("GB200", 186 * 10**9, "datasheet",
                  "NVIDIA GB200 NVL72 spec: 13.4 TB HBM3e over 72 GPUs (186 GB per GPU)"),
        GpuMemory("B300", 288 * 10**9, "datasheet", "NVIDIA Blackwell Ultra (B300) datasheet: 288 GB HBM3e"),
    )
}

_ALIASES = {
    "a100": "A100-80GB", "a100-80g": "A100-80GB", "a100-40g": "A100-40GB",
    "h100": "H100-80GB", "h100-sxm": "H100-80GB", "h100-80g": "H100-80GB", "h100-94gb": "H100-NVL",
    "h200-141gb": "H200", "h200-sxm": "H200", "b200-180gb": "B200",
}


def gpu_names() -> list[str]:
    return list(GPUS)


def lookup_gpu(name: str) -> GpuMemory:
    """A GPU by name, case-insensitively (``"h200"``, ``"H100-80GB"``, ``"h100"``)."""
    key = str(name).strip().lower()
    for canonical in GPUS:
        if canonical.lower() == key:
            return GPUS[canonical]
    if key in _ALIASES:
        return GPUS[_ALIASES[key]]
    raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or give the memory size instead)")


_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str) -> int:
    """Bytes of a size: an int, or a string such as ``"80GiB"``, ``"141GB"``, ``"512 MiB"``, ``"1024"``.

    ``KB/MB/GB/TB`` are decimal and ``KiB/MiB/GiB/TiB`` binary; a bare number is bytes
    (a float only if it is a whole number, e.g. ``80e9``).
    """
    if isinstance(value, bool):
        raise ConfigError(f"bad memory size {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"memory size must be positive, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"memory size must be an int or a string like '80GiB', got {type(value).__name__}")
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in _UNITS):
        raise ConfigError(
            f"bad memory size {value!r}; use a number with one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB "
            f"(e.g. '80GiB', '141GB')"
        )
    number = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    size = int(number * _UNITS[unit or "b"])
    if size <= 0:
        raise ConfigError(f"memory size must be positive, got {value!r}")
    return size


def format_size(num_bytes: int | float) -> str:
    """Human-readable binary size: ``"108.0 MiB"``, ``"126.5 GiB"``."""
    value = float(num_bytes)
    if abs(value) < 1024:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
