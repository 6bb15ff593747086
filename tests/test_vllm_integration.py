"""ssmstate inside vLLM 0.33: tested against vLLM's real classes on CPU (no GPU, no weights).

* vLLM's own ``MambaManager`` + ``BlockPool`` with our spec allocate one block per
  request at K=3 (four with vLLM's stock ``MambaSpec``) and free them all.
* vLLM's ``get_max_concurrency_for_kv_cache_config`` on a Nemotron-H-8B config with
  our plugin equals ``plan_capacity(..., vllm_compatible=True)``.
* Metadata built by vLLM's ``Mamba2AttentionMetadataBuilder`` for mixed batches
  becomes a StepPlan; conv + verify per layer, then the commit of ``num_sampled``,
  match a token-by-token serial oracle over many steps.

Config creation replicates the decisions vLLM's CUDA platform makes and the
unspecified platform of a CPU box does not: a device type, the hybrid KV-cache
manager on, ``Platform._align_hybrid_block_size`` with the FlashAttention backend,
the KV-cache layout the engine core resolves; host memory is not pinned.
"""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from tests.harness import TINY_NEMOTRON_H  # noqa: E402

MODEL = "nemotron-h-8b"
K = 3


@pytest.fixture(scope="module")
def vllm_mod():
    """Import vLLM and our integration once, register the plugin (twice: idempotent)."""
    old = os.environ.get("SSMSTATE_VLLM")
    os.environ["SSMSTATE_VLLM"] = "1"
    import vllm.platforms as platforms

    import ssmstate.integrations.vllm as sv

    sv.register()
    sv.register()
    from vllm.v1.attention.backends import mamba2_attn, utils  # noqa: F401  (modules that read PIN_MEMORY)

    plat = type(platforms.current_platform)
    old_device = plat.device_type
    pinned = []
    if not old_device:
        plat.device_type = "cpu"
        # No accelerator: nothing to pin host memory for (vLLM decided PIN_MEMORY at import).
        pinned = [m for name, m in list(sys.modules.items())
                  if name.startswith("vllm") and getattr(m, "PIN_MEMORY", None) is True]
        for m in pinned:
            m.PIN_MEMORY = False
    yield sv
    plat.device_type = old_device
    for m in pinned:
        m.PIN_MEMORY = True
    if old is None:
        os.environ.pop("SSMSTATE_VLLM", None)
    else:
        os.environ["SSMSTATE_VLLM"] = old


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A local config.json for Nemotron-H-8B from the bundled preset (no weights, no tokenizer)."""
    from ssmstate.geometry import PRESETS

    cfg = {k: v for k, v in PRESETS[MODEL].items() if k != "hf_name"}
    cfg.update(torch_dtype="bfloat16", vocab_size=131072, intermediate_size=21504, rms_norm_eps=1e-5,
               layer_norm_epsilon=1e-5, mamba_hidden_act="silu", mlp_hidden_act="relu2", use_conv_bias=True,
               use_bias=False, residual_in_fp32=False, attention_bias=False, mlp_bias=False,
               tie_word_embeddings=False)
    d = tmp_path_factory.mktemp("nemotron_h_8b")
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


class _Env:
    def __init__(self, value: str) -> None:
        self.value, self.old = value, None

    def __enter__(self):
        self.old = os.environ.get("SSMSTATE_VLLM")
        os.environ["SSMSTATE_VLLM"] = self.value

    def __exit__(self, *exc):
        os.environ["SSMSTATE_VLLM"] = self.old if self.old is not None else "1"


def make_config(model_dir: str, enabled: bool, max_model_len: int, **extra):
    """A VllmConfig as vLLM's CUDA platform would finish it, ngram spec decode with K=3."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    with _Env("1" if enabled else "0"):
        args = EngineArgs(
            model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len, enable_prefix_caching=False,
            enforce_eager=True,
            speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
                                "prompt_lookup_min": 2}, **extra,
        )
        vc = args.create_engine_config()
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False  # CudaPlatform.support_hybrid_kv_cache()
        Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    return vc


@pytest.fixture(scope="module")
def configs(vllm_mod, model_dir):
    """(ssmstate, stock) configs at max_model_len 1024 and 8192."""
    return {(enabled, mml): make_config(model_dir, enabled, mml) for enabled in (True, False) for mml in (1024, 8192)}


def stock_spec(vc):
    """The MambaSpec vLLM's own MambaMixer2 returns (MambaBase.get_kv_cache_spec + the mixer's replace)."""
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
    from vllm.v1.kv_cache_interface import MambaSpec

    cc = vc.cache_config
    with _Env("0"):
        return MambaSpec(
            shapes=NemotronHForCausalLM.get_mamba_state_shape_from_config(vc),
            dtypes=NemotronHForCausalLM.get_mamba_state_dtype_from_config(vc),
            block_size=cc.mamba_block_size, page_size_padded=cc.mamba_page_size_padded,
            mamba_cache_mode=cc.mamba_cache_mode, num_speculative_blocks=vc.num_speculative_tokens,
            num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1,
        )


def default_block_size() -> int:
    """vLLM's starting attention block size (16 in 0.32/0.33, 64 in 0.34), before hybrid alignment."""
    from vllm.config.cache import CacheConfig

    return CacheConfig.DEFAULT_BLOCK_SIZE


def our_spec(sv, vc):
    """What SSMStateMambaMixer2.get_kv_cache_spec returns for this config."""
    return sv.spec_from_layout(sv.layout_from_vllm_config(vc), vc)


# -- spec, sizing, registry ------------------------------------------------------------

