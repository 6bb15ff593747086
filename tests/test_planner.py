"""Capacity planner: its bytes are the allocator's bytes, its counts are what a real pool admits,
and its vLLM-compatible figures follow vLLM 0.33.0's arithmetic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssmstate import CapacityError, ConfigError, PageLayout, StateCache, StateManager
from ssmstate.geometry import PRESETS, AttentionGeometry, ModelConfig, load_model, preset_names
from ssmstate.gpus import GPUS, lookup_gpu, parse_size
from ssmstate.planner import (
    plan_capacity,
    sweep_k,
    vllm_attention_block_size,
    vllm_group_sizes,
)

GiB = 1 << 30
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def _tiny_model(num_layers: int = 2, attention: bool = True) -> ModelConfig:
    """A small hybrid whose pages are a few KiB, so real CPU pools hold dozens of requests."""
    cfg = load_model("nemotron-h-8b")
    attn = AttentionGeometry(num_layers=1, num_kv_heads=1, head_dim=16) if attention else None
    return attrs.evolve(cfg, name="tiny", num_heads=8, head_dim=16, state_size=16, n_groups=2,
                        num_mamba_layers=num_layers, attention=attn, max_model_len=64)


def _admit_all(layout: PageLayout, num_pages: int) -> tuple[int, StateManager]:
    mgr = StateManager(layout, num_pages, device="cpu")
    n = 0
    while True:
        try:
            mgr.admit(n)
        except CapacityError:
            return n, mgr
        n += 1


# -- bytes: planner == allocator ---------------------------------------------------------

@pytest.mark.parametrize("preset", preset_names())
def test_planner_bytes_equal_allocated_tensor_bytes(preset: str) -> None:
    """Every preset, TP 1/2/4/8, K 0..7, both schemes: the plan's bytes are StateCache's bytes."""
    cfg = load_model(preset)
    checked = 0
    for tp in (1, 2, 4, 8):
        for k in range(8):
            try:
                plan = plan_capacity(preset, tp_size=tp, num_speculative_tokens=k, count_attention=False,
                                     gpu_memory="1TiB")
            except ConfigError as exc:
                # Only a TP that does not divide the model may be refused.
                assert cfg.num_heads % tp or cfg.n_groups % tp, exc
                assert "tp_size" in str(exc)
                continue
            for scheme in ("native", "replay"):
                cap = plan.scheme(scheme)
                layout = PageLayout(scheme, plan.geometry, plan.spec)  # type: ignore[arg-type]
                cache = StateCache(layout, 2, device="meta")
                assert cache.nbytes == 2 * cap.allocated_bytes_per_page
                one_page = sum(t[0].numel() * t.element_size() for layer in cache.layers for t in layer.values())
                assert one_page == cap.page_bytes
                assert sum(t[0].numel() * t.element_size() for t in cache.layers[0].values()) == cap.layer_page_bytes
                assert cap.mamba_bytes_per_request == cap.pages_per_request * one_page
                assert cap.pages_per_request == (1 + k if scheme == "native" else 1)
                # The geometry is per rank: TP splits heads, groups and conv channels.
                assert cache.layers[0][layout.tensors[0].name].shape[1] == cfg.num_heads // tp
            checked += 1
    assert checked == 32  # every Nemotron preset divides by 1, 2, 4 and 8


def test_tp_that_does_not_divide_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tp_size=3"):
        plan_capacity("nemotron-h-8b", tp_size=3)


def test_attention_bytes_come_from_attention_geometry() -> None:
    cfg = load_model("nemotron-h-8b")
    for tp in (1, 2, 8):
        plan = plan_capacity(cfg, tp_size=tp, max_model_len=1000)
        assert plan.attention_bytes_per_token == cfg.attention.kv_bytes_per_token(tp)
        assert plan.native.attention_bytes_per_request == 1000 * cfg.attention.kv_bytes_per_token(tp)
        assert plan.replay.total_bytes_per_request == (plan.replay.mamba_allocated_bytes_per_request
                                                       + plan.replay.attention_bytes_per_request)
    # 4 layers x K and V x 8 KV heads x 128 x bf16; past 8 ranks KV heads are replicated.
    assert plan_capacity(cfg, tp_size=1).attention_bytes_per_token == 4 * 2 * 8 * 128 * 2
    assert plan_capacity("nemotron-3-super-120b", tp_size=8).attention_bytes_per_token == 8 * 2 * 1 * 128 * 2


# -- counts: planner == a real pool ------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 3, 7])
@pytest.mark.parametrize("budget", [250_000, 1 * MiB, 3 * MiB + 12345])
def test_measured_concurrency_equals_plan_mamba_only(k: int, budget: int) -> None:
    model = _tiny_model()
    plan = plan_capacity(model, kv_cache_memory=budget, num_speculative_tokens=k,
                         count_attention=False)
    for scheme in ("native", "replay"):
        cap = plan.scheme(scheme)
        layout = PageLayout(scheme, plan.geometry, plan.spec)  # type: ignore[arg-type]
        assert cap.num_pages == layout.max_pages(budget)
        n, mgr = _admit_all(layout, cap.num_pages)
        assert n == cap.max_concurrency > 0
        assert mgr.cache.nbytes <= budget < mgr.cache.nbytes + cap.allocated_bytes_per_page


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(min_value=300_000, max_value=3_000_000), k=st.integers(0, 6),
       layers=st.integers(1, 3), state=st.sampled_from(["float32", "bfloat16"]))
def test_measured_concurrency_with_attention_equals_plan(budget: int, k: int, layers: int, state: str) -> None:
    """With attention KV charged, n pools of pages plus n KV reservations fit and n + 1 do not."""
    model = _tiny_model(layers)
    plan = plan_capacity(model, kv_cache_memory=budget, num_speculative_tokens=k,
                         state_dtype=state, max_model_len=64)
    assert plan.attention_bytes_per_token == 2 * 16 * 2  # one layer, one KV head of 16, bf16
    for scheme in ("native", "replay"):
        cap = plan.scheme(scheme)
        layout = PageLayout(scheme, plan.geometry, plan.spec)  # type: ignore[arg-type]
        n, mgr = _admit_all(layout, cap.num_pages)
        assert n == cap.max_concurrency > 0
        used = mgr.cache.nbytes + n * cap.attention_bytes_per_request
        assert used <= budget
        one_more = layout.pool_bytes(1 + (n + 1) * layout.pages_per_request) + (n + 1) * cap.attention_bytes_per_request
        assert one_more > budget


def test_max_concurrency_benchmark_runs_and_matches_on_cpu(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("max_concurrency", ROOT / "benchmarks" / "max_concurrency.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    out = tmp_path / "mc.json"
    rc = mod.main(["--num-layers", "2", "--num-heads", "8", "--head-dim", "16", "--state-size", "16",
                   "--n-groups", "2", "--budget", "400KiB", "--num-speculative-tokens", "3", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["all_equal_and_working"]
    for scheme in ("native", "replay"):
        m = report["measured"][scheme]
        assert m["admitted"] == m["planned"] == report["plan"][scheme]["max_concurrency"] > 0
        assert m["step_rows"] == m["admitted"] and m["outputs_finite"] and m["cursors_ok"]


@pytest.mark.parametrize("state", ["int8", "fp8"])
def test_8bit_pool_admits_the_planned_count(state: str) -> None:
    """The 8-bit page (codes + fp32 scales) the planner charges is what the cache allocates, to the byte."""
    model = _tiny_model()
    budget = 1 * MiB
    plan = plan_capacity(model, kv_cache_memory=budget, num_speculative_tokens=3, count_attention=False,
                         state_dtype=state)
    layout = PageLayout.replay(plan.geometry, plan.spec)
    assert "checkpoint_scale" in [t.name for t in layout.tensors]
    n, mgr = _admit_all(layout, plan.replay.num_pages)
    assert n == plan.replay.max_concurrency > 0
    assert mgr.cache.nbytes <= budget < mgr.cache.nbytes + plan.replay.allocated_bytes_per_page
    # vLLM's built-in schemes hold no 8-bit state: they are planned at fp32, exactly as an fp32 plan has them
    fp32 = plan_capacity(model, kv_cache_memory=budget, num_speculative_tokens=3, count_attention=False)
    assert plan.builtin_geometry.state_dtype == torch.float32
    assert plan.native == fp32.native and plan.vllm_replayssm == fp32.vllm_replayssm
    assert plan.replay.max_concurrency > fp32.replay.max_concurrency


@pytest.mark.parametrize("state", ["int8", "fp8"])
def test_nemotron_h_8b_8bit_page_is_under_04x_of_vllm_replayssm_fp32(state: str) -> None:
    plan = plan_capacity("nemotron-h-8b", gpu="H200", state_dtype=state)
    vr = plan.vllm_replayssm
    assert vr is not None and vr == plan_capacity("nemotron-h-8b", gpu="H200").vllm_replayssm
    print(f"nemotron-h-8b K=3 W=16 on H200, {state}: {plan.replay.mamba_bytes_per_request} B/request vs vLLM "
          f"ReplaySSM fp32 {vr.mamba_bytes_per_request} B: {plan.replayssm_bytes_ratio:.3f}x")
    assert plan.replayssm_bytes_ratio <= 0.4
    assert plan.replay.max_concurrency > vr.max_concurrency
    assert plan.to_dict()["builtin_state_dtype"] == "float32"
    bf16 = plan_capacity("nemotron-h-8b", gpu="H200", state_dtype=state, builtin_state_dtype="bf16")
    assert bf16.native.mamba_bytes_per_request < plan.native.mamba_bytes_per_request
    with pytest.raises(ConfigError, match="8-bit"):
        plan_capacity("nemotron-h-8b", gpu="H200", state_dtype=state, builtin_state_dtype="int8")


def test_capacity_doc_8bit_table_is_current() -> None:
    """The 8-bit table of docs/capacity.md is what the planner gives."""
    import re

    from ssmstate.gpus import format_size

    text = (ROOT / "docs" / "capacity.md").read_text()
    rows = re.findall(r"^\| (nemotron-[\w-]+) \| (\w+) \| (.*) \|$", text, flags=re.M)
    assert len(rows) == 8
    for model, dtype, rest in rows:
        p = plan_capacity(model, gpu="H200", state_dtype=dtype, builtin_state_dtype="fp32")
        q = plan_capacity(model, gpu="H200", state_dtype=dtype, builtin_state_dtype="fp32", count_attention=False)
        assert p.vllm_replayssm is not None and q.vllm_replayssm is not None
        want = (f"{format_size(p.replay.layer_page_bytes)} | {p.replay.mamba_bytes_per_request:,} | "
                f"{p.replayssm_bytes_ratio:.2f}x | {p.replay.max_concurrency} / {p.vllm_replayssm.max_concurrency} / "
                f"{p.native.max_concurrency} | {q.replay.max_concurrency} / {q.vllm_replayssm.max_concurrency} / "
                f"{q.native.max_concurrency}")
        assert rest == want, (model, dtype)


def test_max_concurrency_benchmark_admits_the_planned_8bit_pool(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("max_concurrency", ROOT / "benchmarks" / "max_concurrency.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    out = tmp_path / "mc.json"
    rc = mod.main(["--num-layers", "2", "--num-heads", "8", "--head-dim", "16", "--state-size", "16",
                   "--n-groups", "2", "--budget", "400KiB", "--state-dtype", "int8", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["all_equal_and_working"]
    replay, native = report["measured"]["replay"], report["measured"]["native"]
    assert replay["state_dtype"] == "int8" and native["state_dtype"] == "float32"
    assert replay["admitted"] == replay["planned"] == report["plan"]["replay"]["max_concurrency"] > 0
    assert replay["outputs_finite"] and replay["cursors_ok"] and replay["pool_is_maximal"]


# -- the headline ratio ---------------------------------------------------------------------

def test_replay_over_native_ratio_nemotron_h_8b_k3() -> None:
    plan = plan_capacity("nemotron-h-8b", num_speculative_tokens=3, state_dtype="float32", count_attention=False)
    print(f"nemotron-h-8b K=3 fp32, Mamba state only on H200 x 0.9: native {plan.native.max_concurrency}, "
          f"replay {plan.replay.max_concurrency}, replay/native {plan.concurrency_ratio:.3f}x, "
          f"bytes native/replay {plan.mamba_bytes_ratio:.3f}x")
    assert plan.concurrency_ratio >= 3.5
    assert plan.mamba_bytes_ratio >= 3.5
    # Charging attention KV (8192 tokens) lowers the gain but it stays above 2x.
    assert plan_capacity("nemotron-h-8b").concurrency_ratio > 2.0


def test_sweep_k() -> None:
    plans = sweep_k("nemotron-h-8b", range(0, 9), count_attention=False)
    assert [p.num_speculative_tokens for p in plans] == list(range(9))
    native = [p.native.max_concurrency for p in plans]
    replay = [p.replay.max_concurrency for p in plans]
    assert all(a > b for a, b in zip(native, native[1:]))
    assert all(a >= b for a, b in zip(replay, replay[1:]))
    assert replay[-1] > 0.9 * replay[0]  # one page whatever K: only the ring grows
    assert plans[0].native.pages_per_request == 1 and plans[8].native.pages_per_request == 9
    assert sweep_k("nemotron-h-8b", [20], count_attention=False)[0].spec.window == 21
    with pytest.raises(ConfigError):
        sweep_k("nemotron-h-8b", [])


# -- vLLM-compatible arithmetic -----------------------------------------------------------

def test_vllm_compatible_nemotron_h_8b_k3_by_hand() -> None:
    """Derived by hand from vLLM 0.33.0 (see docs/capacity.md):

    native Mamba page/layer = 128*64*128*4 (fp32 state) + 10240*(3+3)*2 (bf16 conv) = 4,317,184
    replay page/layer = 4,194,304 + x 128*20*64*2 + B 8*20*128*2 + dt 128*20*4 + conv 10240*7*2 = 4,716,544
    attention page per token per layer = 2*8*128*2 = 4096
    block size = 16 * cdiv(page, 16*4096): native 16*66 = 1056, replay 16*72 = 1152
    groups: 4 attention and 24 Mamba layers -> group size 4, 1 + 6 groups
    blocks/request: native cdiv(8192,1056) + 6*(1+3) = 32; replay cdiv(8192,1152) + 6*1 = 14
    bytes/block = 4 * block_size * 4096; num_blocks = 100 GiB // bytes/block
    """
    plan = plan_capacity("nemotron-h-8b", kv_cache_memory="100GiB", num_speculative_tokens=3,
                         vllm_compatible=True)
    vn, vr = plan.vllm_native, plan.vllm_replay
    assert vn is not None and vr is not None
    assert (vn.mamba_page_bytes, vr.mamba_page_bytes) == (4_317_184, 4_716_544)
    assert vn.attention_page_bytes_per_token == vr.attention_page_bytes_per_token == 4096
    assert (vn.block_size, vr.block_size) == (1056, 1152)
    assert (vn.page_bytes, vr.page_bytes) == (1056 * 4096, 1152 * 4096)
    assert (vn.group_size, vn.num_attention_groups, vn.num_mamba_groups) == (4, 1, 6)
    assert (vn.num_speculative_blocks, vr.num_speculative_blocks) == (3, 0)
    assert (vn.mamba_blocks_per_request, vr.mamba_blocks_per_request) == (4, 1)
    assert (vn.attention_blocks_per_request, vr.attention_blocks_per_request) == (8, 8)
    assert (vn.blocks_per_request, vr.blocks_per_request) == (32, 14)
    assert (vn.bytes_per_block, vr.bytes_per_block) == (4 * 1056 * 4096, 4 * 1152 * 4096)
    assert (vn.num_blocks, vr.num_blocks) == (6206, 5688)
    assert vn.max_concurrency == 6206 / 32 == 193.9375
    assert vr.max_concurrency == 5688 / 14
    assert vn.kv_cache_size_tokens == int(6206 / 32 * 8192)
    assert plan.vllm_ratio == pytest.approx((5688 / 14) / (6206 / 32))
    assert vn.padding_fraction == pytest.approx((1056 * 4096 - 4_317_184) / (1056 * 4096))


def test_vllm_compatible_attention_free_and_block_size() -> None:
    """No attention: one group of every Mamba layer, no padding; ``--block-size`` raises the alignment."""
    plan = plan_capacity("nemotron-h-8b", kv_cache_memory="100GiB", count_attention=False,
                         vllm_compatible=True)
    vn, vr = plan.vllm_native, plan.vllm_replay
    assert vn.block_size is None and vn.page_bytes == 4_317_184 and vn.padding_fraction == 0
    assert vn.bytes_per_block == 24 * 4_317_184 and vn.blocks_per_request == 4
    assert vn.max_concurrency == (100 * GiB // (24 * 4_317_184)) / 4 == 259.0
    assert vr.max_concurrency == 100 * GiB // (24 * 4_716_544) == 948
    assert vllm_attention_block_size(4_317_184, 4096, block_size=2048) == 2048
    assert vllm_attention_block_size(4_317_184, 4096, block_size=32) == 32 * 33
    assert vllm_attention_block_size(1000, 4096) == 16


def test_vllm_group_sizes_mirror_uniform_page_size_grouping() -> None:
    assert vllm_group_sizes(4, 24) == (4, 1, 6)     # Nemotron-H-8B
    assert vllm_group_sizes(4, 27) == (4, 1, 7)     # Nano-9B-v2: 7 groups, the last one padded
    assert vllm_group_sizes(6, 23) == (6, 1, 4)     # Nemotron-3-Nano
    assert vllm_group_sizes(8, 40) == (8, 1, 5)     # Nemotron-3-Super
    assert vllm_group_sizes(12, 13) == (13, 1, 1)   # under 1.5x: the larger count is the group size
    assert vllm_group_sizes(10, 15) == (10, 1, 2)   # exactly 1.5x: the smaller one
    assert vllm_group_sizes(0, 24) == (24, 0, 1)


def test_vllm_widest_group_sets_bytes_per_block() -> None:
    # Nano-9B-v2: 27 Mamba layers in 7 groups of at most 4 layers -> a block holds 4 pages.
    plan = plan_capacity("nemotron-nano-9b-v2", vllm_compatible=True)
    assert plan.vllm_native.bytes_per_block == 4 * plan.vllm_native.page_bytes
    assert plan.vllm_native.num_blocks == plan.budget_bytes // plan.vllm_native.bytes_per_block


# -- inputs ---------------------------------------------------------------------------------

def test_parse_size_and_gpus() -> None:
    assert parse_size("80GiB") == 80 * GiB
    assert parse_size("141GB") == 141 * 10**9
    assert parse_size(" 512 MiB ") == 512 * MiB
    assert parse_size("1.5GiB") == 3 * GiB // 2
    assert parse_size("4096") == 4096 and parse_size(4096) == 4096
    for bad in ("", "GiB", "80 XB", "-1GiB", "0", "1e9", "eighty"):
        with pytest.raises(ConfigError):
            parse_size(bad)
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ConfigError):
            parse_size(bad)  # type: ignore[arg-type]
    assert lookup_gpu("h200").total_bytes == 143771 * MiB
    assert lookup_gpu("H100").name == "H100-80GB"
    assert {"H100-80GB", "H200", "B200", "GB200"} <= set(GPUS)
    assert all(g.source and g.basis in ("nvidia-smi", "datasheet") for g in GPUS.values())
    with pytest.raises(ConfigError, match="unknown GPU"):
        lookup_gpu("Z9000")


def test_plan_inputs() -> None:
    assert plan_capacity("nemotron-h-8b").gpu == "H200"
    assert plan_capacity("nemotron-h-8b", gpu="B200").gpu_memory == 183359 * MiB
    p = plan_capacity("nemotron-h-8b", gpu_memory="80GiB", gpu_utilization=0.5)
    assert p.gpu is None and p.requested_bytes == 40 * GiB
    assert p.budget_bytes == 40 * GiB - p.weights.total_bytes - p.reserve.total_bytes
    with pytest.raises(ConfigError, match="not both"):
        plan_capacity("nemotron-h-8b", gpu="H200", gpu_memory="80GiB")
    for util in (0, 1.5, -0.1, True):
        with pytest.raises(ConfigError):
            plan_capacity("nemotron-h-8b", gpu_utilization=util)
    with pytest.raises(ConfigError, match="unknown model"):
        plan_capacity("no-such-model")
    with pytest.raises(ConfigError):
        plan_capacity("nemotron-h-8b", max_model_len=0)
    with pytest.raises(CapacityError) as info:
        plan_capacity("nemotron-h-8b", gpu_memory="100MiB")
    assert info.value.unit == "bytes" and info.value.available == 90 * MiB


def test_config_json_path_equals_preset(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["nemotron-h-8b"]))
    a = plan_capacity(str(tmp_path), vllm_compatible=True)
    b = plan_capacity("nemotron-h-8b", vllm_compatible=True)
    assert a.native == b.native and a.replay == b.replay and a.vllm_replay == b.vllm_replay


def test_state_dtype_changes_bytes() -> None:
    fp32 = plan_capacity("nemotron-h-8b", count_attention=False)
    bf16 = plan_capacity("nemotron-h-8b", count_attention=False, state_dtype="bf16")
    assert bf16.replay.page_bytes < fp32.replay.page_bytes
    assert fp32.replay.page_bytes - bf16.replay.page_bytes == 24 * 128 * 64 * 128 * 2
    assert torch.float32 == fp32.geometry.state_dtype


# -- cross-check against vLLM's own functions (when vLLM 0.33.0 is installed) ---------------

def _vllm_real_figure(plan, scheme: str, layout_name: str) -> tuple[float, int | None, int]:
    """vLLM 0.33.0's own block-size alignment, grouping, bytes per block and concurrency.

    Only the model class (its state shapes = our layout's tensors) and the attention
    backend (``MultipleOf(16)``, as FlashAttention) are stand-ins.
    """
    from types import SimpleNamespace as NS

    import vllm.model_executor.models as models_pkg
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.core import kv_cache_planning as kp
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

    layout = PageLayout(scheme, plan.geometry, plan.spec)  # type: ignore[arg-type]
    shapes = tuple(t.shape for t in layout.tensors)
    dtypes = tuple(t.dtype for t in layout.tensors)
    g, tp, mml = plan.geometry, plan.tp_size, plan.max_model_len
    attn = load_model(plan.model).attention
    n_attn = plan.num_attention_layers if plan.count_attention else 0
    kv_heads = max(1, attn.num_kv_heads // tp)
    cache_config = NS(cache_dtype="auto", block_size=16, mamba_cache_mode="none", mamba_page_size_padded=None)
    vllm_config = NS(cache_config=cache_config, parallel_config=NS(tensor_parallel_size=tp),
                     model_config=NS(dtype=g.act_dtype, use_mla=False, architecture="Fake",
                                     get_num_kv_heads=lambda pc: kv_heads, get_head_size=lambda: attn.head_dim))

    class FakeModel:
        @classmethod
        def get_mamba_state_shape_from_config(cls, vc):
            return shapes

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vc):
            return dtypes

    class Backend:
        @classmethod
        def customize_spec(cls, spec):
            return spec

        @classmethod
        def get_supported_kernel_block_sizes(cls, spec=None):
            return [MultipleOf(16)]

    class FakePlatform(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, vc):
            return [Backend]

    registry = models_pkg.ModelRegistry
    original = registry.resolve_model_cls
    registry.resolve_model_cls = lambda *a, **k: (FakeModel, "Fake")
    try:
        if n_attn:
            FakePlatform._align_hybrid_block_size(vllm_config, Backend)
    finally:
        registry.resolve_model_cls = original
    nsb = plan.num_speculative_tokens if scheme == "native" else 0
    specs = {f"attn.{i}": FullAttentionSpec(block_size=cache_config.block_size, num_kv_heads=kv_heads,
                                            head_size=attn.head_dim, dtype=g.act_dtype) for i in range(n_attn)}
    for i in range(g.num_layers):
        specs[f"mamba.{i}"] = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=mml,
                                        page_size_padded=cache_config.mamba_page_size_padded,
                                        mamba_cache_mode="none", num_speculative_blocks=nsb)
    assert MambaSpec(shapes=shapes, dtypes=dtypes, block_size=1).page_size_bytes == layout.layer_page_bytes
    if kp.is_kv_cache_spec_uniform(specs):
        groups = kp._get_kv_cache_groups_uniform_spec(specs)
    else:
        groups = kp._get_kv_cache_groups_uniform_page_size(kp.unify_kv_cache_spec_page_size(specs))
    bytes_per_block = kp._get_kv_cache_bytes_per_block(groups, KVCacheLayout[layout_name])
    num_blocks = plan.budget_bytes // bytes_per_block  # get_kv_cache_configs
    fake = NS(model_config=NS(max_model_len=mml), cache_config=NS(mamba_cache_mode="none"),
              parallel_config=NS(decode_context_parallel_size=1))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    block_size = cache_config.block_size if n_attn else None
    return get_max_concurrency_for_kv_cache_config(fake, config), block_size, num_blocks


def test_vllm_compatible_matches_vllm_0_33_source() -> None:
    vllm = pytest.importorskip("vllm")
    if vllm.__version__ != "0.33.0":
        pytest.skip(f"the cross-check is pinned to vLLM 0.33.0, found {vllm.__version__}")
    checked = 0
    for preset in preset_names():
        for tp, k, count_attention in ((1, 3, True), (8, 0, True), (2, 7, True), (1, 3, False)):
            plan = plan_capacity(preset, tp_size=tp, num_speculative_tokens=k, count_attention=count_attention,
                                 max_model_len=32768, vllm_compatible=True, kv_cache_memory="100GiB")
            for scheme in ("native", "replay"):
                mine = plan.vllm_native if scheme == "native" else plan.vllm_replay
                for layout_name in ("LBHNC", "BLHNC"):  # layer-outer and block-outer layouts
                    figure, block_size, num_blocks = _vllm_real_figure(plan, scheme, layout_name)
                    assert figure == mine.max_concurrency, (preset, tp, k, scheme, layout_name)
                    assert block_size == mine.block_size and num_blocks == mine.num_blocks
                    checked += 1
    assert checked == len(preset_names()) * 4 * 2 * 2
