"""The plugin's configuration side: settings, config-time refusals and the replay page layout.

Everything here runs while vLLM builds its config (``VllmConfig.__post_init__``,
through the ``MODELS_CONFIG_MAP`` entries :func:`register_config_checks`
installs) or when a layer or the model sizes its pages: reading the settings
(:func:`settings_from_vllm_config`), refusing what the plugin cannot serve
(:func:`check_config`, :func:`is_enabled`) and the one layout both sizing paths
use (:func:`layout_for`). :mod:`ssmstate.integrations.vllm` imports it and
re-exports its names; it imports nothing from that module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from vllm.config import VllmConfig
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

from ssmstate.errors import ConfigError, UnsupportedConfigError
from ssmstate.geometry import Mamba2Geometry
from ssmstate.integrations.vllm_plugin import ENV_SWITCH, switch_on
from ssmstate.layout import PageLayout, SpecConfig

# -- vLLM version adapters: what differs between the supported releases -------------------

def _uses_model_runner_v2(vllm_config: VllmConfig) -> bool:
    """Whether the engine runs Model Runner V2 (0.32/0.33 decide per config; 0.34 has no V1 left)."""
    return bool(getattr(vllm_config, "use_v2_model_runner", True))


def _stochastic_rounding(vllm_config: VllmConfig) -> bool:
    """Whether vLLM was asked to round the Mamba state stochastically (``VllmConfig.mamba_config``)."""
    mamba = getattr(vllm_config, "mamba_config", None)
    return bool(getattr(mamba, "enable_stochastic_rounding", False))


#: ``--additional-config`` key: ``{"ssmstate": {"window": 16, "backend": "triton", "pdl": false,
#: "state_dtype": "int8", "stochastic_rounding": false}}``.
#: It carries settings only: the switch is :data:`ENV_SWITCH`, because vLLM loads plugins before any config.
CONFIG_KEY = "ssmstate"
#: The keys ``additional_config["ssmstate"]`` may hold.
CONFIG_SETTINGS = ("window", "backend", "pdl", "state_dtype", "stochastic_rounding")
#: ``state_dtype`` values: the checkpoint dtype (``"auto"``: the SSM cache dtype vLLM resolves).
STATE_DTYPE_NAMES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "int8": torch.int8,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
}
#: Checkpoint dtypes stored as 8-bit codes with an fp32 decode scale per (page, head, head-dim row).
EIGHT_BIT_DTYPES = (torch.int8, torch.float8_e4m3fn)
#: Architectures whose config-time page sizing the plugin overrides (the layer hook alone is not enough).
SUPPORTED_ARCHITECTURES = ("NemotronHForCausalLM",)
#: Other architectures of vLLM whose models build ``MambaMixer2``: refused at config time while the switch is on
#: (any other model that builds one is refused when its first layer is built).
MAMBA2_ARCHITECTURES = (
    "NemotronHPuzzleForCausalLM", "NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3",
    "NemotronH_Super_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3", "Mamba2ForCausalLM", "BambaForCausalLM",
    "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "Zamba2ForCausalLM",
)


# -- settings ---------------------------------------------------------------------

@attrs.frozen
class VllmSettings:
    """What the user asked for (env and ``--additional-config``).

    Attributes:
        enabled: run ssmstate's Mamba state in place of vLLM's (``SSMSTATE_VLLM=1``).
        window: W, the replay window (ring rows R = W + 1 + K).
        backend: ssmstate backend for verify/conv/commit ("triton" on GPU, "reference" anywhere).
        pdl: with "triton", each layer's conv and verify launch as programmatic dependents
            (:class:`~ssmstate.backends.triton.TritonBackend`); off by default.
        state_dtype: the checkpoint dtype (fp32, bf16, fp16, int8 or fp8_e4m3fn); None: the SSM cache
            dtype vLLM resolves (``--mamba-ssm-cache-dtype``, fp32 for Nemotron-H).
        stochastic_rounding: round every checkpoint write stochastically (bf16, fp16, int8, fp8 only).
    """

    enabled: bool = False
    window: int = 16
    backend: str = "triton"
    pdl: bool = False
    state_dtype: torch.dtype | None = None
    stochastic_rounding: bool = False

    @property
    def backend_options(self) -> dict[str, Any] | None:
        """The :class:`StateManager` ``backend_options`` these settings ask for."""
        return {"pdl": True} if self.pdl else None


_BOOL_WORDS = ("0", "1", "true", "false", "yes", "no", "on", "off")


def _flag(name: str, raw: object) -> bool:
    """A bool setting: a bool, or one of :data:`_BOOL_WORDS` (from the environment)."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _BOOL_WORDS:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"ssmstate {name} must be a bool (or 0/1, true/false, yes/no, on/off), got {raw!r}")


