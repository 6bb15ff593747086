"""vLLM's real Mamba2 prefill kernels and ssmstate's conv + verify on the same pages, against a serial oracle.

Run in a fresh process (vLLM decides at import whether Triton is usable, so :mod:`cpu_triton` must be set
up first); ``tests/test_vllm_integration.py`` does:

    python tests/vllm_engine/prefill_handover.py --backend reference --layout DS --K 3

Two real ``MambaMixer2`` layers (the plugin's class, built by vLLM's constructor) on vLLM-style pages.
Each step's metadata comes from vLLM's ``Mamba2AttentionMetadataBuilder``; ``conv_ssm_forward`` runs
prefill rows through vLLM's ``causal_conv1d_fn`` and chunked scan (interpreted) and decode / verify rows
through ssmstate. Covered: fresh prefills on pages and cursors left as garbage by an earlier owner,
chunked prefills that continue after earlier chunks, after one-token chunks vLLM runs as decode rows and
after verify rows whose rejected tails left ``conv_shift > 0``,
requests recomputed from scratch after decoding (vLLM's preemption), recycled blocks,
the conv layout given (``DS``: dim first, ``SD``: state first), K given (0 = plain decode), and dry
forwards: a dummy / capture batch on vLLM's null block, run twice on the same metadata, that must leave
every page and cursor as it was. Every output row is checked against the token-by-token oracle.
Prints one JSON line of what was covered; exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))  # this checkout's ssmstate first

import cpu_triton  # noqa: E402

cpu_triton.setup(force_mrv2=False)
os.environ["SSMSTATE_VLLM"] = "1"

import torch  # noqa: E402

from tests.harness import TINY_NEMOTRON_H  # noqa: E402

TINY = dict(TINY_NEMOTRON_H, chunk_size=8)  # the shared tiny config with vLLM's scan chunk at 8 tokens


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _common_metadata(rows):
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--layout", choices=("DS", "SD"), default="DS")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--state-dtype", default=None, help="the plugin's state_dtype (default: vLLM's, fp32)")
    ap.add_argument("--sr", action="store_true", help="stochastic rounding of checkpoint writes")
    ap.add_argument("--window", type=int, default=None, help="W (default 16); small W = frequent flushes")
    args = ap.parse_args()
    os.environ["SSMSTATE_VLLM_BACKEND"] = args.backend
    for key, value in (("STATE_DTYPE", args.state_dtype), ("STOCHASTIC_ROUNDING", "1" if args.sr else None),
                       ("WINDOW", None if args.window is None else str(args.window))):
        if value is not None:
            os.environ[f"SSMSTATE_VLLM_{key}"] = value

    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer_mod
    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.forward_context import set_forward_context
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    import ssmstate.integrations.vllm as sv
    from oracle import SerialOracle
    from ssmstate.layout import SCALE_NAME
    from ssmstate.ops import reference as ref

    assert HAS_TRITON, "vLLM did not find Triton: its prefill kernels would be placeholders"
    import vllm.platforms as platforms
    from vllm.v1.attention.backends import mamba2_attn, utils  # noqa: F401  (modules that read PIN_MEMORY)

    plat = type(platforms.current_platform)
    if not plat.device_type:  # vLLM's unspecified platform on a CPU box: no device, nothing to pin memory for
        plat.device_type = "cpu"
        for m in [m for name, m in list(sys.modules.items()) if name.startswith("vllm")]:
            if getattr(m, "PIN_MEMORY", None) is True:
                m.PIN_MEMORY = False
    sv.register()
    dim_first = args.layout == "DS"
    # vLLM reads the layout from its config; both modules that ask are pointed at the layout under test.
    mixer_mod.is_conv_state_dim_first = lambda: dim_first
    sv.is_conv_state_dim_first = lambda: dim_first

    import tempfile

    K = args.K
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(TINY))
    ea = dict(model=str(tmp), skip_tokenizer_init=True, max_model_len=512, enable_prefix_caching=False,
              dtype="float32", enforce_eager=True)
    if K:
        ea["speculative_config"] = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
                                    "prompt_lookup_min": 2}
    vc = EngineArgs(**ea).create_engine_config()
    H, P, N, G, k = 4, 8, 8, 2, 4
    T = K + 1
    di, Dc = H * P, H * P + 2 * G * N
    names = ["model.layers.0.mixer", "model.layers.2.mixer"]
    num_blocks, max_batch = 7, 8
    gen = torch.Generator().manual_seed(2)
    rng = random.Random(2)
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)
        try:
            layers = [mixer_mod.MambaMixer2(hidden_size=64, ssm_state_size=N, conv_kernel_size=k,
                                            intermediate_size=di, use_conv_bias=True, use_bias=False, n_groups=G,
                                            num_heads=H, head_dim=P, model_config=vc.model_config,
                                            cache_config=vc.cache_config, prefix=name)
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
    raws = [torch.randn((num_blocks, 1, 1, spec.page_size_bytes // 4), generator=gen).view(torch.int8)
            for _ in layers]  # pages start as garbage: a fresh request must read none of it
    for lyr, raw in zip(layers, raws):
        raw[0].zero_()
        lyr.bind_kv_cache(raw)
    kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    settings = sv.settings_from_vllm_config(vc)
    runtime = sv.VllmStateRuntime.from_kv_cache_config(kcc, {n: lyr for n, lyr in zip(names, layers)},
                                                       torch.device("cpu"), args.backend, max_batch,
                                                       stochastic_rounding=settings.stochastic_rounding)
    manager = runtime.groups[0].manager
    narrow = manager.geometry.state_dtype != torch.float32
    runtime.groups[0].manager.cache.cursors.copy_(torch.randint(0, 5, (4, num_blocks), generator=gen))
    runtime.groups[0].manager.cache.cursors[:, 0] = 0  # stale cursors everywhere but the null block
    builder = Mamba2AttentionMetadataBuilder(spec, names, vc, torch.device("cpu"))
    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=False, hash_block_size=spec.block_size)
    mgr = MambaManager(spec, pool, enable_caching=False, kv_cache_group_id=0, scheduler_block_size=spec.block_size)
    oracle = SerialOracle(len(layers), H, P, N, G, Dc, k)
    cursors = runtime.groups[0].manager.cache.cursors

    def forward(metadata, rows_req, qs, cu, check=True):
        nt = sum(qs)
        worst = 0.0
        with set_forward_context(metadata, vc), torch.no_grad():
            for li, lyr in enumerate(layers):
                projected = torch.randn(max(nt, 1), 2 * di + 2 * G * N + H, generator=gen)
                out = torch.zeros(max(nt, 1), di)
                lyr.conv_ssm_forward(projected[:nt], out[:nt])
                if not check:
                    continue
                xBC, dt = projected[:, di: di + Dc], projected[:, di + Dc:]
                for i, r in enumerate(rows_req):
                    lo, hi = cu[i], cu[i + 1]
                    conv = oracle.conv_step(r, li, xBC[lo:hi], lyr.conv_weights, lyr.conv1d.bias).float()
                    want = oracle.verify(r, li, conv[:, :di].reshape(-1, H, P), dt[lo:hi],
                                         conv[:, di: di + G * N].reshape(-1, G, N),
                                         conv[:, di + G * N:].reshape(-1, G, N), lyr.A, D=lyr.D, dt_bias=lyr.dt_bias)
                    worst = max(worst, float((out[lo:hi].double() - want.reshape(hi - lo, di)).abs().max()))
        return worst

    def snapshot():
        return [raw[1:].clone() for raw in raws], cursors[:, 1:].clone()

    def sync(rids):
        """A narrow checkpoint: each page's state (decoded checkpoint + committed rows) is within one rounding
        step of the oracle's; the oracle then takes it, so later outputs are checked exactly."""
        worst_q = 0.0
        for r in rids:
            b = active[r]["block"]
            for li, lyr in enumerate(layers):
                v = lyr.ssmstate_views
                got = ref.replay_read_state(v["checkpoint"], v["x_ring"], v["B_ring"], v["dt_ring"], cursors[0],
                                            cursors[1], lyr.A, b, window=manager.layout.spec.window,
                                            checkpoint_scale=v.get(SCALE_NAME)).double()
                scale = v[SCALE_NAME][b].double()[..., None] if SCALE_NAME in v else None
                excess = ((got - oracle.ssm[r][li]).abs() - rounding_bound(oracle.ssm[r][li], got, scale)).max()
                worst_q = max(worst_q, float(excess))
                saw["max_state_rounding"] = max(saw["max_state_rounding"], float((got - oracle.ssm[r][li]).abs().max()))
                oracle.ssm[r][li] = got
        assert worst_q <= 1e-5, f"a stored state is further than one rounding step from the oracle's: {worst_q}"
        return len(rids)

    def rounding_bound(S, got, scale):
        """Largest |stored - S| one checkpoint write (maybe followed by committed rows, which only decay it)
        may leave: int8 half a code step per element, fp8 and bf16/fp16 half an ulp of the row's largest
        value (x2 with stochastic rounding, x1.5 for the rows added after a flush)."""
        dt, k = manager.geometry.state_dtype, 2.0 if settings.stochastic_rounding else 1.0
        row = torch.maximum(S.abs(), got.abs()).amax(-1, keepdim=True) * 1.5
        if dt == torch.int8:
            return k * 0.5 * scale + 1e-6 * row
        if dt == torch.float8_e4m3fn:
            return k * (row * 2.0 ** -4 + 2.0 ** -10 * scale)
        mant = {torch.bfloat16: 8, torch.float16: 11}[dt]
        return k * (row * 2.0 ** -mant + 2.0 ** -24)

    active: dict[str, dict] = {}
    seen: set[int] = set()
    saw = {"fresh_prefill": 0, "continuing_prefill": 0, "prefill_after_one_token_decode_row": 0,
           "prefill_after_verify_rows": 0, "prefill_after_rejected_tail": 0,
           "one_token_decode_rows": 0, "mixed_steps": 0,
           "recycled_blocks": 0, "dry_double_forwards": 0, "verify_rows": 0, "flush_rows": 0,
           "states_synced": 0, "max_state_rounding": 0.0}
    worst = 0.0
    next_id = 0
    for step in range(args.steps):
        for rid in [r for r, st in active.items() if st["decoding"] and rng.random() < 0.25]:
            mgr.free(rid)
            oracle.release(rid)
            del active[rid]
        while len(active) < 4 and pool.get_num_free_blocks() > 0:
            rid = f"r{next_id}"
            next_id += 1
            block = mgr.allocate_new_blocks(rid, 32, 32)[0].block_id
            saw["recycled_blocks"] += block in seen
            seen.add(block)
            oracle.admit(rid)
            active[rid] = {"block": block, "computed": 0, "prompt": rng.randint(6, 20), "decoding": False,
                           "last": None}
        decodes = [r for r, st in active.items() if st["decoding"]]
        qs = {r: 1 + rng.randint(0, K) for r in decodes}
        shorts, longs = [], []
        for r, st in active.items():
            if st["decoding"]:
                continue
            left = st["prompt"] - st["computed"]
            if st["computed"] and left > 1 and rng.random() < 0.3:
                qs[r] = 1  # a one-token chunk with prior state: vLLM runs it as a decode row
                shorts.append(r)
            else:
                qs[r] = left if rng.random() < 0.5 else rng.randint(1, left)
                (shorts if st["computed"] and qs[r] == 1 else longs).append(r)
        # Now and then a decoding request is recomputed (vLLM's preemption): its next rows are a prefill again.
        if decodes and rng.random() < 0.3:
            r = decodes.pop()
            del qs[r]
            st = active[r]
            oracle.release(r)
            oracle.admit(r)
            st.update(computed=0, prompt=st["prompt"] + 3, decoding=False)
            qs[r] = rng.randint(2, st["prompt"])
            longs.append(r)
            st["recomputed"] = True
        # Or a decoding request gets more input as a prefill chunk with state (a continuing prefill right
        # after verify rows, whose rejected tails left the conv history short of the window's end).
        elif any(int(cursors[3, active[r]["block"]]) for r in decodes) and rng.random() < 0.5:
            r = next(r for r in decodes if int(cursors[3, active[r]["block"]]))
            decodes.remove(r)
            st = active[r]
            qs[r] = rng.randint(2, 6)
            st.update(prompt=st["computed"] + qs[r] + rng.randint(0, 3), decoding=False)
            longs.append(r)
        order = decodes + shorts + longs
        if not order:
            continue
        rows = [(active[r]["block"], active[r]["computed"], qs[r], not active[r]["decoding"]) for r in order]
        common = _common_metadata(rows)
        if K:
            draft = torch.tensor([qs[r] - 1 for r in decodes] + [-1] * (len(shorts) + len(longs)), dtype=torch.int32)
            md = builder.build(0, common, num_accepted_tokens=torch.ones(len(rows), dtype=torch.int32),
                               num_decode_draft_tokens_cpu=draft)
        else:
            md = builder.build(0, common)
        assert md.num_prefills == len(longs), (md.num_prefills, len(longs))
        for r in longs:
            st = active[r]
            if st["computed"]:
                saw["continuing_prefill"] += 1
                saw["prefill_after_one_token_decode_row"] += st["last"] == "short"
                saw["prefill_after_verify_rows"] += st["last"] == "decode"
                saw["prefill_after_rejected_tail"] += int(cursors[3, st["block"]]) > 0
            else:
                saw["fresh_prefill"] += 1
        saw["one_token_decode_rows"] += len(shorts)
        saw["mixed_steps"] += bool(longs and (decodes or shorts))
        saw["verify_rows"] += sum(qs[r] > 1 for r in decodes)
        metadata = {name: md for name in names}
        saw["flush_rows"] += sum(int(cursors[1, active[r]["block"]]) + qs[r] > manager.layout.spec.window
                                 for r in decodes)
        runtime.begin_step(metadata, common.query_start_loc_cpu)
        if narrow:  # the hand-over folded continuing rows' ring rows into the (narrow) checkpoint
            saw["states_synced"] += sync([r for r in longs if active[r]["computed"]])
        worst = max(worst, forward(metadata, order, [qs[r] for r in order], common.query_start_loc_cpu.tolist()))
        accepted = {r: rng.randint(1, qs[r]) for r in decodes}
        final = {r: active[r]["computed"] + qs[r] == active[r]["prompt"] for r in shorts + longs}
        num_sampled = torch.tensor([accepted[r] for r in decodes] + [int(final[r]) for r in shorts + longs],
                                   dtype=torch.int32)
        runtime.commit(num_sampled)
        for r in decodes:
            oracle.commit(r, accepted[r])
            active[r]["computed"] += accepted[r]
            active[r]["last"] = "decode"
        for r in shorts + longs:
            oracle.commit(r, qs[r])
            active[r]["computed"] += qs[r]
            active[r]["decoding"] = active[r]["computed"] == active[r]["prompt"]
            active[r]["last"] = "short" if r in shorts else "prefill"
        if narrow:  # flushes and prefills wrote narrow checkpoints
            saw["states_synced"] += sync([r for r in order if active[r]["computed"]])

        # A dummy / capture forward: vLLM's dummy block tables are all null; the forward runs twice.
        if step % 3 == 1:
            before = snapshot()
            rows = [(0, 0, T, False)] * 3
            common = _common_metadata(rows)
            kw = {}
            if K:
                kw = dict(num_accepted_tokens=torch.ones(3, dtype=torch.int32),
                          num_decode_draft_tokens_cpu=torch.full((3,), K, dtype=torch.int32))
            md = builder.build(0, common, **kw)
            metadata = {name: md for name in names}
            runtime.begin_step(metadata, common.query_start_loc_cpu, real=False)
            for _ in range(2):
                forward(metadata, [], [T] * 3, common.query_start_loc_cpu.tolist(), check=False)
            runtime.commit(0)
            after = snapshot()
            assert all(torch.equal(a, b) for a, b in zip(before[0], after[0])), "a dry forward wrote a page"
            assert torch.equal(before[1], after[1]), "a dry forward moved a cursor"
            saw["dry_double_forwards"] += 1
    result = {"backend": args.backend, "layout": args.layout, "K": K,
              "state_dtype": str(manager.geometry.state_dtype).removeprefix("torch."),
              "stochastic_rounding": settings.stochastic_rounding, "worst_abs_err": worst, **saw}
    print(json.dumps(result))
    assert worst < 1e-3, worst
    return 0


if __name__ == "__main__":
    sys.exit(main())
