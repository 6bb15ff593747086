"""Bundled presets: every byte and parameter count checked against a count made here from the raw config numbers.

The independent counts read ``ssmstate/presets/models.json`` with ``json`` and do the arithmetic by hand (pattern
letters counted with ``str.count``), not through the library's parser, layout or weight code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssmstate.errors import ConfigError
from ssmstate.geometry import load_model, model_config_from_dict, preset_names
from ssmstate.layout import PageLayout, SpecConfig
from ssmstate.planner import plan_capacity
from ssmstate.weights import weight_memory

RAW = {k: v for k, v in json.loads(
    (Path(__file__).resolve().parents[1] / "ssmstate" / "presets" / "models.json").read_text()).items()
    if not k.startswith("_")}
GiB = 1 << 30


def test_presets_include_the_nemotron_family() -> None:
    for name in ("nemotron-h-4b", "nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b", "nemotron-nano-9b-v2",
                 "nemotron-nano-12b-v2", "nemotron-3-nano-30b-a3b", "nemotron-3-super-120b"):
        assert name in preset_names()
        assert RAW[name].get("source"), f"{name} names no source"


def _hand_counts(c: dict) -> dict[str, int]:
    p = c["hybrid_override_pattern"]
    return {"M": p.count("M"), "*": p.count("*"), "-": p.count("-"), "E": p.count("E"), "len": len(p)}


@pytest.mark.parametrize("name", sorted(RAW))
@pytest.mark.parametrize("k", [0, 3, 7])
def test_state_bytes_match_a_hand_count(name: str, k: int) -> None:
    c = RAW[name]
    n = _hand_counts(c)
    assert n["len"] == c["num_hidden_layers"]
    H, P, N, G, kw = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["n_groups"], c["conv_kernel"]
    conv_dim = H * P + 2 * G * N
    W = 16
    T = 1 + k
    R = W + T
    native_layer = H * P * N * 4 + conv_dim * (kw - 1 + k) * 2
    replay_layer = H * P * N * 4 + H * R * P * 2 + G * R * N * 2 + H * R * 4 + conv_dim * (kw - 1 + T) * 2
    geom = load_model(name).mamba_geometry()
    assert geom.num_layers == n["M"]
    spec = SpecConfig(k, W)
    assert PageLayout.native(geom, spec).layer_page_bytes == native_layer
    assert PageLayout.replay(geom, spec).layer_page_bytes == replay_layer
    plan = plan_capacity(name, num_speculative_tokens=k, window=W, kv_cache_memory="1TiB")
    assert plan.native.mamba_bytes_per_request == (1 + k) * n["M"] * native_layer
    assert plan.replay.mamba_bytes_per_request == n["M"] * replay_layer
    assert plan.attention_bytes_per_token == 2 * n["*"] * c["num_key_value_heads"] * c["head_dim"] * 2
    assert plan.vllm_replayssm is not None
    assert plan.vllm_replayssm.layer_page_bytes == replay_layer - conv_dim * 2


def _hand_parameters(c: dict) -> int:
    """Parameters of a NemotronH checkpoint as vLLM builds it, from the raw config numbers."""
    n = _hand_counts(c)
    h, V = c["hidden_size"], c["vocab_size"]
    H, P, N, G, kw = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["n_groups"], c["conv_kernel"]
    di = H * P
    mamba = h * (2 * di + 2 * G * N + H) + (di + 2 * G * N) * (kw + 1) + 3 * H + di + di * h + h
    hd, q, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    attn = h * (q + 2 * kv) * hd + q * hd * h + h
    mlp = 2 * h * c["intermediate_size"] + h if n["-"] else 0
    moe = 0
    if n["E"]:
        E, fi = c["n_routed_experts"], c["moe_intermediate_size"]
        lat = c.get("moe_latent_size")
        width = lat if lat else h
        moe = (E * 2 * width * fi + 2 * h * c["moe_shared_expert_intermediate_size"] * c["n_shared_experts"]
               + h * E + E + h + (2 * h * lat if lat else 0))
    embed = V * h * (1 if c["tie_word_embeddings"] else 2)
    return embed + n["M"] * mamba + n["*"] * attn + n["-"] * mlp + n["E"] * moe + h


@pytest.mark.parametrize("name", sorted(RAW))
def test_parameter_count_matches_a_hand_count(name: str) -> None:
    w = weight_memory(load_model(name), "bf16")
    assert w.num_parameters == _hand_parameters(RAW[name])
    # bf16: every parameter is 2 bytes on one rank
    assert w.total_bytes == 2 * w.num_parameters


#: Parameter totals the model publishers state (model cards, NVIDIA's Nemotron 3 announcement); the count from the
#: config lands within the rounding of those statements.
PUBLISHED_PARAMETERS = {
    "nemotron-h-8b": (8e9, 0.02),
    "nemotron-h-47b": (47e9, 0.02),
    "nemotron-h-56b": (56e9, 0.02),
    "nemotron-3-nano-30b-a3b": (31.6e9, 0.005),
    "nemotron-3-super-120b": (120e9, 0.01),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_count_near_the_published_total(name: str) -> None:
    total, rel = PUBLISHED_PARAMETERS[name]
    assert weight_memory(load_model(name)).num_parameters == pytest.approx(total, rel=rel)


def test_weights_match_vllm_logged_loading_of_nano_9b_v2() -> None:
    """vLLM logged "Model loading took 16.5557 GiB" for NVIDIA-Nemotron-Nano-9B-v2 in bf16, TP 1
    (vllm-project/vllm#23230); the count from the config is within 0.1 % of it."""
    got = weight_memory(load_model("nemotron-nano-9b-v2"), "bf16").total_bytes / GiB
    assert got == pytest.approx(16.5557, rel=1e-3)


def test_weight_dtypes_and_tensor_parallel() -> None:
    cfg = load_model("nemotron-3-nano-30b-a3b")
    bf16, fp8, nvfp4 = (weight_memory(cfg, d) for d in ("bf16", "fp8", "nvfp4"))
    assert bf16.total_bytes > fp8.total_bytes > nvfp4.total_bytes
    # embeddings and lm_head stay bf16 whatever the weight dtype
    assert fp8.bytes_per_part["embedding"] == bf16.bytes_per_part["embedding"]
    assert fp8.bytes_per_part["moe"] < 0.51 * bf16.bytes_per_part["moe"]
    tp2 = weight_memory(cfg, "bf16", tp_size=2)
    assert tp2.bytes_per_part["norm"] == bf16.bytes_per_part["norm"]  # replicated
    assert tp2.bytes_per_part["embedding"] * 2 == bf16.bytes_per_part["embedding"]
    with pytest.raises(ConfigError, match="unknown weight dtype"):
        weight_memory(cfg, "int3")


# -- other config formats -----------------------------------------------------------------------

def test_bamba_style_config() -> None:
    cfg = {"model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27],
           "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    m = model_config_from_dict(cfg, "bamba")
    assert (m.num_mamba_layers, m.attention.num_layers, m.num_heads, m.head_dim, m.n_groups) == (29, 3, 128, 64, 1)
    assert m.mlp is not None and m.mlp.gated and m.mlp.num_layers == 32


def test_granite_and_falcon_h1_style_configs() -> None:
    granite = {"model_type": "granitemoehybrid", "hidden_size": 1536, "num_hidden_layers": 4,
               "layer_types": ["mamba", "mamba", "attention", "mamba"], "mamba_n_heads": 48, "mamba_d_head": "auto",
               "mamba_expand": 2, "mamba_n_groups": 1, "mamba_d_state": 128, "num_attention_heads": 12,
               "num_key_value_heads": 4, "intermediate_size": 512, "shared_intermediate_size": 4096,
               "num_local_experts": 0, "vocab_size": 100352}
    m = model_config_from_dict(granite, "granite")
    assert (m.num_mamba_layers, m.attention.num_layers, m.head_dim) == (3, 1, 2 * 1536 // 48)
    falcon = {"model_type": "falcon_h1", "hidden_size": 2048, "num_hidden_layers": 24, "mamba_n_heads": 48,
              "mamba_d_head": 64, "mamba_d_ssm": 3072, "mamba_n_groups": 1, "mamba_d_state": 256,
              "mamba_d_conv": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
              "intermediate_size": 4608, "vocab_size": 65537}
    f = model_config_from_dict(falcon, "falcon")
    assert (f.num_mamba_layers, f.attention.num_layers, f.head_dim, f.state_size) == (24, 24, 64, 256)


def test_bad_patterns_are_refused() -> None:
    base = dict(RAW["nemotron-h-8b"])
    with pytest.raises(ConfigError, match="unknown letter"):
        model_config_from_dict({**base, "hybrid_override_pattern": base["hybrid_override_pattern"][:-1] + "Q"})
    with pytest.raises(ConfigError, match="num_hidden_layers=53"):
        model_config_from_dict({**base, "num_hidden_layers": 53})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        model_config_from_dict([base])  # type: ignore[arg-type]