def _state_dtype(raw: object) -> torch.dtype | None:
    """The ``state_dtype`` setting: a name of :data:`STATE_DTYPE_NAMES`, or "auto" (None)."""
    key = raw.strip().lower() if isinstance(raw, str) else None
    if key == "auto" or raw is None:
        return None
    if key in STATE_DTYPE_NAMES:
        return STATE_DTYPE_NAMES[key]
    raise ConfigError(f"ssmstate state_dtype must be one of auto, fp32, bf16, fp16, int8, fp8, got {raw!r}")


def _config_settings(vllm_config: VllmConfig | None) -> Mapping[str, Any]:
    """``additional_config["ssmstate"]``, checked: a dict of :data:`CONFIG_SETTINGS` keys only."""
    if vllm_config is None:
        return {}
    add = getattr(vllm_config, "additional_config", None) or {}
    extra = add.get(CONFIG_KEY, {}) if isinstance(add, Mapping) else {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"additional_config[{CONFIG_KEY!r}] must be a dict, got {extra!r}")
    if "enabled" in extra:
        raise ConfigError(
            f"additional_config[{CONFIG_KEY!r}] cannot turn ssmstate on or off: vLLM loads plugins before it "
            f"reads any config, so the switch is {ENV_SWITCH}=1 in the environment of every vLLM process; "
            f"remove 'enabled' (the config may carry {', '.join(CONFIG_SETTINGS)})")
    unknown = sorted(set(extra) - set(CONFIG_SETTINGS))
    if unknown:
        raise ConfigError(f"additional_config[{CONFIG_KEY!r}] has unknown keys {unknown}; "
                          f"it may carry {', '.join(CONFIG_SETTINGS)}")
    return extra


def settings_from_vllm_config(vllm_config: VllmConfig | None) -> VllmSettings:
    """The settings, read only while the switch is on (off: the defaults, nothing parsed).

    ``SSMSTATE_VLLM_WINDOW``, ``SSMSTATE_VLLM_BACKEND``, ``SSMSTATE_VLLM_PDL``,
    ``SSMSTATE_VLLM_STATE_DTYPE`` and ``SSMSTATE_VLLM_STOCHASTIC_ROUNDING`` override
    ``additional_config["ssmstate"]``'s window, backend, pdl, state_dtype and stochastic_rounding.
    """
    if not switch_on():
        return VllmSettings(enabled=False)
    extra = _config_settings(vllm_config)
    raw_window = os.environ.get(f"{ENV_SWITCH}_WINDOW", extra.get("window", 16))
    try:
        window = int(raw_window)
    except (TypeError, ValueError):
        raise ConfigError(f"ssmstate window must be an int, got {raw_window!r}") from None
    backend = str(os.environ.get(f"{ENV_SWITCH}_BACKEND", extra.get("backend", "triton")))
    if backend not in ("triton", "flashinfer", "reference"):
        raise ConfigError(f"ssmstate backend must be 'triton', 'flashinfer' or 'reference', got {backend!r}")
    pdl = _flag("pdl", os.environ.get(f"{ENV_SWITCH}_PDL", extra.get("pdl", False)))
    if pdl and backend != "triton":
        raise ConfigError(f"ssmstate pdl needs the triton backend, got backend {backend!r}")
    state_dtype = _state_dtype(os.environ.get(f"{ENV_SWITCH}_STATE_DTYPE", extra.get("state_dtype", "auto")))
    sr = _flag("stochastic_rounding", os.environ.get(f"{ENV_SWITCH}_STOCHASTIC_ROUNDING",
                                                     extra.get("stochastic_rounding", False)))
    return VllmSettings(enabled=True, window=window, backend=backend, pdl=pdl, state_dtype=state_dtype,
                        stochastic_rounding=sr)


