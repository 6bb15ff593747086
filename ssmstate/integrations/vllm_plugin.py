"""The ``vllm.general_plugins`` entry point: the switch and the version check, then the plugin.

vLLM imports this module in every process it starts (API server, engine core,
workers) wherever ssmstate is installed. It imports no vLLM module: with
``SSMSTATE_VLLM`` unset or ``0`` :func:`register` returns at once, so vLLM runs
exactly as without ssmstate. With ``SSMSTATE_VLLM=1`` it checks vLLM's version
against :data:`SUPPORTED_VLLM_SERIES` and only then imports
:mod:`ssmstate.integrations.vllm`, which registers the plugin's hooks.

vLLM's plugin loader logs and swallows an exception raised while *importing* a
plugin, but not one raised while *calling* it, so every failure here is raised
from :func:`register` and stops the process: a bad switch value, an unsupported
vLLM, or a plugin that does not import on the vLLM found.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ssmstate.errors import ConfigError, UnsupportedVersionError

#: Environment switch, read in every vLLM process: unset or "0" = off, "1" = on; anything else is an error.
ENV_SWITCH = "SSMSTATE_VLLM"
#: vLLM release series (major.minor) the plugin is built and tested for; a local suffix ("+cpu") is ignored.
SUPPORTED_VLLM_SERIES = ("0.32", "0.33", "0.34")


def switch_on(environ: Mapping[str, str] | None = None) -> bool:
    """The value of :data:`ENV_SWITCH`: False when unset or "0", True when "1".

    Raises:
        ConfigError: any other value (a typo must not silently serve stock vLLM).
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_SWITCH)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise ConfigError(f"{ENV_SWITCH} must be 0 or 1 (or unset), got {value!r}")


def vllm_series(version: str) -> str | None:
    """The "major.minor" series of a vLLM version string ("0.32.0+cpu" -> "0.32"); None if unparsable."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.|$|\+|[a-z])", version.strip())
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def check_vllm_version(version: str) -> str:
    """The supported series ``version`` belongs to.

    Raises:
        UnsupportedVersionError: a version outside :data:`SUPPORTED_VLLM_SERIES`, or one that does not parse.
    """
    series = vllm_series(version)
    if series not in SUPPORTED_VLLM_SERIES:
        supported = ", ".join(f"{s}.x" for s in SUPPORTED_VLLM_SERIES)
        raise UnsupportedVersionError(
            f"{ENV_SWITCH}=1: ssmstate's vLLM plugin supports vLLM {supported}, found vLLM {version!r}; "
            f"install a supported vLLM or unset {ENV_SWITCH}",
            version=version, supported=SUPPORTED_VLLM_SERIES)
    return series


def installed_vllm_version() -> str:
    """``vllm.__version__`` (vLLM's package module is light: it imports its submodules lazily)."""
    import vllm

    return str(vllm.__version__)


def register() -> None:
    """vLLM's plugin hook: nothing unless the switch is on; then check the version and register."""
    if not switch_on():
        return
    check_vllm_version(installed_vllm_version())
    from ssmstate.integrations import vllm as plugin

    plugin.register()
