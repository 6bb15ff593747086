"""ssmstate: recurrent-state management for hybrid Mamba2 models with speculative decoding.

One checkpoint plus a short ring of cached inputs per layer ("ReplaySSM"): a
request costs one page whatever the number of draft tokens, verification reads
the state once, and rollback is a cursor move.
"""

from ssmstate.cache import StateCache
from ssmstate.errors import (
    BackendUnavailableError,
    CapacityError,
    ConfigError,
    DeviceCommitError,
    LifecycleError,
    ShapeError,
    SSMStateError,
    UnknownRequestError,
)
from ssmstate.geometry import AttentionGeometry, Mamba2Geometry, ModelConfig, load_model, preset_names
from ssmstate.layout import PageLayout, SpecConfig, TensorSpec
from ssmstate.manager import SavedState, StateManager
from ssmstate.plan import StepPlan
from ssmstate.planner import CapacityPlan, plan_capacity, sweep_k
from ssmstate.pool import NULL_PAGE, PagePool

__version__ = "0.1.0"

__all__ = [
    "AttentionGeometry", "BackendUnavailableError", "CapacityError", "CapacityPlan", "ConfigError", "DeviceCommitError",
    "LifecycleError", "Mamba2Geometry", "ModelConfig", "NULL_PAGE", "PageLayout", "PagePool", "SSMStateError",
    "SavedState", "ShapeError", "SpecConfig", "StateCache", "StateManager", "StepPlan", "TensorSpec",
    "UnknownRequestError", "load_model", "plan_capacity", "preset_names", "sweep_k",
]
