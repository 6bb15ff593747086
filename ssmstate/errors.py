"""Typed errors. Every error ssmstate raises derives from :class:`SSMStateError`.

A call that raises changes nothing: checks run before any tensor or cursor is
touched.
"""

from __future__ import annotations


class SSMStateError(Exception):
    """Base class of every error raised by ssmstate."""


class ConfigError(SSMStateError, ValueError):
    """A geometry, spec or preset that cannot be served (bad sizes, TP not dividing, ...)."""


class CapacityError(SSMStateError):
    """The page pool cannot hold what was asked for.

    Attributes:
        required: pages (or bytes, see ``unit``) the request needed.
        available: pages (or bytes) that were free.
    """

    def __init__(self, message: str, *, required: int, available: int, unit: str = "pages") -> None:
        super().__init__(f"{message} (required {required} {unit}, available {available} {unit})")
        self.required = required
        self.available = available
        self.unit = unit


class UnknownRequestError(SSMStateError, KeyError):
    """A request id that was never admitted, or was already released."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class LifecycleError(SSMStateError):
    """A verb called out of order (commit without a step, a second commit, ...)."""


class ShapeError(SSMStateError, ValueError):
    """A tensor argument with the wrong shape, dtype, device or memory layout (strides)."""


class BackendUnavailableError(SSMStateError):
    """A backend that cannot run here, or cannot run this geometry."""


class DeviceCommitError(SSMStateError):
    """A device-side commit found accepted counts out of range; cursors were left unchanged."""


class UnsupportedConfigError(SSMStateError):
    """An engine configuration an integration cannot serve, or malformed settings for it.

    Deliberately not a ``ValueError``: engines that validate their config with
    pydantic (vLLM) would wrap a ``ValueError`` raised from a config hook into
    their own ``ValidationError`` and lose the type.

    Attributes:
        flag: the engine setting (command-line flag or environment variable) to change.
    """

    def __init__(self, message: str, *, flag: str) -> None:
        super().__init__(f"{message} (change: {flag})")
        self.flag = flag


class UnsupportedVersionError(SSMStateError):
    """An engine version an integration was not built for.

    Attributes:
        version: the version found. supported: the release series that are supported.
    """

    def __init__(self, message: str, *, version: str, supported: tuple[str, ...]) -> None:
        super().__init__(message)
        self.version = version
        self.supported = supported