def test_spec_page_is_the_layout_page_on_both_sizing_paths(vllm_mod, configs):
    sv = vllm_mod
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from ssmstate.planner import plan_capacity

    vc = configs[(True, 8192)]
    layout = sv.layout_from_vllm_config(vc)
    spec = our_spec(sv, vc)
    plan = plan_capacity(MODEL, kv_cache_memory="64GiB", num_speculative_tokens=K,
                         max_model_len=8192, vllm_compatible=True,
                         block_size=default_block_size())
    assert spec.num_speculative_blocks == 0
    assert spec.real_page_size_bytes == layout.layer_page_bytes == plan.replay.layer_page_bytes
    # Config-time path (what the platform sizes the attention block with) agrees with the layer path.
    cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architecture, model_config=vc.model_config)
    assert cls is sv.SSMStateNemotronHForCausalLM
    config_page = MambaSpec(shapes=cls.get_mamba_state_shape_from_config(vc),
                            dtypes=cls.get_mamba_state_dtype_from_config(vc), block_size=-1).page_size_bytes
    assert config_page == spec.real_page_size_bytes
    assert vc.cache_config.mamba_page_size_padded == spec.page_size_bytes == plan.vllm_replay.page_bytes
    assert vc.cache_config.block_size == plan.vllm_replay.block_size
    assert KVCacheSpecRegistry.get_manager_class(spec) is MambaManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(spec) is MambaSpec
    with pytest.raises(sv.ConfigError):
        type(spec)(shapes=spec.shapes, dtypes=spec.dtypes, block_size=spec.block_size, num_speculative_blocks=K)
    # Stock vLLM config sizing is untouched when the switch is off.
    assert configs[(False, 8192)].cache_config.block_size == plan.vllm_native.block_size


@pytest.mark.parametrize("state_dtype", ["int8", "fp8", "bf16"])
def test_narrow_checkpoint_page_agrees_to_the_byte(vllm_mod, model_dir, state_dtype):
    """``state_dtype`` in additional_config: vLLM's spec, its config-time page, the layer page, the pool and the
    views carved from vLLM's raw page all hold the same tensors at the same bytes, scales included."""
    sv = vllm_mod
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.kv_cache_interface import MambaSpec

    from ssmstate.cache import StateCache
    from ssmstate.dtypes import to_dtype
    from ssmstate.layout import CURSOR_BYTES_PER_PAGE, SCALE_NAME

    vc = make_config(model_dir, True, 8192, additional_config={"ssmstate": {"state_dtype": state_dtype}})
    dtype = to_dtype(state_dtype)
    assert sv.check_config(vc).state_dtype == dtype
    layout = sv.layout_from_vllm_config(vc)
    spec = our_spec(sv, vc)
    names = [t.name for t in layout.tensors]
    eight_bit = state_dtype in ("int8", "fp8")
    assert names[:2] == (["checkpoint", SCALE_NAME] if eight_bit else ["checkpoint", "x_ring"])
    assert spec.dtypes[0] == dtype and spec.real_page_size_bytes == layout.layer_page_bytes
    H, P, N = 128, 64, 128  # Nemotron-H-8B, one rank
    ring_and_conv = 4716544 - H * P * N * 4  # the fp32 page less its checkpoint
    want = H * P * N * dtype.itemsize + (H * P * 4 if eight_bit else 0) + ring_and_conv
    assert layout.layer_page_bytes == want
    cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architecture, model_config=vc.model_config)
    config_page = MambaSpec(shapes=cls.get_mamba_state_shape_from_config(vc),
                            dtypes=cls.get_mamba_state_dtype_from_config(vc), block_size=-1).page_size_bytes
    assert config_page == layout.layer_page_bytes
    assert vc.cache_config.mamba_page_size_padded == spec.page_size_bytes >= layout.layer_page_bytes
    # vLLM's raw page (padded to the attention page) carved into views: every tensor where the layout puts it.
    blocks = 3
    raw = torch.zeros((blocks, 1, 1, spec.page_size_bytes), dtype=torch.int8)
    views = sv.page_views(layout, raw)
    offset = 0
    for t in layout.tensors:
        v = views[t.name]
        assert v.dtype == t.dtype and tuple(v.shape) == (blocks, *t.shape) and t.is_laid_out(v), t
        assert v.data_ptr() - raw.data_ptr() == offset and v.stride(0) == spec.page_size_bytes // t.dtype.itemsize
        offset += t.nbytes
    assert offset == layout.layer_page_bytes
    # the pool ssmstate allocates on its own: the same page, plus the cursors
    pool = StateCache(layout, 2, "cpu")
    assert layout.allocated_bytes_per_page == layout.layer_page_bytes + CURSOR_BYTES_PER_PAGE
    assert pool.nbytes == 2 * layout.allocated_bytes_per_page
    assert all(pool.layers[0][t.name].dtype == t.dtype for t in layout.tensors)
    print(f"{state_dtype}: page {layout.layer_page_bytes} B ({layout.layer_page_bytes / 4716544:.3f}x the fp32 "
          f"page), vLLM block {vc.cache_config.block_size} tokens, padded page {spec.page_size_bytes} B")


def test_entry_point_declared_and_loadable(vllm_mod):
    """pyproject declares the plugin; where ssmstate is installed, vLLM's own loader finds it."""
    import tomllib
    from importlib import metadata
    from pathlib import Path

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][DEFAULT_PLUGINS_GROUP] == {
        "ssmstate": "ssmstate.integrations.vllm_plugin:register"}
    try:
        dist = metadata.distribution("ssmstate")
    except metadata.PackageNotFoundError:
        pytest.skip("ssmstate is not installed (pip install -e .): vLLM cannot discover its entry point")
    installed = {ep.name: ep.value for ep in dist.entry_points if ep.group == DEFAULT_PLUGINS_GROUP}
    if installed != pyproject["project"]["entry-points"][DEFAULT_PLUGINS_GROUP]:
        pytest.skip(f"the installed ssmstate metadata declares {installed} (installed from another checkout)")
    from ssmstate.integrations import vllm_plugin

    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins["ssmstate"] is vllm_plugin.register
    plugins["ssmstate"]()  # idempotent: a second registration in the same process changes nothing


