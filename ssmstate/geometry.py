"""Model geometry: the Mamba2 shapes that size a page, and the attention facts a planner needs.

Everything is a frozen attrs value. Geometry values are *global* (whole model);
the ``*_per_rank`` properties give what one tensor-parallel rank holds, which is
what pages and kernels see.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import torch

from ssmstate.dtypes import ACT_DTYPES, STATE_DTYPES, dtype_name, dtype_size, to_dtype
from ssmstate.errors import ConfigError


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{attribute.name} must be a positive int, got {value!r}")


def _optional_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    return None if value is None else to_dtype(value)


@attrs.frozen
class Mamba2Geometry:
    """Shapes of the Mamba2 mixers of one model.

    Args:
        num_heads: H, SSM heads (global).
        head_dim: P.
        state_size: N (d_state).
        n_groups: G; B and C are shared by H/G heads.
        conv_kernel: width of the causal depthwise conv1d (4 for every Nemotron).
        num_layers: number of Mamba2 layers.
        state_dtype: dtype of the SSM checkpoint (fp32 default).
        act_dtype: dtype of x, B, C and of the x/B rings.
        conv_dtype: dtype of the conv window; defaults to ``act_dtype``.
        tp_size: tensor-parallel size; must divide heads and groups.
    """

    num_heads: int = attrs.field(validator=_positive)
    head_dim: int = attrs.field(validator=_positive)
    state_size: int = attrs.field(validator=_positive)
    n_groups: int = attrs.field(validator=_positive)
    conv_kernel: int = attrs.field(validator=_positive)
    num_layers: int = attrs.field(validator=_positive)
    state_dtype: torch.dtype = attrs.field(default=torch.float32, converter=to_dtype)
    act_dtype: torch.dtype = attrs.field(default=torch.bfloat16, converter=to_dtype)
    conv_dtype: torch.dtype | None = attrs.field(default=None, converter=_optional_dtype)
    tp_size: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.num_heads % self.n_groups:
            raise ConfigError(f"n_groups={self.n_groups} must divide num_heads={self.num_heads}")
        if self.num_heads % self.tp_size or self.n_groups % self.tp_size:
            raise ConfigError(
                f"tp_size={self.tp_size} must divide num_heads={self.num_heads} and "
                f"n_groups={self.n_groups}"
            )
        if self.conv_dim % self.tp_size:
            raise ConfigError(f"tp_size={self.tp_size} must divide conv_dim={self.conv_dim}")
        if self.conv_kernel < 2:
            raise ConfigError(f"conv_kernel must be at least 2, got {self.conv_kernel}")
        if self.state_dtype not in STATE_DTYPES:
            raise ConfigError(f"state_dtype {self.state_dtype} not supported; use fp32, bf16 or fp16")
        if self.act_dtype not in ACT_DTYPES:
            raise ConfigError(f"act_dtype {self.act_dtype} not supported; use bf16, fp16 or fp32")

    # -- derived sizes ------------------------------------------------------
    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels through the conv: x, B and C packed (global)."""
        return self.num_heads * self.head_dim + 2 * self.n_groups * self.state_size

    @property
    def heads_per_rank(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def groups_per_rank(self) -> int:
        return self.n_groups // self.tp_size

    @property
    def conv_dim_per_rank(self) -> int:
        return self.conv_dim // self.tp_size

    @property
    def conv_state_dtype(self) -> torch.dtype:
        return self.conv_dtype if self.conv_dtype is not None else self.act_dtype

    @property
    def state_bytes(self) -> int:
        """Bytes of one SSM state (H, P, N) on one rank."""
        return self.heads_per_rank * self.head_dim * self.state_size * dtype_size(self.state_dtype)

    def describe(self) -> dict[str, Any]:
        return {
            "num_heads": self.num_heads, "head_dim": self.head_dim, "state_size": self.state_size,
            "n_groups": self.n_groups, "conv_kernel": self.conv_kernel, "num_layers": self.num_layers,
            "conv_dim": self.conv_dim, "tp_size": self.tp_size,
            "state_dtype": dtype_name(self.state_dtype), "act_dtype": dtype_name(self.act_dtype),
            "conv_dtype": dtype_name(self.conv_state_dtype),
        }

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str], **overrides: Any) -> "Mamba2Geometry":
        """Geometry of a bundled preset (``"nemotron-h-8b"``) or a Hugging Face ``config.json``.

        ``name_or_path`` is a preset name, a ``config.json`` file, or a directory
        holding one. ``overrides`` replace fields (``tp_size=2``, ``state_dtype="bf16"``).
        """
        return load_model(name_or_path).mamba_geometry(**overrides)


