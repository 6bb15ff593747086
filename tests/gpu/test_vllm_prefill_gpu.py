"""vLLM's Triton prefill kernels write ssmstate pages; ssmstate's Triton conv + verify continue them.

Needs the kernel files copied from an installed vLLM (no vLLM install here):

    python tests/gpu/copy_vllm_kernels.py                 # where vLLM is installed; writes .device/vllm_kernels
    SSMSTATE_VLLM_KERNELS=.device/vllm_kernels python -m pytest -q tests/gpu/test_vllm_prefill_gpu.py

On a CUDA device everything is compiled; on a CPU machine it runs at a tiny size under
``TRITON_INTERPRET=1`` (set it before the run). Pages are laid out as vLLM strides them (one raw
int8 page per block holding every tensor, padded), vLLM's ``causal_conv1d_fn`` gets
:func:`prefill_conv_view` and the checkpoint view, ``mamba_chunk_scan_combined_varlen`` reads and
writes the checkpoint; before each prefill the pages are handed over as the plugin does (materialize
+ settle the conv history for continuing rows, zero cursors for fresh ones). Then decode / verify
steps of random length with random acceptance run through ``StateManager`` on the triton backend.
Every output is matched against a token-by-token float64 reference.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch

KERNELS = os.environ.get("SSMSTATE_VLLM_KERNELS")
pytestmark = pytest.mark.skipif(not KERNELS, reason="SSMSTATE_VLLM_KERNELS is not set (tests/gpu/copy_vllm_kernels.py)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _pages(layout, raw):
    """Typed per-tensor views into raw int8 pages, as vLLM's bind_kv_cache slices them."""
    views, off = {}, 0
    for t in layout.tensors:
        views[t.name] = t.view(raw[:, off: off + t.nbytes])  # each page in the spec's memory order
        off += t.nbytes
    return views