def test_switch_and_model_state_hook(vllm_mod, configs):
    sv = vllm_mod
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    vc = configs[(True, 8192)]
    assert sv.is_enabled(vc)
    with _Env("0"):
        assert not sv.is_enabled(vc)
    assert issubclass(sv.SSMStateModelState, MambaHybridModelState)
    model = object.__new__(sv.SSMStateNemotronHForCausalLM)
    model.__dict__["vllm_config"] = vc
    assert model.get_model_state_cls() is sv.SSMStateModelState
    with _Env("0"):
        assert model.get_model_state_cls() is MambaHybridModelState
    settings = sv.settings_from_vllm_config(vc)
    assert settings.enabled and settings.window == 16
    assert not settings.pdl and settings.backend_options is None
    os.environ["SSMSTATE_VLLM_PDL"] = "on"
    try:
        assert sv.settings_from_vllm_config(vc).backend_options == {"pdl": True}
        os.environ["SSMSTATE_VLLM_BACKEND"] = "reference"
        with pytest.raises(sv.ConfigError, match="pdl needs the triton backend"):
            sv.settings_from_vllm_config(vc)
    finally:
        os.environ.pop("SSMSTATE_VLLM_PDL")
        os.environ.pop("SSMSTATE_VLLM_BACKEND", None)
    for key, bad in (("SSMSTATE_VLLM_WINDOW", "sixteen"), ("SSMSTATE_VLLM_BACKEND", "cuda"),
                     ("SSMSTATE_VLLM_PDL", "maybe")):
        os.environ[key] = bad
        try:
            with pytest.raises(sv.ConfigError):
                sv.settings_from_vllm_config(vc)
        finally:
            os.environ.pop(key)
    # additional_config carries the settings, never the switch (tests/test_vllm_config.py has the rest).
    try:
        vc.additional_config = {"ssmstate": {"window": 8, "pdl": True}}
        assert sv.settings_from_vllm_config(vc) == sv.VllmSettings(enabled=True, window=8, backend="triton",
                                                                   pdl=True)
        vc.additional_config = {"ssmstate": {"pdl": "fast"}}
        with pytest.raises(sv.ConfigError, match="pdl must be a bool"):
            sv.settings_from_vllm_config(vc)
    finally:
        vc.additional_config = {}


@pytest.mark.parametrize("which", ["ssmstate", "stock"])
def test_mamba_manager_blocks_per_request(vllm_mod, configs, which):
    """vLLM's MambaManager + BlockPool: 1 block per request with our spec at K=3, 4 with vLLM's."""
    sv = vllm_mod
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    vc = configs[(which == "ssmstate", 8192)]
    spec = our_spec(sv, vc) if which == "ssmstate" else stock_spec(vc)
    manager_cls = KVCacheSpecRegistry.get_manager_class(spec)
    assert manager_cls is MambaManager
    pool = BlockPool(num_gpu_blocks=64, enable_caching=False, hash_block_size=spec.block_size)
    mgr = manager_cls(spec, pool, enable_caching=False, kv_cache_group_id=0, scheduler_block_size=spec.block_size)
    free0 = pool.get_num_free_blocks()
    want = 1 if which == "ssmstate" else 1 + K
    rids = [f"req{i}" for i in range(6)]
    for i, rid in enumerate(rids):
        prompt = 17 + 100 * i
        n = mgr.get_num_blocks_to_allocate(rid, prompt + K, [], 0, 0, prompt + K)
        blocks = mgr.allocate_new_blocks(rid, prompt + K, prompt + K)
        assert n == len(blocks) == want
        # Decode steps with K lookahead tokens never add blocks.
        for step in range(1, 4):
            tokens = prompt + step * (1 + K) + K
            assert mgr.get_num_blocks_to_allocate(rid, tokens, [], tokens - 1 - K, 0, tokens) == 0
            assert mgr.allocate_new_blocks(rid, tokens, tokens) == []
        ids = [b.block_id for b in mgr.req_to_blocks[rid]]
        assert len(ids) == want and 0 not in ids
    assert pool.get_num_free_blocks() == free0 - want * len(rids)
    for rid in rids:
        mgr.free(rid)
    assert pool.get_num_free_blocks() == free0


# -- concurrency: vLLM's figure with the plugin == the planner -------------------------------

def _max_concurrency(vc, spec, memory: int) -> float:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from ssmstate.geometry import PRESETS

    hf = vc.model_config.hf_config
    attn = FullAttentionSpec(block_size=vc.cache_config.block_size, num_kv_heads=hf.num_key_value_heads,
                             head_size=hf.head_dim, dtype=vc.model_config.dtype)
    specs = {}
    for i, kind in enumerate(PRESETS[MODEL]["hybrid_override_pattern"]):
        if kind == "M":
            specs[f"model.layers.{i}.mixer"] = spec
        elif kind == "*":
            specs[f"model.layers.{i}.mixer.attn"] = attn
    if vc.cache_config.kv_cache_layout is None:
        names = [layout.name for layout in get_supported_kv_cache_layouts([FlashAttentionBackend])]
        resolve_kv_cache_layout(vc, [names], list(specs.values()))
    groups = get_global_kv_cache_groups(vc, [specs])
    kv_cache_config = get_kv_cache_configs(vc, [specs], [memory], groups)[0]
    return get_max_concurrency_for_kv_cache_config(vc, kv_cache_config)