@attrs.frozen
class AttentionGeometry:
    """The attention layers of a hybrid model, as far as KV-cache bytes go."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype = attrs.field(default=torch.bfloat16, converter=to_dtype)

    def kv_bytes_per_token(self, tp_size: int = 1) -> int:
        """K and V bytes per token over all attention layers on one rank.

        KV heads are split across ranks; with more ranks than KV heads they are
        replicated (one head per rank), as vLLM does.
        """
        heads = max(1, self.num_kv_heads // tp_size)
        return 2 * self.num_layers * heads * self.head_dim * dtype_size(self.kv_dtype)

    def kv_bytes_per_token_per_layer(self, tp_size: int = 1) -> int:
        heads = max(1, self.num_kv_heads // tp_size)
        return 2 * heads * self.head_dim * dtype_size(self.kv_dtype)


@attrs.frozen
class ModelConfig:
    """A hybrid Mamba2 model as the planner sees it."""

    name: str
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    num_mamba_layers: int
    attention: AttentionGeometry | None
    max_model_len: int
    hidden_size: int | None = None
    ssm_dtype: torch.dtype = attrs.field(default=torch.float32, converter=to_dtype)

    def mamba_geometry(self, **overrides: Any) -> Mamba2Geometry:
        fields: dict[str, Any] = dict(
            num_heads=self.num_heads, head_dim=self.head_dim, state_size=self.state_size,
            n_groups=self.n_groups, conv_kernel=self.conv_kernel, num_layers=self.num_mamba_layers,
            state_dtype=self.ssm_dtype,
        )
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return Mamba2Geometry(**fields)


def _load_presets() -> dict[str, dict[str, Any]]:
    text = resources.files("ssmstate.presets").joinpath("models.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


PRESETS: dict[str, dict[str, Any]] = _load_presets()


def preset_names() -> list[str]:
    return sorted(PRESETS)


def _count_layers(cfg: dict[str, Any], symbol: str, key: str) -> int:
    if key in cfg:
        return int(cfg[key])
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        return pattern.count(symbol)
    block_types = cfg.get("layers_block_type")
    if isinstance(block_types, list):
        name = {"M": "mamba", "*": "attention"}[symbol]
        return sum(1 for b in block_types if b == name)
    raise ConfigError(f"config has neither {key!r} nor a hybrid_override_pattern")


def model_config_from_dict(cfg: dict[str, Any], name: str = "custom") -> ModelConfig:
    """Parse a Hugging Face config dict (NemotronH or Mamba2 architectures)."""
    model_type = str(cfg.get("model_type", "")).lower()
    archs = [str(a) for a in cfg.get("architectures", []) or []]
    try:
        if model_type in ("nemotron_h", "nemotronh") or any("NemotronH" in a for a in archs):
            num_kv = int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
            attn_head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim")
            if attn_head_dim is None:
                attn_head_dim = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
            n_attn = _count_layers(cfg, "*", "num_attention_layers")
            return ModelConfig(
                name=name,
                num_heads=int(cfg["mamba_num_heads"]),
                head_dim=int(cfg["mamba_head_dim"]),
                state_size=int(cfg["ssm_state_size"]),
                n_groups=int(cfg["n_groups"]),
                conv_kernel=int(cfg.get("conv_kernel", 4)),
                num_mamba_layers=_count_layers(cfg, "M", "num_mamba_layers"),
                attention=AttentionGeometry(n_attn, num_kv, int(attn_head_dim)) if n_attn else None,
                max_model_len=int(cfg.get("max_position_embeddings", 8192)),
                hidden_size=int(cfg["hidden_size"]) if "hidden_size" in cfg else None,
                ssm_dtype=cfg.get("mamba_ssm_cache_dtype", "float32"),
            )
        if model_type == "mamba2" or any("Mamba2" in a for a in archs):
            head_dim = int(cfg.get("head_dim", 64))
            num_heads = int(cfg.get("num_heads") or (int(cfg["expand"]) * int(cfg["hidden_size"]) // head_dim))
            return ModelConfig(
                name=name,
                num_heads=num_heads,
                head_dim=head_dim,
                state_size=int(cfg.get("state_size", 128)),
                n_groups=int(cfg.get("n_groups", 1)),
                conv_kernel=int(cfg.get("conv_kernel", 4)),
                num_mamba_layers=int(cfg["num_hidden_layers"]),
                attention=None,
                max_model_len=int(cfg.get("max_position_embeddings", 1 << 20)),
                hidden_size=int(cfg["hidden_size"]) if "hidden_size" in cfg else None,
            )
    except KeyError as exc:
        raise ConfigError(f"config of {name!r} lacks key {exc.args[0]!r}") from None
    raise ConfigError(
        f"config of {name!r} is neither NemotronH nor Mamba2 (model_type={model_type!r}, "
        f"architectures={archs})"
    )


def load_model(name_or_path: str | os.PathLike[str]) -> ModelConfig:
    """A bundled preset by name, or a Hugging Face ``config.json`` (file or directory)."""
    key = str(name_or_path)
    if key in PRESETS:
        return model_config_from_dict(PRESETS[key], name=key)
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"unknown model {key!r}: not a bundled preset ({', '.join(preset_names())}) "
            f"and no config.json at that path"
        )
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return model_config_from_dict(cfg, name=str(name_or_path))