def _conv_metadata(cu: list[int], device: torch.device, block_m: int = 8):
    """The program map ``causal_conv1d_fn`` takes from vLLM's Mamba metadata: for each program, which
    sequence (``batch_ptr``) and which ``block_m``-token piece of it (``token_chunk_offset_ptr``)."""
    from types import SimpleNamespace

    seq, piece = [], []
    for i, (lo, hi) in enumerate(zip(cu, cu[1:])):
        n = -(-(hi - lo) // block_m)
        seq += [i] * n
        piece += list(range(n))
    size = max(1024, len(seq)) * 2
    batch_ptr = torch.full((size,), -1, dtype=torch.int32, device=device)
    offset_ptr = torch.full((size,), -1, dtype=torch.int32, device=device)
    batch_ptr[: len(seq)] = torch.tensor(seq, dtype=torch.int32)
    offset_ptr[: len(seq)] = torch.tensor(piece, dtype=torch.int32)
    nums = {block_m: {"tot": len(seq), "mlist": torch.tensor(seq), "mlist_len": len(seq),
                      "offsetlist": torch.tensor(piece), "batch_ptr": batch_ptr, "token_chunk_offset_ptr": offset_ptr}}
    return SimpleNamespace(nums_dict=nums, batch_ptr=batch_ptr, token_chunk_offset_ptr=offset_ptr)


def test_vllm_prefill_kernels_then_ssmstate_verify():
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device: run with TRITON_INTERPRET=1 for the interpreted CPU check")
    import vllm_kernel_shim

    kernels = vllm_kernel_shim.load(KERNELS)
    if on_gpu:  # one tiling per autotuned prefill kernel: tuning tens of builds took minutes and tests nothing here
        assert vllm_kernel_shim.smallest_configs_only() > 0
    if not on_gpu:
        sys.path.insert(0, str(HERE.parent / "vllm_engine"))
        import cpu_triton

        cpu_triton._patch_interpreter()  # what vLLM's prefill kernels need of the interpreter
    causal_conv1d_fn = kernels["causal_conv1d"].causal_conv1d_fn
    chunk_scan = kernels["ssd_combined"].mamba_chunk_scan_combined_varlen

    from oracle import SerialOracle
    from ssmstate.cache import StateCache
    from ssmstate.geometry import Mamba2Geometry
    from ssmstate.integrations.prefill import prefill_conv_view, settle_conv_history
    from ssmstate.layout import PageLayout, SpecConfig
    from ssmstate.manager import StateManager

    dev = torch.device("cuda" if on_gpu else "cpu")
    if on_gpu:
        H, P, N, G, k, K, W, L, blocks, steps, chunk = 32, 64, 128, 8, 4, 3, 16, 2, 48, 60, 128
    else:
        H, P, N, G, k, K, W, L, blocks, steps, chunk = 4, 8, 8, 2, 4, 3, 6, 2, 7, 10, 16
    T = K + 1
    geo = Mamba2Geometry(num_heads=H, head_dim=P, state_size=N, n_groups=G, conv_kernel=k, num_layers=L,
                         state_dtype=torch.float32, act_dtype=torch.float32, conv_dtype=torch.float32, tp_size=1)
    layout = PageLayout.replay(geo, SpecConfig(K, W))
    page_bytes = layout.layer_page_bytes + 256  # padded like vLLM's pages
    raws = [torch.randn(blocks, page_bytes // 4, device=dev).view(torch.int8) for _ in range(L)]  # garbage
    for raw in raws:
        raw[0].zero_()
    views = [_pages(layout, raw) for raw in raws]
    cursors = torch.randint(0, 4, (4, blocks), dtype=torch.int32, device=dev)
    cursors[:, 0] = 0
    manager = StateManager(layout, blocks, dev, backend="triton", max_batch=8,
                           cache=StateCache.from_tensors(layout, views, cursors))
    Dc, di = geo.conv_dim_per_rank, H * P
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dev)

    A = [-(0.5 + torch.rand(H, generator=gen)).to(dev) for _ in range(L)]
    D = [rnd(H) for _ in range(L)]
    dt_bias = [rnd(H, scale=0.5) for _ in range(L)]
    w = [rnd(Dc, k, scale=0.5) for _ in range(L)]
    b = [rnd(Dc, scale=0.1) for _ in range(L)]
    oracle = SerialOracle(L, H, P, N, G, Dc, k)

    def check_rows(li, rows, xBC, dt, C, y):
        worst = 0.0
        for r, lo, hi in rows:
            conv = oracle.conv_step(r, li, xBC[lo:hi].cpu(), w[li].cpu(), b[li].cpu()).float()
            want = oracle.verify(r, li, conv[:, :di].reshape(-1, H, P), dt[lo:hi].cpu(),
                                 conv[:, di: di + G * N].reshape(-1, G, N), C[lo:hi].cpu(), A[li].cpu(),
                                 D=D[li].cpu(), dt_bias=dt_bias[li].cpu())
            # relative to the row's largest output: on the GPU both vLLM's prefill kernels and ours take fp32
            # dots in tf32 (about 3e-4 relative a product), so an absolute bound would only measure magnitudes
            err = float((y[lo:hi].double().cpu().reshape(hi - lo, H, P) - want).abs().max())
            worst = max(worst, err / max(float(want.abs().max()), 1.0))
        return worst

    active: dict[int, dict] = {}
    free = list(range(1, blocks))
    worst, prefills, continuing, verify_rows, rid = 0.0, 0, 0, 0, 0
    worst_prefill = 0.0
    for step in range(steps):
        for r in [r for r, st in active.items() if st["decoding"] and rng.random() < 0.2]:
            free.append(active.pop(r)["block"])
            oracle.release(r)
        while free and len(active) < 6:
            rid += 1
            active[rid] = {"block": free.pop(0), "computed": 0, "prompt": rng.randint(4, 2 * chunk),
                           "decoding": False}
            oracle.admit(rid)
        pre = [r for r, st in active.items() if not st["decoding"]]
        dec = [r for r, st in active.items() if st["decoding"]]
        # -- prefill rows through vLLM's kernels -------------------------------------------------------
        if pre:
            qs = [min(chunk, rng.randint(1, active[r]["prompt"] - active[r]["computed"])) for r in pre]
            pages = torch.tensor([active[r]["block"] for r in pre], dtype=torch.int32, device=dev)
            has_state = torch.tensor([active[r]["computed"] > 0 for r in pre], device=dev)
            zero = torch.zeros_like(pages)
            manager.materialize_pages(torch.where(has_state, pages, zero))
            settle_conv_history(manager, torch.where(has_state, pages, zero))
            manager.reset_cursors(torch.where(has_state, zero, pages))
            cu = [0]
            for q in qs:
                cu.append(cu[-1] + q)
            cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
            n = cu[-1]
            idx = torch.arange(len(pre), dtype=torch.int32, device=dev)
            for li in range(L):
                xBC, dt, C = rnd(n, Dc), rnd(n, H), rnd(n, G, N)
                conv_state = prefill_conv_view(views[li]["conv"], k, True)
                conv_out = causal_conv1d_fn(xBC.t(), w[li], b[li], conv_states=conv_state, query_start_loc=cu_t,
                                            cache_indices=pages, has_initial_state=has_state, activation="silu",
                                            metadata=_conv_metadata(cu, dev)).t()
                x, B = conv_out[:, :di], conv_out[:, di: di + G * N]
                ckpt = views[li]["checkpoint"]
                init = torch.where(has_state[:, None, None, None], ckpt[pages.long()], 0)
                y = torch.empty(n, H, P, device=dev)
                chunk_scan(x.reshape(n, H, P), dt, A[li], B.reshape(n, G, N), C, chunk_size=chunk, cu_seqlens=cu_t,
                           cu_chunk_seqlens=cu_t, last_chunk_indices=idx, seq_idx=idx, out=y, D=D[li],
                           dt_bias=dt_bias[li], initial_states=init, dt_softplus=True, state_dtype=ckpt.dtype,
                           final_states_out=ckpt, final_state_indices=pages)
                err = check_rows(li, [(r, cu[i], cu[i + 1]) for i, r in enumerate(pre)], xBC, dt, C, y)
                worst, worst_prefill = max(worst, err), max(worst_prefill, err)
            for r, q in zip(pre, qs):
                oracle.commit(r, q)
                st = active[r]
                continuing += st["computed"] > 0
                st["computed"] += q
                st["decoding"] = st["computed"] == st["prompt"]
            prefills += len(pre)
        # -- decode / verify rows through ssmstate ----------------------------------------------------------
        if dec:
            qs = [rng.randint(1, T) for _ in dec]
            cu = [0]
            for q in qs:
                cu.append(cu[-1] + q)
            plan = manager.begin_step_from_tensors(
                torch.tensor([active[r]["block"] for r in dec], dtype=torch.int32, device=dev),
                torch.tensor(cu, dtype=torch.int32, device=dev), total_tokens=cu[-1], max_seqlen=T, num_tokens=qs)
            n = cu[-1]
            for li in range(L):
                xBC, dt, C = rnd(n, Dc), rnd(n, H), rnd(n, G, N)
                conv_out = manager.conv(li, plan, xBC, w[li], b[li], activation="silu")
                y = manager.verify(li, plan, conv_out[:, :di].reshape(n, H, P).contiguous(), dt,
                                   conv_out[:, di: di + G * N].reshape(n, G, N).contiguous(), C, A[li], D=D[li],
                                   dt_bias=dt_bias[li])
                worst = max(worst, check_rows(li, [(r, cu[i], cu[i + 1]) for i, r in enumerate(dec)], xBC, dt, C, y))
            acc = [rng.randint(1, q) for q in qs]
            manager.commit(plan, torch.tensor(acc, dtype=torch.int32, device=dev))
            for r, a in zip(dec, acc):
                oracle.commit(r, a)
            verify_rows += sum(q > 1 for q in qs)
        manager.raise_device_errors()
    print(f"vLLM kernels -> ssmstate triton: {steps} steps, {prefills} prefill rows ({continuing} continuing), "
          f"{verify_rows} verify rows, worst error {worst:.2e} (prefill rows {worst_prefill:.2e}; of the row's "
          f"largest output, at least 1) on {dev}")
    assert prefills and continuing and verify_rows
    assert worst < (5e-3 if on_gpu else 2e-3), worst