@pytest.mark.parametrize("max_model_len", [1024, 8192])
def test_max_concurrency_matches_planner(vllm_mod, configs, max_model_len):
    sv = vllm_mod
    from ssmstate.planner import plan_capacity

    memory = 64 << 30
    ours = _max_concurrency(configs[(True, max_model_len)], our_spec(sv, configs[(True, max_model_len)]), memory)
    stock = _max_concurrency(configs[(False, max_model_len)], stock_spec(configs[(False, max_model_len)]), memory)
    plan = plan_capacity(MODEL, kv_cache_memory=memory, num_speculative_tokens=K, window=16,
                         state_dtype="float32", max_model_len=max_model_len, vllm_compatible=True,
                         block_size=default_block_size())
    assert ours == plan.vllm_replay.max_concurrency
    assert stock == plan.vllm_native.max_concurrency
    ratio = ours / stock
    print(f"max_model_len={max_model_len}: vLLM max concurrency ssmstate {ours:.2f} vs stock {stock:.2f} "
          f"({ratio:.2f}x)")
    if max_model_len == 1024:
        assert ratio >= 3.0  # Mamba state dominates: 1 block per group instead of 1 + K
    else:
        assert ratio >= 2.0  # attention KV at 8K tokens is a larger share of each request


def replayssm_spec(vc):
    """The MambaSpec vLLM's own FlashInfer ReplaySSM allocates (``--use-replayssm``: rings in the page, 0 extra)."""
    import vllm.model_executor.layers.mamba.mamba_utils as mamba_utils
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
    from vllm.v1.kv_cache_interface import MambaSpec

    cc = vc.cache_config
    extra = ({"state_alignment": mamba_utils.mamba_state_alignment(vc)}
             if hasattr(mamba_utils, "mamba_state_alignment") else {})  # vLLM 0.34: 16-byte states
    with _Env("0"):
        return MambaSpec(shapes=NemotronHForCausalLM.get_mamba_state_shape_from_config(vc),
                         dtypes=NemotronHForCausalLM.get_mamba_state_dtype_from_config(vc),
                         block_size=cc.mamba_block_size, page_size_padded=cc.mamba_page_size_padded,
                         mamba_cache_mode=cc.mamba_cache_mode, num_speculative_blocks=0, **extra)


