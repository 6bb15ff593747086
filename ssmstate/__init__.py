"""ssmstate: recurrent-state management for hybrid Mamba2 models with speculative decoding.

One checkpoint plus a short ring of cached inputs per layer ("ReplaySSM"): a
request costs one page whatever the number of draft tokens, verification reads
the state once, and rollback is a cursor move.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Names are imported on first use (PEP 562), so that ``import ssmstate`` and the command line's ``--help``
# and ``--version`` do not load torch.
_EXPORTS = {
    "StateCache": "ssmstate.cache",
    "BackendUnavailableError": "ssmstate.errors", "CapacityError": "ssmstate.errors",
    "ConfigError": "ssmstate.errors", "DeviceCommitError": "ssmstate.errors", "LifecycleError": "ssmstate.errors",
    "ShapeError": "ssmstate.errors", "SSMStateError": "ssmstate.errors", "UnknownRequestError": "ssmstate.errors",
    "AttentionGeometry": "ssmstate.geometry", "Mamba2Geometry": "ssmstate.geometry",
    "ModelConfig": "ssmstate.geometry", "load_model": "ssmstate.geometry", "preset_names": "ssmstate.geometry",
    "PageLayout": "ssmstate.layout", "SpecConfig": "ssmstate.layout", "TensorSpec": "ssmstate.layout",
    "SavedState": "ssmstate.manager", "StateManager": "ssmstate.manager",
    "StepPlan": "ssmstate.plan",
    "CapacityPlan": "ssmstate.planner", "plan_capacity": "ssmstate.planner", "sweep_k": "ssmstate.planner",
    "NULL_PAGE": "ssmstate.pool", "PagePool": "ssmstate.pool",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ssmstate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AttentionGeometry", "BackendUnavailableError", "CapacityError", "CapacityPlan", "ConfigError", "DeviceCommitError",
    "LifecycleError", "Mamba2Geometry", "ModelConfig", "NULL_PAGE", "PageLayout", "PagePool", "SSMStateError",
    "SavedState", "ShapeError", "SpecConfig", "StateCache", "StateManager", "StepPlan", "TensorSpec",
    "UnknownRequestError", "load_model", "plan_capacity", "preset_names", "sweep_k",
]