# -- refusals: every configuration the plugin cannot serve --------------------------------

def _refuse(what: str, flag: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{ENV_SWITCH}=1: ssmstate cannot serve {what}", flag=flag)


def _draft_has_mamba_layers(vllm_config: VllmConfig) -> bool:
    """True when a separate draft model carries recurrent (Mamba) state: ssmstate plans the target's groups only."""
    sc = vllm_config.speculative_config
    draft = getattr(sc, "draft_model_config", None) if sc is not None else None
    if draft is None or draft is vllm_config.model_config:
        return False
    return bool(draft.is_hybrid or draft.is_attention_free or draft.has_inner_state)


#: Where the settings come from, named in the errors about them.
_SETTINGS_FLAGS = (f"{ENV_SWITCH}_WINDOW / {ENV_SWITCH}_BACKEND / {ENV_SWITCH}_PDL / {ENV_SWITCH}_STATE_DTYPE / "
                   f"{ENV_SWITCH}_STOCHASTIC_ROUNDING or --additional-config '{{\"{CONFIG_KEY}\": {{...}}}}'")
#: What picks the checkpoint dtype and its rounding.
_DTYPE_FLAGS = (f"{ENV_SWITCH}_STATE_DTYPE / {ENV_SWITCH}_STOCHASTIC_ROUNDING or --additional-config "
                f"'{{\"{CONFIG_KEY}\": {{\"state_dtype\": ..., \"stochastic_rounding\": ...}}}}'")
#: What sizes the replay layout: K (the drafter's tokens) and the window.
_LAYOUT_FLAGS = f"--speculative-config num_speculative_tokens (K) or {ENV_SWITCH}_WINDOW (W >= 1 + K)"


def check_config(vllm_config: VllmConfig) -> VllmSettings:
    """Refuse what the plugin cannot serve; the settings otherwise.

    Runs at config time (the ``MODELS_CONFIG_MAP`` hook of :func:`register_config_checks`, inside
    ``VllmConfig.__post_init__``, before any model is loaded) and again from
    :func:`is_enabled` wherever the plugin acts. Each refusal names the flag to change.

    Raises:
        UnsupportedConfigError: a configuration ssmstate cannot serve, malformed ssmstate settings,
            or a window / K the replay layout cannot hold (``.flag`` names the setting to change).
    """
    if not switch_on():
        return VllmSettings(enabled=False)
    try:
        settings = settings_from_vllm_config(vllm_config)
    except ConfigError as e:
        raise UnsupportedConfigError(f"ssmstate settings: {e}", flag=_SETTINGS_FLAGS) from e
    _refuse_unsupported(vllm_config)
    if settings.stochastic_rounding and checkpoint_dtype(vllm_config, settings) == torch.float32:
        raise UnsupportedConfigError(
            f"{ENV_SWITCH}=1: stochastic rounding needs a bf16, fp16, int8 or fp8 checkpoint, got fp32 "
            f"(state_dtype {'auto' if settings.state_dtype is None else settings.state_dtype})", flag=_DTYPE_FLAGS)
    try:
        layout_from_vllm_config(vllm_config, settings=settings)
    except ConfigError as e:
        raise UnsupportedConfigError(f"{ENV_SWITCH}=1: {e}", flag=_LAYOUT_FLAGS) from e
    return settings


def _refuse_unsupported(vllm_config: VllmConfig) -> None:
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    arch = mc.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise _refuse(f"{arch!r}; it supports {', '.join(SUPPORTED_ARCHITECTURES)}",
                      f"unset {ENV_SWITCH} to serve {arch} with vLLM's own Mamba state")
    if getattr(mc, "runner_type", "generate") != "generate":
        raise _refuse(f"the {mc.runner_type!r} runner (decode only)", "--runner generate")
    if cc.use_replayssm:
        raise _refuse("together with vLLM's own ReplaySSM (both own the Mamba pages)", "--use-replayssm (drop it)")
    if cc.enable_prefix_caching or cc.mamba_cache_mode != "none":
        raise _refuse(f"prefix caching (enable_prefix_caching={cc.enable_prefix_caching}, mamba_cache_mode "
                      f"{cc.mamba_cache_mode!r}): a page holds one live state, no block-boundary checkpoints",
                      "--no-enable-prefix-caching")
    if _stochastic_rounding(vllm_config):
        raise _refuse("vLLM's stochastic rounding of the Mamba state (ssmstate writes the checkpoint itself)",
                      f"--enable-mamba-cache-stochastic-rounding (drop it; ssmstate's own is "
                      f"{ENV_SWITCH}_STOCHASTIC_ROUNDING=1 or additional_config "
                      f"{{\"{CONFIG_KEY}\": {{\"stochastic_rounding\": true}}}})")
    if pc.pipeline_parallel_size > 1:
        raise _refuse(f"pipeline parallelism (size {pc.pipeline_parallel_size}): every rank would commit",
                      "--pipeline-parallel-size 1")
    if pc.decode_context_parallel_size > 1 or getattr(pc, "prefill_context_parallel_size", 1) > 1:
        raise _refuse("context parallelism (one request's state on several ranks)",
                      "--decode-context-parallel-size 1 / --prefill-context-parallel-size 1")
    if pc.use_ubatching:
        raise _refuse("micro-batching (one plan per step)", "--enable-dbo / --ubatch-size (drop them)")
    if vllm_config.kv_transfer_config is not None or cc.kv_offloading_size is not None:
        raise _refuse("KV connectors or KV offloading: they move pages without ssmstate's cursors",
                      "--kv-transfer-config / --kv-offloading-size (drop them)")
    if _draft_has_mamba_layers(vllm_config):
        draft = vllm_config.speculative_config.draft_model_config
        raise _refuse(f"a draft model with Mamba layers ({draft.architecture!r}): its state would get no plan",
                      "--speculative-config: a drafter without Mamba layers (ngram, EAGLE, Nemotron-H MTP)")
    if not _uses_model_runner_v2(vllm_config):  # last: some refusals above are why vLLM picked V1
        raise _refuse("Model Runner V1 (ssmstate hooks Model Runner V2's model state)",
                      "VLLM_USE_V2_MODEL_RUNNER=1, and drop what vLLM logs as unsupported by Model Runner V2")


def is_enabled(vllm_config: VllmConfig | None) -> bool:
    """True when ssmstate runs this config's Mamba state: switch on and :func:`check_config` passes.

    Raises what :func:`check_config` raises, so a configuration that slipped past
    the config-time hook still fails before the plugin touches a page.
    """
    if not switch_on():
        return False
    if vllm_config is None or vllm_config.model_config is None:
        return False
    check_config(vllm_config)
    return True


# -- layout: the one function both sizing paths use ----------------------------------

def layout_for(*, num_heads: int, head_dim: int, state_size: int, n_groups: int, conv_kernel: int,
               tp_size: int, ssm_dtype: torch.dtype, act_dtype: torch.dtype, conv_dtype: torch.dtype,
               num_speculative_tokens: int, window: int, num_layers: int = 1) -> PageLayout:
    """The replay :class:`PageLayout` of one tensor-parallel rank (global sizes in, per-rank pages out)."""
    geometry = Mamba2Geometry(
        num_heads=num_heads, head_dim=head_dim, state_size=state_size, n_groups=n_groups,
        conv_kernel=conv_kernel, num_layers=num_layers, state_dtype=ssm_dtype, act_dtype=act_dtype,
        conv_dtype=conv_dtype, tp_size=tp_size,
    )
    return PageLayout.replay(geometry, SpecConfig(num_speculative_tokens, window))


def mamba2_dtypes(vllm_config: VllmConfig) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(conv, ssm, act) dtypes exactly as vLLM resolves them for a Mamba2 layer."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    conv, ssm = MambaStateDtypeCalculator.mamba2_state_dtype(mc.dtype, cc.mamba_cache_dtype,
                                                             cc.mamba_ssm_cache_dtype)
    return conv, ssm, mc.dtype


