"""The FlashInfer backend's conv against the reference conv, step by step on two identical caches (CPU or GPU).

Used by tests/test_flashinfer_conv.py (CPU, vLLM's kernel interpreted) and tests/gpu/test_flashinfer_tune_gpu.py
(compiled). vLLM's kernel module must be importable when it runs.
"""

from __future__ import annotations

import random

import torch

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig
from ssmstate.backends import flashinfer as fb
from ssmstate.backends import flashinfer_tune as ft
from ssmstate.backends.reference import ReferenceBackend
from ssmstate.cache import StateCache
from ssmstate.ops import reference as ref


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / (b.float().norm() + 1e-12))


def conv_lockstep(device: str, ragged: bool, wdtype: torch.dtype, tol: float, steps: int = 8, seed: int = 0) -> None:
    """The reference backend and the FlashInfer backend's conv on two identical caches, committed alike (reference
    commit rule, random accepted counts with 0 and q frequent), compared after every step; the first steps
    reject every token, so rows roll back over a full window (``conv_shift = T``)."""
    g = Mamba2Geometry(num_heads=2, head_dim=32, state_size=64, n_groups=1, conv_kernel=4, num_layers=2,
                       act_dtype="bf16", state_dtype="fp32")
    layout = PageLayout.replay(g, SpecConfig(3, window=8))
    T, W, R = layout.spec.num_tokens, layout.spec.window, layout.spec.ring_len
    Dc, k, pages = g.conv_dim_per_rank, g.conv_kernel, 10
    caches = [StateCache(layout, pages, device) for _ in range(2)]
    gen = torch.Generator().manual_seed(seed)
    for lay in range(g.num_layers):  # distinct finite windows to roll back into
        w0 = torch.randn(pages, Dc, k - 1 + T, generator=gen).to(device)
        for c in caches:
            c.layers[lay]["conv"].copy_(w0)
    backends = [ReferenceBackend(), fb.FlashInferBackend(conv="vllm")]
    assert backends[1].conv_impl == "vllm-triton"
    weights = [(torch.randn(Dc, k, generator=gen).to(device, wdtype), torch.randn(Dc, generator=gen).to(device, wdtype))
               for _ in range(g.num_layers)]
    rng = random.Random(seed)
    for step in range(steps):
        rows = sorted(rng.sample(range(1, pages), rng.randint(1, 4)))
        qs = [rng.randint(1, T) for _ in rows] if ragged and step >= 2 else [T] * len(rows)
        pad = [0] * rng.randint(0, 1)  # a padding row (page 0) with T tokens where the step is uniform
        pids = torch.tensor(rows + pad, dtype=torch.int32, device=device)
        lens = qs + ([T] * len(pad) if not ragged or step < 2 else [0] * len(pad))
        plan = ft.plan_for(pids, lens)
        L = plan.total_tokens
        acc = [0] * len(rows) if step < 2 else [rng.choice([0, q, rng.randint(0, q)]) for q in qs]
        for lay in range(g.num_layers):
            xBC = torch.randn(L, Dc, generator=gen).to(device, torch.bfloat16)
            outs = []
            for be, c in zip(backends, caches):
                o = torch.full((L, Dc), 7.0, dtype=torch.bfloat16, device=device)
                outs.append(be.conv(c, lay, plan, xBC, *weights[lay], "silu", o))
            live = torch.cat([torch.arange(int(plan.cu_seqlens_host[r]), int(plan.cu_seqlens_host[r + 1]))
                              for r in range(len(rows))])
            assert rel(outs[1][live], outs[0][live]) < tol, (step, lay, qs)
            assert torch.equal(outs[1][L - (lens[-1] if pad else 0):], outs[0][L - (lens[-1] if pad else 0):])
        for c in caches:
            c.pending[pids[: len(rows)].long()] = torch.tensor(qs, dtype=torch.int32, device=device)
            err = torch.zeros(1, dtype=torch.int32, device=device)
            a = torch.tensor(acc + [0] * len(pad), dtype=torch.int32, device=device)
            ref.replay_commit(c.ring_start, c.num_committed, c.pending, c.conv_shift, pids, a, W, R, True, err)
            assert int(err) == 0
        assert torch.equal(caches[0].cursors, caches[1].cursors)
        for a_, b_ in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a_["conv"], b_["conv"]), (step, rows, qs, acc)
