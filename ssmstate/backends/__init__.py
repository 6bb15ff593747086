"""Backends: the kernels a :class:`~ssmstate.StateManager` runs, selected by name.

The protocol is :class:`~ssmstate.backends.base.Backend`; the adapters are :mod:`~ssmstate.backends.reference`
(PyTorch, any device), :mod:`~ssmstate.backends.triton` and :mod:`~ssmstate.backends.flashinfer`, the last two
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from ssmstate.backends.base import Backend
from ssmstate.backends.reference import ReferenceBackend
from ssmstate.errors import BackendUnavailableError, ConfigError


#: name -> "module:Class" for backends imported on first use.
_LAZY = {
    "triton": "ssmstate.backends.triton:TritonBackend",
    "flashinfer": "ssmstate.backends.flashinfer:FlashInferBackend",
}


def backend_names() -> list[str]:
    return ["reference", *_LAZY]


def get_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """The backend called ``name`` ("reference", "triton", "flashinfer"; "native" = "reference"), built with
    ``options`` (keyword arguments of its class, e.g. ``{"pdl": True}`` for "triton")."""
    if not isinstance(name, str):
        raise ConfigError(f"backend must be a backend name, one of {backend_names()}, got {name!r:.80}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"backend_options must be a mapping of keyword arguments, got {options!r:.80}")
    options = dict(options or {})
    if name in ("reference", "native"):
        if options:
            raise ConfigError(f"backend {name!r} takes no options, got {sorted(options)}")
        return ReferenceBackend()
    target = _LAZY.get(name)
    if target is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; choose from {backend_names()}")
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} cannot be imported here ({exc}); the 'reference' backend runs everywhere"
        ) from None
    cls = getattr(module, cls_name)
    try:
        return cls(**options)
    except TypeError as exc:  # an unknown option
        raise ConfigError(f"backend {name!r}: bad options {sorted(options)} ({exc})") from None


__all__ = ["Backend", "ReferenceBackend", "backend_names", "get_backend"]