def checkpoint_dtype(vllm_config: VllmConfig, settings: VllmSettings | None = None) -> torch.dtype:
    """The checkpoint dtype: the ``state_dtype`` setting, else the SSM cache dtype vLLM resolves."""
    settings = settings or settings_from_vllm_config(vllm_config)
    return settings.state_dtype if settings.state_dtype is not None else mamba2_dtypes(vllm_config)[1]


def _padded_groups(n_groups: int, tp_size: int) -> int:
    if n_groups % tp_size == 0:
        return n_groups
    return n_groups + MambaStateShapeCalculator.extra_groups_for_head_shards(n_groups, tp_size)


def layout_from_vllm_config(vllm_config: VllmConfig, num_layers: int = 1,
                            settings: VllmSettings | None = None) -> PageLayout:
    """The per-layer page layout of a NemotronH config (config-time path)."""
    hf = vllm_config.model_config.hf_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    settings = settings or settings_from_vllm_config(vllm_config)
    conv, _, act = mamba2_dtypes(vllm_config)
    return layout_for(
        num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim, state_size=hf.ssm_state_size,
        n_groups=_padded_groups(hf.n_groups, tp), conv_kernel=hf.conv_kernel, tp_size=tp,
        ssm_dtype=checkpoint_dtype(vllm_config, settings), act_dtype=act, conv_dtype=conv,
        num_speculative_tokens=vllm_config.num_speculative_tokens,
        window=settings.window, num_layers=num_layers,
    )