@pytest.mark.parametrize("max_model_len", [1024, 8192])
def test_max_concurrency_equals_vllm_replayssm(vllm_mod, configs, model_dir, max_model_len):
    """Against vLLM's own ReplaySSM (FlashInfer, one page per request too): the same concurrency; the page is
    one conv-window column larger (ssmstate's conv window is k-1+T wide, vLLM's k-1+K; the rings are alike)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    sv = vllm_mod
    with _Env("0"):
        rs = EngineArgs(model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len,
                        enable_prefix_caching=False, enforce_eager=True, use_replayssm=True,
                        mamba_backend="flashinfer",
                        speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
                                            "prompt_lookup_min": 2}).create_engine_config()
        rs.scheduler_config.disable_hybrid_kv_cache_manager = False
        Platform._align_hybrid_block_size(rs, FlashAttentionBackend)
    vc = configs[(True, max_model_len)]
    memory = 64 << 30
    ours, theirs = our_spec(sv, vc), replayssm_spec(rs)
    ours_c, theirs_c = _max_concurrency(vc, ours, memory), _max_concurrency(rs, theirs, memory)
    growth = ours.real_page_size_bytes / theirs.real_page_size_bytes - 1
    print(f"max_model_len={max_model_len}: vLLM max concurrency ssmstate {ours_c:.2f} vs vLLM ReplaySSM "
          f"{theirs_c:.2f}; page {ours.real_page_size_bytes} vs {theirs.real_page_size_bytes} B "
          f"(+{100 * growth:.2f} %)")
    assert ours_c == theirs_c == {1024: 520.0, 8192: 260.0}[max_model_len]
    hf = vc.model_config.hf_config
    conv_column = (hf.mamba_num_heads * hf.mamba_head_dim + 2 * hf.n_groups * hf.ssm_state_size) * 2  # bf16
    assert ours.real_page_size_bytes - theirs.real_page_size_bytes == conv_column
    assert 0 < growth < 0.005
    assert vc.cache_config.block_size == rs.cache_config.block_size


# -- metadata -> StepPlan -> verify -> commit, against the serial oracle -------------------

def _tiny_layout(sv):
    return sv.layout_for(num_heads=4, head_dim=8, state_size=8, n_groups=2, conv_kernel=4, tp_size=1,
                         ssm_dtype=torch.float32, act_dtype=torch.float32, conv_dtype=torch.float32,
                         num_speculative_tokens=K, window=6)


def _common_metadata(rows, block_size):
    """CommonAttentionMetadata for rows of (block_id, num_computed, q, prefilling); decodes first."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qs = [r[2] for r in rows]
    qsl = torch.tensor([0] + list(torch.tensor(qs).cumsum(0).tolist()), dtype=torch.int32)
    seq_lens = torch.tensor([r[1] + r[2] for r in rows], dtype=torch.int32)
    n_tok = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens, num_reqs=len(rows),
        num_actual_tokens=n_tok, max_query_len=max(qs), max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.tensor([[r[0]] for r in rows], dtype=torch.int32),
        slot_mapping=torch.zeros(n_tok, dtype=torch.int64),
        is_prefilling=torch.tensor([r[3] for r in rows], dtype=torch.bool),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
        positions=torch.zeros(n_tok, dtype=torch.int64),
    )


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_builder_metadata_to_plan_and_step_loop_matches_oracle(vllm_mod, configs, backend):
    """``triton`` runs where the Triton interpreter is active (TRITON_INTERPRET=1 before ssmstate's
    kernels are imported, as tests/test_ops_triton.py arranges in a full run): strided vLLM page views."""
    sv = vllm_mod
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    from oracle import SerialOracle
    from ssmstate.ops import reference as ref

    vc = configs[(True, 8192)]
    layout = _tiny_layout(sv)
    spec = sv.spec_from_layout(layout, vc)
    g, T, k = layout.geometry, layout.spec.num_tokens, layout.geometry.conv_kernel
    H, P, N, G, Dc = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank, g.conv_dim_per_rank
    num_layers, num_blocks, max_batch = 2, 12, 8
    names = [f"model.layers.{i}.mixer" for i in range(num_layers)]
    builder = Mamba2AttentionMetadataBuilder(spec, names, vc, torch.device("cpu"))
    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=False, hash_block_size=spec.block_size)
    mgr = MambaManager(spec, pool, enable_caching=False, kv_cache_group_id=0, scheduler_block_size=spec.block_size)
    free0 = pool.get_num_free_blocks()

    # vLLM-style raw pages: a (blocks, 1, 1, bytes) int8 view per layer into a tensor shared with
    # another group's layer (block-outer storage), each page padded past the layout.
    page_bytes = layout.layer_page_bytes + 96
    raws = [torch.zeros((num_blocks, 2, 1, page_bytes), dtype=torch.int8)[:, 1:2] for _ in names]
    views = [sv.page_views(layout, raw) for raw in raws]
    assert all(v.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
               for raw, vs in zip(raws, views) for v in vs.values())
    cursors = torch.zeros((4, num_blocks), dtype=torch.int32)
    if backend == "triton":
        from ssmstate.backends import get_backend
        from ssmstate.errors import BackendUnavailableError

        try:
            get_backend("triton").check(layout, torch.device("cpu"))
        except BackendUnavailableError as exc:
            pytest.skip(f"triton backend unavailable here: {exc}")
    # triton: with pdl on (a no-op in the interpreter; the option's way through attach_group to the backend)
    opts = {"pdl": True} if backend == "triton" else None
    group = sv.attach_group(0, names, layout, views, cursors, torch.device("cpu"), backend, max_batch, opts)
    assert getattr(group.manager.backend, "pdl", False) == (backend == "triton")
    runtime = sv.VllmStateRuntime([group], torch.device("cpu"), max_batch)
    manager = group.manager

    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    A = [-(0.5 + torch.rand(H, generator=gen)) for _ in names]
    D = [torch.randn(H, generator=gen) for _ in names]
    dt_bias = [torch.randn(H, generator=gen) * 0.5 for _ in names]
    conv_w = [torch.randn(Dc, k, generator=gen) * 0.5 for _ in names]
    conv_b = [torch.randn(Dc, generator=gen) * 0.1 for _ in names]
    oracle = SerialOracle(num_layers, H, P, N, G, Dc, k)

    active: dict[str, dict] = {}  # rid -> {block, computed, prompt, decoding}
    next_id = 0
    worst = 0.0
    saw = {"flush": False, "prefill_mix": False, "padding": False, "reuse": False, "short_prefill": False,
           "materialized": False}
    used_blocks: set[int] = set()

    def oracle_tokens(r, q):
        """Random inputs for q tokens of request r through conv + SSM (layer by layer)."""
        per_layer = []
        for li in range(num_layers):
            xBC = torch.randn(q, Dc, generator=gen)
            dt = torch.randn(q, H, generator=gen)
            C = torch.randn(q, G, N, generator=gen)
            per_layer.append((xBC, dt, C))
        return per_layer

    def err(a, b):
        return float((a.double() - b).abs().max())

    for step in range(40 if backend == "reference" else 24):
        # Finish some decoding requests; admit new ones while blocks last.
        for rid in [r for r, st in active.items() if st["decoding"] and rng.random() < 0.12]:
            mgr.free(rid)
            oracle.release(rid)
            del active[rid]
        while len(active) < 6 and pool.get_num_free_blocks() > 0 and rng.random() < 0.6:
            rid = f"r{next_id}"
            next_id += 1
            prompt = rng.randint(3, 9)
            blocks = mgr.allocate_new_blocks(rid, prompt + K, prompt + K)
            assert len(blocks) == 1
            block = blocks[0].block_id
            saw["reuse"] |= block in used_blocks
            used_blocks.add(block)
            runtime.reset_blocks(([block],))  # SSMStateModelState.add_request
            oracle.admit(rid)
            active[rid] = {"block": block, "computed": 0, "prompt": prompt, "decoding": False}

        decodes = [r for r, st in active.items() if st["decoding"]]
        qs = {r: 1 + rng.randint(0, K) for r in decodes}
        shorts, longs = [], []  # prompt chunks vLLM runs on the decode path / on its prefill path
        for r, st in active.items():
            if st["decoding"]:
                continue
            left = st["prompt"] - st["computed"]
            if st["computed"] and rng.random() < 0.4:
                qs[r] = 1  # a one-token chunk with prior state: vLLM runs it as a decode row
                shorts.append(r)
            else:
                qs[r] = left if rng.random() < 0.6 else rng.randint(1, left)
                (shorts if st["computed"] and qs[r] == 1 else longs).append(r)
        order = decodes + shorts + longs
        rows = [(active[r]["block"], active[r]["computed"], qs[r], not active[r]["decoding"]) for r in order]
        pad = 0
        if not longs and order and rng.random() < 0.5:
            pad = rng.randint(1, max_batch - len(order))  # CUDA-graph padding rows on NULL_BLOCK_ID
            rows += [(0, 0, 0, False)] * pad
        if not rows:
            continue
        common = _common_metadata(rows, spec.block_size)
        draft = torch.tensor([qs[r] - 1 for r in decodes] + [-1] * (len(shorts) + len(longs)) + [0] * pad,
                             dtype=torch.int32)
        md = builder.build(0, common, num_accepted_tokens=torch.ones(len(rows), dtype=torch.int32),
                           num_decode_draft_tokens_cpu=draft)
        dec = decodes + shorts  # rows on our path
        assert md.num_prefills == len(longs)
        assert md.num_decodes == len(dec) + pad
        saw["prefill_mix"] |= bool(dec and longs)
        saw["padding"] |= pad > 0
        saw["short_prefill"] |= bool(shorts)

        saw["materialized"] |= any(active[r]["computed"] and int(cursors[1][active[r]["block"]]) for r in longs)
        runtime.begin_step({name: md for name in names}, common.query_start_loc_cpu)  # prepare_attn
        plan = group.plan
        cu = common.query_start_loc_cpu.tolist()
        if dec:
            assert plan is not None
            assert plan.page_ids[: len(dec)].tolist() == [active[r]["block"] for r in dec]
            assert not bool(plan.page_ids[len(dec):].any())
            assert plan.total_tokens == sum(qs[r] for r in dec)
            assert plan.cu_seqlens[: len(dec) + 1].tolist() == cu[: len(dec) + 1]
            saw["flush"] |= any(int(cursors[1][active[r]["block"]]) + qs[r] > layout.spec.window for r in dec)
            nd = plan.total_tokens
            for li in range(num_layers):
                xBC = torch.randn(nd, Dc, generator=gen)
                dt = torch.randn(nd, H, generator=gen)
                C = torch.randn(nd, G, N, generator=gen)
                conv_out = manager.conv(li, plan, xBC, conv_w[li], conv_b[li])
                x = conv_out[:, : H * P].reshape(nd, H, P)
                B = conv_out[:, H * P: H * P + G * N].reshape(nd, G, N)
                y = manager.verify(li, plan, x, dt, B, C, A[li], D=D[li], dt_bias=dt_bias[li])
                for i, r in enumerate(dec):
                    lo, hi = cu[i], cu[i + 1]
                    worst = max(worst, err(conv_out[lo:hi], oracle.conv_step(r, li, xBC[lo:hi], conv_w[li],
                                                                             conv_b[li])))
                    want = oracle.verify(r, li, x[lo:hi], dt[lo:hi], B[lo:hi], C[lo:hi], A[li], D=D[li],
                                         dt_bias=dt_bias[li])
                    worst = max(worst, err(y[lo:hi], want))
        else:
            assert plan is None or not bool(plan.page_ids.any())

        # vLLM's prefill path on prefill rows: it reads the (materialized) checkpoint and conv window
        # as the state, and writes the state after the chunk back into them.
        for r in longs:
            b = active[r]["block"]
            if active[r]["computed"]:
                assert int(cursors[1][b]) == 0, "a continuing prefill row was not materialized"
                for li in range(num_layers):
                    worst = max(worst, err(views[li]["checkpoint"][b], oracle.ssm[r][li]))
                    worst = max(worst, err(views[li]["conv"][b, :, -(k - 1):], oracle.conv[r][li]))
            for li, (xBC, dt, C) in enumerate(oracle_tokens(r, qs[r])):
                conv_o = oracle.conv_step(r, li, xBC, conv_w[li], conv_b[li]).float()
                x = conv_o[:, : H * P].reshape(-1, H, P)
                B = conv_o[:, H * P: H * P + G * N].reshape(-1, G, N)
                oracle.verify(r, li, x, dt, B, C, A[li], D=D[li], dt_bias=dt_bias[li])
            oracle.commit(r, qs[r])
            for li in range(num_layers):
                views[li]["checkpoint"][b] = oracle.ssm[r][li].float()
                sv.prefill_conv_view(views[li]["conv"], k, True)[b] = oracle.conv[r][li].float()

        # Rejection sampling: decode rows accept 1..q (bonus included); prompt rows sample 1 on the last chunk.
        accepted = {r: rng.randint(1, qs[r]) for r in decodes}
        final = {r: active[r]["computed"] + qs[r] == active[r]["prompt"] for r in shorts + longs}
        num_sampled = torch.tensor([accepted[r] for r in decodes] + [int(final[r]) for r in shorts + longs]
                                   + [0] * pad, dtype=torch.int32)
        runtime.commit(num_sampled)  # SSMStateModelState.postprocess_state, right after rejection sampling
        manager.raise_device_errors()
        for r in decodes:
            oracle.commit(r, accepted[r])
            active[r]["computed"] += accepted[r]
        for r in shorts:
            oracle.commit(r, 1)  # the prompt token is consumed whether or not it sampled
        for r in shorts + longs:
            active[r]["computed"] += qs[r]
            active[r]["decoding"] = active[r]["computed"] == active[r]["prompt"]

        # States: checkpoint + committed ring rows == the oracle's state, for every request with state.
        for r, st in active.items():
            if st["computed"] == 0:
                continue
            b = st["block"]
            for li in range(num_layers):
                got = ref.replay_read_state(views[li]["checkpoint"], views[li]["x_ring"], views[li]["B_ring"],
                                            views[li]["dt_ring"], cursors[0], cursors[1], A[li], b)
                worst = max(worst, err(got, oracle.ssm[r][li]))
        assert not bool(cursors[:, 0].any()), "the null block's cursors were written"
        assert not bool(raws[0][0].any()), "the null block's page was written"

    print(f"worst abs error vs the serial oracle: {worst:.2e}; seen: {saw}")
    assert worst < 1e-3, worst
    assert all(saw.values()), saw
    for rid in list(active):
        mgr.free(rid)
    assert pool.get_num_free_blocks() == free0


