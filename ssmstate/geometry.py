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
        state_dtype: dtype of the SSM checkpoint (fp32 default; bf16, fp16, or the 8-bit int8 and
            float8_e4m3fn, which a page stores with an fp32 decode scale per head-dim row).
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
            raise ConfigError(
                f"state_dtype {self.state_dtype} not supported; use fp32, bf16, fp16, int8 or float8_e4m3fn"
            )
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
        """Bytes of one SSM state (H, P, N) on one rank (an 8-bit state's codes; PageLayout adds its scales)."""
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
class MlpGeometry:
    """Dense MLP layers: ``num_layers`` of ``hidden -> intermediate_size -> hidden``.

    ``gated``: SwiGLU (gate and up projections, 3 matrices) instead of Nemotron's squared-ReLU (2 matrices).
    """

    num_layers: int
    intermediate_size: int
    gated: bool = False


@attrs.frozen
class MoeGeometry:
    """Mixture-of-experts layers as far as weight bytes go.

    Attributes:
        num_layers: MoE layers.
        num_experts: routed experts per layer.
        intermediate_size: one routed expert's hidden size.
        shared_intermediate_size: the shared experts' combined hidden size (0: none).
        top_k: experts each token visits (for the activation estimate).
        latent_size: routed experts run in this width, with a down and an up projection around them
            (Nemotron 3 Super's latent MoE); None: the experts run at the model's hidden size.
        gated: SwiGLU experts (3 matrices) instead of squared-ReLU (2).
    """

    num_layers: int
    num_experts: int
    intermediate_size: int
    shared_intermediate_size: int = 0
    top_k: int = 1
    latent_size: int | None = None
    gated: bool = False


@attrs.frozen
class ModelConfig:
    """A hybrid Mamba2 model as the planner sees it.

    The fields after ``ssm_dtype`` size the weights (:mod:`ssmstate.weights`); they are None or empty
    when the config does not give them, and the planner then cannot count the weights.
    """

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
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    num_attention_heads: int | None = None
    mlp: MlpGeometry | None = None
    moe: MoeGeometry | None = None
    num_hidden_layers: int | None = None
    source: str | None = None

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


#: ``hybrid_override_pattern`` letters: Mamba2, attention, MLP, MoE.
PATTERN_LETTERS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: ``layers_block_type`` / ``layer_types`` names, per kind.
_BLOCK_NAMES = {
    "mamba": "mamba", "mamba2": "mamba", "linear_attention": "mamba",
    "attention": "attention", "full_attention": "attention",
    "mlp": "mlp", "moe": "moe",
}


def _layer_kinds(cfg: dict[str, Any], name: str) -> dict[str, int] | None:
    """Layer counts per kind from ``hybrid_override_pattern`` or ``layers_block_type``; None when neither is given.

    Raises ConfigError on a letter or block name that is not a known kind, and when ``num_hidden_layers``
    disagrees with the pattern's length.
    """
    pattern = cfg.get("hybrid_override_pattern")
    blocks = cfg.get("layers_block_type", cfg.get("layer_types"))
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(PATTERN_LETTERS))
        if bad:
            raise ConfigError(
                f"config of {name!r}: hybrid_override_pattern has unknown letter(s) {', '.join(map(repr, bad))}; "
                f"known: M (Mamba2), * (attention), - (MLP), E (MoE)"
            )
        kinds = [PATTERN_LETTERS[c] for c in pattern]
        what = "hybrid_override_pattern"
    elif isinstance(blocks, list):
        bad = sorted({str(b) for b in blocks} - set(_BLOCK_NAMES))
        if bad:
            raise ConfigError(f"config of {name!r}: unknown layer type(s) {', '.join(map(repr, bad))}")
        kinds = [_BLOCK_NAMES[str(b)] for b in blocks]
        what = "layers_block_type"
    else:
        return None
    if "num_hidden_layers" in cfg and int(cfg["num_hidden_layers"]) != len(kinds):
        raise ConfigError(
            f"config of {name!r}: num_hidden_layers={cfg['num_hidden_layers']} but {what} has {len(kinds)} layers"
        )
    return {k: kinds.count(k) for k in ("mamba", "attention", "mlp", "moe")}


