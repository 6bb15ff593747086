"""Host overhead of one step's bookkeeping: ``begin_step`` + ``commit`` for 256 requests.

Run with pytest-benchmark (CPU tensors; the figure is Python time per step)::

    python -m pytest benchmarks/bench_lifecycle.py --benchmark-only --benchmark-json docs/results/lifecycle_cpu.json

Every layer is "verified" by marking the plan, so only host bookkeeping and the
commit's cursor arithmetic are timed, not kernels. Target: under 100 µs per step.
"""

from __future__ import annotations

import pytest
import torch

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager

BATCH = 256


@pytest.fixture(scope="module")
def manager() -> StateManager:
    # Tiny per-page tensors: the pool size, not the state size, matters for host time.
    g = Mamba2Geometry(num_heads=2, head_dim=2, state_size=2, n_groups=1, conv_kernel=4, num_layers=24,
                       act_dtype=torch.float32)
    m = StateManager(PageLayout.replay(g, SpecConfig(3, window=16)), num_pages=BATCH + 1)
    for i in range(BATCH):
        m.admit(i)
    return m


@pytest.mark.parametrize("counts", ["list", "tensor"])
def test_begin_step_and_commit(benchmark, manager, counts):
    ids = list(range(BATCH))
    all_layers = set(range(manager.num_layers))
    accepted = [2] * BATCH if counts == "list" else torch.full((BATCH,), 2, dtype=torch.int32)

    def step() -> None:
        plan = manager.begin_step(ids, 4)
        plan.verified_layers.update(all_layers)  # kernels are not timed here
        manager.commit(plan, accepted)

    benchmark(step)
    mean_us = benchmark.stats.stats.mean * 1e6
    print(f"\nbegin_step + commit, {BATCH} requests, counts as {counts}: {mean_us:.1f} us per step")