def test_external_plan_refusals(vllm_mod):
    sv = vllm_mod
    from ssmstate.errors import LifecycleError, ShapeError, SSMStateError

    layout = _tiny_layout(sv)
    views = [sv.page_views(layout, torch.zeros((4, layout.layer_page_bytes), dtype=torch.int8))]
    cursors = torch.zeros((4, 4), dtype=torch.int32)
    group = sv.attach_group(0, ["l0"], layout, views, cursors, torch.device("cpu"), "reference", 4)
    m = group.manager
    with pytest.raises(SSMStateError):
        sv.page_views(layout, torch.zeros((4, layout.layer_page_bytes - 1), dtype=torch.int8))
    with pytest.raises(ShapeError):
        m.begin_step_from_tensors(torch.tensor([1, 2]), torch.tensor([0, 1, 2], dtype=torch.int32), 2, 1)
    with pytest.raises(SSMStateError):
        m.begin_step_from_tensors(torch.tensor([1], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32),
                                  9, 9)
    before = cursors.clone()
    plan = m.begin_step_from_tensors(torch.tensor([1, 0], dtype=torch.int32),
                                     torch.tensor([0, 2, 2], dtype=torch.int32), 2, 4)
    assert cursors[2].tolist() == [0, 2, 0, 0]
    with pytest.raises(LifecycleError):
        m.begin_step_from_tensors(torch.tensor([2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
                                  1, 4)
    with pytest.raises(ShapeError):
        m.commit(plan, [1, 1])
    m.rollback(plan)
    assert torch.equal(cursors, before)


# -- vLLM's own MambaMixer2 constructor builds our layer; its decode path vs the oracle -------------

TINY = TINY_NEMOTRON_H


def _new_request(req_id: str, blocks: list[int]):
    from vllm.v1.core.sched.output import NewRequestData

    extra = {"prefill_token_ids": [1] * 8} if "prefill_token_ids" in NewRequestData.__dataclass_fields__ else {}
    return NewRequestData(req_id=req_id, prompt_token_ids=[1] * 8, mm_features=[], sampling_params=None,
                          pooling_params=None, block_ids=(blocks,), num_computed_tokens=0, lora_request=None,
                          **extra)  # prefill_token_ids: vLLM 0.34 and later


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_mixer_layers_decode_through_ssmstate(vllm_mod, tmp_path):
    """vLLM's ``MambaMixer2(...)`` yields SSMStateMambaMixer2; its ``conv_ssm_forward`` on decode batches
    (vLLM-built metadata, padding rows, bound vLLM-style pages, runtime attached from a KVCacheConfig)
    matches the serial oracle step after step."""
    sv = vllm_mod
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    from oracle import SerialOracle

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    vc = EngineArgs(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=512, enable_prefix_caching=False,
                    dtype="float32", enforce_eager=True,
                    speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
                                        "prompt_lookup_min": 2}).create_engine_config()
    H, P, N, G, k = 4, 8, 8, 2, 4
    di, Dc = H * P, H * P + 2 * G * N
    names = ["model.layers.0.mixer", "model.layers.2.mixer"]
    num_blocks, max_batch = 10, 8
    gen = torch.Generator().manual_seed(1)
    rng = random.Random(1)
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)
        try:
            layers = [MambaMixer2(hidden_size=64, ssm_state_size=N, conv_kernel_size=k, intermediate_size=di,
                                  use_conv_bias=True, use_bias=False, n_groups=G, num_heads=H, head_dim=P,
                                  model_config=vc.model_config, cache_config=vc.cache_config, prefix=name)
                      for name in names]
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()
    assert all(type(lyr) is sv.SSMStateMambaMixer2 and lyr.ssmstate_enabled for lyr in layers)
    with torch.no_grad():
        for lyr in layers:
            lyr.A.copy_(-(0.5 + torch.rand(H, generator=gen)))
            lyr.D.copy_(torch.randn(H, generator=gen))
            lyr.dt_bias.copy_(torch.randn(H, generator=gen) * 0.5)
            lyr.conv_weights.copy_(torch.randn(Dc, k, generator=gen) * 0.5)
            lyr.conv1d.bias.copy_(torch.randn(Dc, generator=gen) * 0.1)
    spec = layers[0].get_kv_cache_spec(vc)
    assert isinstance(spec, sv.SSMStateMambaSpec) and spec.num_speculative_blocks == 0
    for lyr in layers:
        lyr.bind_kv_cache(torch.zeros((num_blocks, 1, 1, spec.page_size_bytes), dtype=torch.int8))
    kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    # The MRV2 model state the model's get_model_state_cls() hook returns. Its postprocess_state runs
    # runtime.commit and then vLLM's own Triton bookkeeping kernel, which has no CPU build: the test
    # calls the runtime's commit, the first half of postprocess_state.
    model = object.__new__(sv.SSMStateNemotronHForCausalLM)
    model.__dict__["vllm_config"] = vc
    state_cls = model.get_model_state_cls()
    assert state_cls is sv.SSMStateModelState
    with _Env("1"):
        os.environ["SSMSTATE_VLLM_BACKEND"] = "reference"
        try:
            state = state_cls(vc, torch.nn.Linear(1, 1), None, torch.device("cpu"))
            first = "q_early"  # admitted before the KV cache exists: its reset waits for initialize_kv_cache
            state.add_request(0, _new_request(first, [1]))
            state.initialize_kv_cache(kcc, None)
        finally:
            os.environ.pop("SSMSTATE_VLLM_BACKEND")
    runtime = state.ssmstate
    assert [type(lyr.ssmstate_slot[0].manager.backend).__name__ for lyr in layers] == ["ReferenceBackend"] * 2
    builder = Mamba2AttentionMetadataBuilder(spec, names, vc, torch.device("cpu"))
    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=False, hash_block_size=spec.block_size)
    mgr = MambaManager(spec, pool, enable_caching=False, kv_cache_group_id=0, scheduler_block_size=spec.block_size)
    oracle = SerialOracle(len(layers), H, P, N, G, Dc, k)

    active: dict[str, dict] = {}
    worst, flushes, pads, reused = 0.0, 0, 0, 0
    seen_blocks: set[int] = set()
    for step in range(24):
        for rid in [r for r in active if rng.random() < 0.1]:
            mgr.free(rid)
            oracle.release(rid)
            del active[rid]
        while len(active) < 5 and pool.get_num_free_blocks() > 0:
            rid = f"q{step}_{len(active)}"
            block = mgr.allocate_new_blocks(rid, 8 + K, 8 + K)[0].block_id
            reused += block in seen_blocks
            seen_blocks.add(block)
            state.add_request(len(seen_blocks) % state.max_num_reqs, _new_request(rid, [block]))
            oracle.admit(rid)
            for li, lyr in enumerate(layers):  # what vLLM's prefill kernels leave in the page
                S0, hist = torch.randn(H, P, N, generator=gen) * 0.3, torch.randn(Dc, k - 1, generator=gen)
                lyr.ssmstate_views["checkpoint"][block] = S0
                sv.prefill_conv_view(lyr.ssmstate_views["conv"], k, True)[block] = hist  # where vLLM's kernels write
                oracle.write_state(rid, li, S0, hist)
            active[rid] = {"block": block, "computed": 8}
        order = list(active)
        qs = [1 + rng.randint(0, K) for _ in order]
        pad = rng.randint(0, max_batch - len(order))
        pads += pad
        rows = [(active[r]["block"], active[r]["computed"], q, False) for r, q in zip(order, qs)]
        rows += [(0, 0, 0, False)] * pad
        common = _common_metadata(rows, spec.block_size)
        md = builder.build(0, common, num_accepted_tokens=torch.ones(len(rows), dtype=torch.int32),
                           num_decode_draft_tokens_cpu=torch.tensor([q - 1 for q in qs] + [0] * pad,
                                                                    dtype=torch.int32))
        metadata = {name: md for name in names}
        runtime.begin_step(metadata, common.query_start_loc_cpu)
        flushes += sum(int(runtime.groups[0].manager.cache.num_committed[active[r]["block"]]) + q > 16
                       for r, q in zip(order, qs))
        nt = sum(qs)
        cu = common.query_start_loc_cpu.tolist()
        with set_forward_context(metadata, vc), torch.no_grad():
            for li, lyr in enumerate(layers):
                projected = torch.randn(nt, 2 * di + 2 * G * N + H, generator=gen)
                out = torch.zeros(nt, di)
                lyr.conv_ssm_forward(projected, out)
                xBC, dt = projected[:, di: di + Dc], projected[:, di + Dc:]
                for i, r in enumerate(order):
                    lo, hi = cu[i], cu[i + 1]
                    conv = oracle.conv_step(r, li, xBC[lo:hi], lyr.conv_weights, lyr.conv1d.bias).float()
                    want = oracle.verify(r, li, conv[:, :di].reshape(-1, H, P), dt[lo:hi],
                                         conv[:, di: di + G * N].reshape(-1, G, N),
                                         conv[:, di + G * N:].reshape(-1, G, N), lyr.A, D=lyr.D,
                                         dt_bias=lyr.dt_bias)
                    worst = max(worst, float((out[lo:hi].double() - want.reshape(hi - lo, di)).abs().max()))
        accepted = [rng.randint(1, q) for q in qs]
        runtime.commit(torch.tensor(accepted + [0] * pad, dtype=torch.int32))  # postprocess_state
        for r, a in zip(order, accepted):
            oracle.commit(r, a)
            active[r]["computed"] += a
    print(f"real MambaMixer2 layers: worst abs error {worst:.2e}, {flushes} flush rows, {pads} padding rows, "
          f"{reused} recycled blocks")
    assert worst < 1e-3, worst
    assert flushes > 0 and pads > 0 and reused > 0
    for rid in list(active):
        mgr.free(rid)