# -- vLLM's config map: the refusals at config time ------------------------------------

def _config_check_for(arch: str, base: type | None) -> type:
    """A ``MODELS_CONFIG_MAP`` entry for ``arch``: vLLM's own entry (if any), then :func:`check_config`.

    vLLM runs it from ``VllmConfig.__post_init__`` (``try_verify_and_update_config``),
    in the process that builds the config, before any worker loads the model.
    """
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    parent = base or VerifyAndUpdateConfig

    class SSMStateConfigCheck(parent):  # type: ignore[misc,valid-type]
        ssmstate_base = base

        @classmethod
        def verify_and_update_config(cls, vllm_config: VllmConfig) -> None:
            if base is not None:
                base.verify_and_update_config(vllm_config)
            if switch_on():
                check_config(vllm_config)

    SSMStateConfigCheck.__qualname__ = SSMStateConfigCheck.__name__ = f"SSMStateConfigCheck_{arch}"
    return SSMStateConfigCheck


def register_config_checks() -> None:
    """Hook :func:`check_config` into vLLM's per-architecture config map (idempotent)."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for arch in SUPPORTED_ARCHITECTURES + MAMBA2_ARCHITECTURES:
        current = MODELS_CONFIG_MAP.get(arch)
        if current is not None and hasattr(current, "ssmstate_base"):
            continue
        MODELS_CONFIG_MAP[arch] = _config_check_for(arch, current)