def _first(cfg: dict[str, Any], *keys: str, default: Any = KeyError) -> Any:
    """The value of the first of ``keys`` present in ``cfg`` (config formats differ in spelling)."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    if default is KeyError:
        raise KeyError(keys[0])
    return default


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _attention(cfg: dict[str, Any], n_attn: int) -> AttentionGeometry | None:
    if not n_attn:
        return None
    heads = int(cfg["num_attention_heads"])
    num_kv = int(_first(cfg, "num_key_value_heads", default=heads))
    head_dim = _first(cfg, "head_dim", "attention_head_dim", default=None)
    if head_dim is None:
        head_dim = int(cfg["hidden_size"]) // heads
    return AttentionGeometry(n_attn, num_kv, int(head_dim))


def _nemotron_h(cfg: dict[str, Any], name: str) -> ModelConfig:
    kinds = _layer_kinds(cfg, name)
    if kinds is None:
        if "num_mamba_layers" not in cfg:
            raise ConfigError(f"config of {name!r} has neither a hybrid_override_pattern nor num_mamba_layers")
        kinds = {"mamba": int(cfg["num_mamba_layers"]), "attention": int(cfg.get("num_attention_layers", 0)),
                 "mlp": int(cfg.get("num_mlp_layers", 0)), "moe": int(cfg.get("num_moe_layers", 0))}
        total = sum(kinds.values())
        if "num_hidden_layers" in cfg and int(cfg["num_hidden_layers"]) != total:
            raise ConfigError(f"config of {name!r}: num_hidden_layers={cfg['num_hidden_layers']} but the layer "
                              f"counts add up to {total}")
    inter = cfg.get("intermediate_size")
    if isinstance(inter, list):  # one size per MLP layer in some configs; weights use the first
        inter = inter[0] if inter else None
    mlp = MlpGeometry(kinds["mlp"], int(inter)) if kinds["mlp"] and inter is not None else None
    moe = None
    if kinds["moe"] and cfg.get("n_routed_experts") is not None:
        moe = MoeGeometry(
            num_layers=kinds["moe"],
            num_experts=int(cfg["n_routed_experts"]),
            intermediate_size=int(cfg["moe_intermediate_size"]),
            shared_intermediate_size=int(cfg.get("moe_shared_expert_intermediate_size", 0))
            * int(cfg.get("n_shared_experts", 1)),
            top_k=int(cfg.get("num_experts_per_tok", 1)),
            latent_size=_int_or_none(cfg.get("moe_latent_size")),
        )
    return ModelConfig(
        name=name,
        num_heads=int(_first(cfg, "mamba_num_heads", "mamba_n_heads")),
        head_dim=int(_first(cfg, "mamba_head_dim", "mamba_d_head")),
        state_size=int(_first(cfg, "ssm_state_size", "mamba_d_state")),
        n_groups=int(_first(cfg, "n_groups", "mamba_n_groups")),
        conv_kernel=int(_first(cfg, "conv_kernel", "mamba_d_conv", default=4)),
        num_mamba_layers=kinds["mamba"],
        attention=_attention(cfg, kinds["attention"]),
        max_model_len=int(cfg.get("max_position_embeddings", 8192)),
        hidden_size=_int_or_none(cfg.get("hidden_size")),
        ssm_dtype=cfg.get("mamba_ssm_cache_dtype", "float32"),
        vocab_size=_int_or_none(cfg.get("vocab_size")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_attention_heads=_int_or_none(cfg.get("num_attention_heads")),
        mlp=mlp,
        moe=moe,
        num_hidden_layers=sum(kinds.values()),
        source=cfg.get("source"),
    )


def _mamba_head_dim(cfg: dict[str, Any], heads: int, d_inner_key: str | None = None) -> int:
    """``mamba_d_head``, or ``"auto"``/absent: d_inner / heads with d_inner = ``mamba_expand * hidden_size``."""
    head = cfg.get("mamba_d_head")
    if head is not None and head != "auto":
        return int(head)
    d_inner = cfg.get(d_inner_key) if d_inner_key else None
    if d_inner is None:
        d_inner = int(cfg.get("mamba_expand", 2)) * int(cfg["hidden_size"])
    return int(d_inner) // heads


def _mamba_attn_hybrid(cfg: dict[str, Any], name: str, model_type: str) -> ModelConfig:
    """Bamba, Granite 4.0 (granitemoehybrid) and Falcon-H1: Mamba2 mixers beside attention, SwiGLU MLPs."""
    layers = int(cfg["num_hidden_layers"])
    heads = int(_first(cfg, "mamba_n_heads", "mamba_num_heads"))
    kinds = _layer_kinds(cfg, name)
    if model_type == "falcon_h1":
        # every Falcon-H1 layer runs attention and a Mamba2 mixer in parallel, then an MLP
        n_mamba, n_attn, n_mlp = layers, layers, layers
        head_dim = _mamba_head_dim(cfg, heads, "mamba_d_ssm")
    else:
        if kinds is not None:
            n_mamba, n_attn = kinds["mamba"], kinds["attention"]
        elif cfg.get("attn_layer_indices") is not None:
            n_attn = len(cfg["attn_layer_indices"])
            n_mamba = layers - n_attn
        else:
            raise ConfigError(f"config of {name!r} gives neither layer_types nor attn_layer_indices")
        n_mlp = layers  # each layer ends in an MLP (or MoE block)
        head_dim = _mamba_head_dim(cfg, heads)
    moe = None
    mlp = None
    n_experts = int(cfg.get("num_local_experts", 0) or 0)
    if model_type == "granitemoehybrid" and n_experts > 0:
        moe = MoeGeometry(num_layers=layers, num_experts=n_experts, intermediate_size=int(cfg["intermediate_size"]),
                          shared_intermediate_size=int(cfg.get("shared_intermediate_size", 0)),
                          top_k=int(cfg.get("num_experts_per_tok", 1)), gated=True)
    elif model_type == "granitemoehybrid":
        mlp = MlpGeometry(n_mlp, int(cfg.get("shared_intermediate_size") or cfg["intermediate_size"]), gated=True)
    else:
        mlp = MlpGeometry(n_mlp, int(cfg["intermediate_size"]), gated=True)
    return ModelConfig(
        name=name,
        num_heads=heads,
        head_dim=head_dim,
        state_size=int(_first(cfg, "mamba_d_state", "ssm_state_size")),
        n_groups=int(_first(cfg, "mamba_n_groups", "n_groups", default=1)),
        conv_kernel=int(_first(cfg, "mamba_d_conv", "conv_kernel", default=4)),
        num_mamba_layers=n_mamba,
        attention=_attention(cfg, n_attn),
        max_model_len=int(cfg.get("max_position_embeddings", 8192)),
        hidden_size=int(cfg["hidden_size"]),
        vocab_size=_int_or_none(cfg.get("vocab_size")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_attention_heads=_int_or_none(cfg.get("num_attention_heads")),
        mlp=mlp,
        moe=moe,
        num_hidden_layers=layers,
        source=cfg.get("source"),
    )


def _zamba2(cfg: dict[str, Any], name: str) -> ModelConfig:
    """Zamba2: a Mamba2 mixer in every layer; a shared attention block is applied at ``hybrid`` positions.

    Only the Mamba2 state is sized from this format (its shared transformer blocks are not counted as weights).
    """
    layers = int(cfg["num_hidden_layers"])
    heads = int(_first(cfg, "n_mamba_heads", "mamba_n_heads"))
    d_inner = int(cfg.get("mamba_expand", 2)) * int(cfg["hidden_size"])
    blocks = cfg.get("layers_block_type")
    n_attn = sum(1 for b in blocks if b == "hybrid") if isinstance(blocks, list) else 0
    return ModelConfig(
        name=name,
        num_heads=heads,
        head_dim=int(cfg.get("mamba_headdim", d_inner // heads)),
        state_size=int(_first(cfg, "mamba_d_state", "state_size")),
        n_groups=int(_first(cfg, "mamba_ngroups", "n_groups", default=1)),
        conv_kernel=int(_first(cfg, "mamba_d_conv", "conv_kernel", default=4)),
        num_mamba_layers=layers,
        attention=_attention({**cfg, "hidden_size": 2 * int(cfg["hidden_size"])}, n_attn),
        max_model_len=int(cfg.get("max_position_embeddings", 4096)),
        hidden_size=int(cfg["hidden_size"]),
        vocab_size=_int_or_none(cfg.get("vocab_size")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        num_hidden_layers=layers,
        source=cfg.get("source"),
    )


def model_config_from_dict(cfg: dict[str, Any], name: str = "custom") -> ModelConfig:
    """Parse a Hugging Face config dict: NemotronH (Nemotron-H, Nemotron 3), Mamba2, Bamba, Granite 4.0
    (granitemoehybrid), Falcon-H1 and Zamba2."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config of {name!r} must be a JSON object, got {type(cfg).__name__}")
    model_type = str(cfg.get("model_type", "")).lower()
    archs = [str(a) for a in cfg.get("architectures", []) or []]
    try:
        if model_type in ("nemotron_h", "nemotronh") or any("NemotronH" in a for a in archs):
            return _nemotron_h(cfg, name)
        if model_type in ("bamba", "granitemoehybrid", "falcon_h1"):
            return _mamba_attn_hybrid(cfg, name, model_type)
        if model_type == "zamba2":
            return _zamba2(cfg, name)
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
                vocab_size=_int_or_none(cfg.get("vocab_size")),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                source=cfg.get("source"),
            )
    except KeyError as exc:
        raise ConfigError(f"config of {name!r} lacks key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config of {name!r} has a value of the wrong type: {exc}") from None
    raise ConfigError(
        f"config of {name!r} is not a supported hybrid Mamba2 model (model_type={model_type!r}, "
        f"architectures={archs}); supported: nemotron_h, mamba2, bamba, granitemoehybrid, falcon_h1, zamba2"
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