# -- vLLM's real prefill kernels and ssmstate on the same pages ----------------------------------------

@pytest.mark.parametrize("backend,layout,K,state", [
    ("reference", "DS", 3, None), ("triton", "SD", 0, None),
    ("reference", "DS", 3, "int8"), ("reference", "SD", 3, "fp8+sr")])
def test_real_prefill_kernels_hand_over_to_ssmstate(backend, layout, K, state):
    """vLLM's ``causal_conv1d_fn`` and chunked scan (interpreted) write prefills into our pages, ssmstate's
    conv + verify continue them, and back: every output row matches the serial oracle, through fresh
    prefills on garbage pages, continuing chunks, one-token decode-row tails, recomputed requests,
    recycled blocks, both conv layouts, K = 0, and dry double forwards on the null block that leave
    every page and cursor as they were. An 8-bit state (``state``; W = 4, so verify rows flush often) prefills
    through fp32 staging copies: outputs still match the oracle exactly, and every stored state is within one
    rounding step of the oracle's, which then continues from it. A fresh process: vLLM decides at import
    whether Triton is usable."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSMSTATE_VLLM")}
    extra = []
    if state is not None:
        extra = ["--state-dtype", state.removesuffix("+sr"), "--window", "4"] + (["--sr"] if "+sr" in state else [])
    proc = subprocess.run([sys.executable, str(root / "tests" / "vllm_engine" / "prefill_handover.py"),
                           "--backend", backend, "--layout", layout, "--K", str(K), *extra],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads(lines[-1])
    print(got)
    assert got["worst_abs_err"] < 1e-3
    for key in ("fresh_prefill", "continuing_prefill", "prefill_after_one_token_decode_row", "mixed_steps",
                "recycled_blocks", "dry_double_forwards"):
        assert got[key] > 0, (key, got)
    if K:  # at K = 0 every row is one token and accepted: no verify window, no rejected tail
        assert got["verify_rows"] > 0 and got["prefill_after_rejected_tail"] > 0, got
    if state is not None:  # quantized writes happened (staged prefills, flushes) and were checked
        assert got["state_dtype"] == {"int8": "int8", "fp8": "float8_e4m3fn"}[state.removesuffix("+sr")], got
        assert got["stochastic_rounding"] == ("+sr" in state), got
        assert got["flush_rows"] > 0 and got["states_synced"] > 0 and got["max_state_rounding"] > 0, got
