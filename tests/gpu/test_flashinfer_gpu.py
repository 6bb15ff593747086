"""FlashInfer backend vs the PyTorch reference on the GPU, at Nemotron-H geometry.

H=128, P=64, N=128, G=8, bf16 inputs, fp32 state, T=4 (K=3), W=16 (R=20). Two
managers (flashinfer, reference) run the same random schedule side by side:
outputs, checkpoints after flushes, rings and cursors must agree within bf16
tolerances (FlashInfer runs its small products as bf16 tensor-core MMAs).
Covers dense and varlen calls, rows of different lengths, acceptance 0 and q,
padding rows on page 0, device-side commits, materialize, a CUDA-graph replay of
a verify captured with fixed buffers, the native scheme through
``selective_state_update``, and the autotuner.

GPU only; skipped as a whole module without CUDA or flashinfer. CONTRIBUTING.md says
how to run it on an offline machine.
"""

from __future__ import annotations

import importlib.util
import os
import random
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
    reason="needs CUDA and flashinfer-python",
)

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402

H, P, N, G, K, W = 128, 64, 128, 8, 3, 16
T = K + 1
ACT = torch.bfloat16
OUT_TOL = 2e-2  # relative (norm) error of bf16 outputs
STATE_TOL = 1e-2  # relative (norm) error of fp32 checkpoints
ALGO_SEED = {"auto": 1, "monolith": 2, "two-kernel": 3}
#: where the managers live; only a CPU dry run of this file's logic (with a stand-in kernel) changes it
DEV = torch.device(os.environ.get("SSMSTATE_FI_TEST_DEVICE", "cuda"))


def layout(scheme: str = "replay", layers: int = 2) -> PageLayout:
    g = Mamba2Geometry(num_heads=H, head_dim=P, state_size=N, n_groups=G, conv_kernel=4, num_layers=layers,
                       state_dtype=torch.float32, act_dtype=ACT)
    s = SpecConfig(K, window=W)
    return PageLayout.replay(g, s) if scheme == "replay" else PageLayout.native(g, s)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-12))


class Pair:
    """A flashinfer manager and a reference manager fed identical inputs."""

    def __init__(self, lay: PageLayout, num_pages: int = 24, max_batch: int = 16, algorithm: str = "auto",
                 seed: int = 0) -> None:
        dev = DEV
        self.fi = StateManager(lay, num_pages, device=dev, backend="flashinfer", max_batch=max_batch)
        self.fi.backend.algorithm = algorithm
        self.rf = StateManager(lay, num_pages, device=dev, backend="reference", max_batch=max_batch)
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.rng = random.Random(seed)
        self.dev = dev
        self.layers = lay.geometry.num_layers
        self.params = []
        for _ in range(self.layers):
            A = -(torch.rand(H, generator=self.gen) * 3.5 + 0.5)
            D = torch.randn(H, generator=self.gen)
            dt_bias = torch.rand(H, generator=self.gen) - 0.5
            self.params.append(tuple(t.to(dev) for t in (A, D, dt_bias)))

    def rand(self, *shape: int, scale: float = 1.0, dtype: torch.dtype = ACT) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen) * scale).to(device=self.dev, dtype=dtype)

    def admit(self, rid: str) -> None:
        for m in (self.fi, self.rf):
            m.admit(rid)
        for layer in range(self.layers):
            S = self.rand(H, P, N, scale=0.5, dtype=torch.float32)
            for m in (self.fi, self.rf):
                m.write_state(rid, layer, S)

    def inputs(self, L: int, with_z: bool) -> dict:
        return dict(x=self.rand(L, H, P), dt=self.rand(L, H, scale=0.5, dtype=torch.float32) - 1.0,
                    B=self.rand(L, G, N, scale=0.3), C=self.rand(L, G, N, scale=0.3),
                    z=self.rand(L, H, P) if with_z else None)


def test_replay_random_schedule_matches_reference(algorithm):
    pair = Pair(layout("replay"), algorithm=algorithm, seed=ALGO_SEED[algorithm])
    fi, rf, rng = pair.fi, pair.rf, pair.rng
    ids = [f"r{i}" for i in range(6)]
    for r in ids:
        pair.admit(r)
    n_flush = n_keep = 0
    saw = set()
    for step in range(20):
        rows = rng.sample(ids, rng.randint(1, 6) if step % 4 == 3 else rng.randint(4, 6))
        kind = rng.choice(["dense", "ragged", "short"])
        qs: int | list[int] = T if kind == "dense" else (
            rng.randint(1, T - 1) if kind == "short" else [rng.choice([1, 2, 3, 4, 4]) for _ in rows])
        pad = rng.choice([None, len(rows) + rng.randint(1, 3)])
        plans = [m.begin_step(rows, qs, pad_to=pad) for m in (fi, rf)]
        plan = plans[0]
        saw.add((kind, pad is not None))
        n = len(rows)
        pages = plan.page_ids[:n].long()
        c = fi.cache.num_committed[pages].cpu()
        q = torch.tensor(plan.num_tokens[:n])
        flush = (c + q > W).tolist()
        n_flush += sum(flush)
        n_keep += n - sum(flush)
        real = plan.cu_seqlens_host[n].item()
        for layer in range(pair.layers):
            A, D, dt_bias = pair.params[layer]
            use_d = rng.random() < 0.75
            inp = pair.inputs(plan.total_tokens, with_z=rng.random() < 0.5)
            before = fi.cache.layers[layer]["checkpoint"][pages].clone()
            sentinel = torch.full((plan.total_tokens, H, P), 3.0, dtype=ACT, device=pair.dev)
            y_fi = fi.verify(layer, plan, **inp, A=A, D=D if use_d else None, dt_bias=dt_bias,
                             out=sentinel.clone())
            y_rf = rf.verify(layer, plans[1], **inp, A=A, D=D if use_d else None, dt_bias=dt_bias)
            err = rel(y_fi[:real], y_rf[:real])
            assert err < OUT_TOL, f"step {step} layer {layer} ({kind}) output error {err:.3g}"
            assert torch.equal(y_fi[real:], sentinel[real:]), "padding rows' outputs were written"
            after = fi.cache.layers[layer]["checkpoint"][pages]
            for i, fl in enumerate(flush):
                if fl:  # the kernel flushed exactly where the commit rule says c + q > W
                    assert not torch.equal(after[i], before[i]), f"row {i}: c+q>W but no checkpoint write"
                else:
                    assert torch.equal(after[i], before[i]), f"row {i}: c+q<=W but the checkpoint changed"
        acc = [rng.choice([0, qq, qq, rng.randint(0, qq)]) for qq in plan.num_tokens[:n]]
        if rng.random() < 0.5:
            fi.commit(plan, torch.tensor(acc, dtype=torch.int32, device=pair.dev))
        else:
            fi.commit(plan, acc)
        rf.commit(plans[1], acc)
        assert torch.equal(fi.cache.cursors, rf.cache.cursors)
        for layer in range(pair.layers):
            a, b = fi.cache.layers[layer], rf.cache.layers[layer]
            assert torch.equal(a["x_ring"], b["x_ring"]) and torch.equal(a["B_ring"], b["B_ring"])
            torch.testing.assert_close(a["dt_ring"], b["dt_ring"], rtol=1e-4, atol=1e-5)
            err = rel(a["checkpoint"], b["checkpoint"])
            assert err < STATE_TOL, f"step {step} layer {layer} checkpoint error {err:.3g}"
    assert n_flush > 0 and n_keep > 0, (n_flush, n_keep)
    for r in ids:
        for layer in range(pair.layers):
            assert rel(fi.read_state(r, layer), rf.read_state(r, layer)) < STATE_TOL
    fi.materialize(ids)
    rf.materialize(ids)
    assert torch.equal(fi.cache.cursors, rf.cache.cursors)
    assert not fi.cache.layers[0]["checkpoint"][0].any(), "the null page was written"
    print(f"[{algorithm}] flush rows {n_flush}, non-flush rows {n_keep}, kinds {sorted(saw)}")


@pytest.fixture(params=["auto", "monolith", "two-kernel"])
def algorithm(request):
    return request.param


def test_cuda_graph_replay_of_a_captured_verify(graph_algorithm):
    lay = layout("replay", layers=1)
    pair = Pair(lay, max_batch=8, algorithm=graph_algorithm, seed=7)
    fi, rf, rng = pair.fi, pair.rf, pair.rng
    ids = [f"g{i}" for i in range(7)]
    for r in ids:
        pair.admit(r)
    rows, L = 8, 8 * T
    A, D, dt_bias = pair.params[0]
    bufs = pair.inputs(L, with_z=True)
    out = torch.zeros(L, H, P, dtype=ACT, device=pair.dev)
    graph = None
    for step in range(8):
        chosen = rng.sample(ids, 5)
        plans = [m.begin_step(chosen, T, pad_to=rows) for m in (fi, rf)]
        new = pair.inputs(L, with_z=True)
        for k in bufs:
            bufs[k].copy_(new[k])
        if step == 0:  # eager: JIT load, scratch allocation
            fi.verify(0, plans[0], **bufs, A=A, D=D, dt_bias=dt_bias, out=out)
        else:
            if graph is None:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fi.backend.verify(fi.cache, 0, plans[0], bufs["x"], bufs["dt"], A, bufs["B"], bufs["C"], D,
                                      dt_bias, bufs["z"], out)
            graph.replay()  # same buffers: new inputs, new pages, new cursors
            plans[0].verified_layers.add(0)
        y_rf = rf.verify(0, plans[1], **{k: v.clone() for k, v in bufs.items()}, A=A, D=D, dt_bias=dt_bias)
        real = plans[0].cu_seqlens_host[5].item()
        err = rel(out[:real], y_rf[:real])
        assert err < OUT_TOL, f"graph step {step}: output error {err:.3g}"
        acc = [rng.choice([0, T, rng.randint(0, T)]) for _ in chosen]
        fi.commit(plans[0], acc)
        rf.commit(plans[1], acc)
        assert torch.equal(fi.cache.cursors, rf.cache.cursors)
        assert rel(fi.cache.layers[0]["checkpoint"], rf.cache.layers[0]["checkpoint"]) < STATE_TOL
    assert graph is not None


@pytest.fixture(params=["auto", "monolith"])
def graph_algorithm(request):
    return request.param


def test_native_scheme_matches_reference_native():
    pair = Pair(layout("native"), num_pages=1 + 8 * T, max_batch=12, seed=11)
    fi, rf, rng = pair.fi, pair.rf, pair.rng
    ids = [f"n{i}" for i in range(8)]
    for r in ids:
        pair.admit(r)
    for step in range(10):
        rows = rng.sample(ids, rng.randint(1, 8))
        dense = rng.random() < 0.5
        qs = T if dense else [rng.randint(1, T) for _ in rows]
        pad = rng.choice([None, len(rows) + 2])
        plans = [m.begin_step(rows, qs, pad_to=pad) for m in (fi, rf)]
        n = len(rows)
        real = plans[0].cu_seqlens_host[n].item()
        for layer in range(pair.layers):
            A, D, dt_bias = pair.params[layer]
            inp = pair.inputs(plans[0].total_tokens, with_z=rng.random() < 0.5)
            y_fi = fi.verify(layer, plans[0], **inp, A=A, D=D, dt_bias=dt_bias)
            y_rf = rf.verify(layer, plans[1], **inp, A=A, D=D, dt_bias=dt_bias)
            err = rel(y_fi[:real], y_rf[:real])
            assert err < OUT_TOL, f"native step {step} layer {layer}: output error {err:.3g}"
            err = rel(fi.cache.layers[layer]["state"], rf.cache.layers[layer]["state"])
            assert err < 1e-4, f"native step {step} layer {layer}: state error {err:.3g}"
            assert not fi.cache.layers[layer]["state"][0].any(), "the null page was written"
        acc = [rng.randint(1, qq) for qq in plans[0].num_tokens[:n]]
        for m, p in zip((fi, rf), plans):
            m.commit(p, acc)
        assert torch.equal(fi.cache.cursors, rf.cache.cursors)
    for r in ids:
        assert rel(fi.read_state(r, 0), rf.read_state(r, 0)) < 1e-4


def test_autotuned_dense_verify_matches_reference():
    """FlashInfer's autotuner on a private cache, then tuned dense calls on the real one."""
    lay = layout("replay", layers=1)
    pair = Pair(lay, max_batch=8, algorithm="auto", seed=5)
    t0 = time.time()
    pair.fi.backend.tune(lay, pair.dev, [8])
    print(f"tune([8]) took {time.time() - t0:.1f} s")
    fi, rf = pair.fi, pair.rf
    ids = [f"t{i}" for i in range(8)]
    for r in ids:
        pair.admit(r)
    A, D, dt_bias = pair.params[0]
    for step in range(6):
        plans = [m.begin_step(ids, T) for m in (fi, rf)]
        inp = pair.inputs(plans[0].total_tokens, with_z=False)
        y_fi = fi.verify(0, plans[0], **inp, A=A, D=D, dt_bias=dt_bias)
        y_rf = rf.verify(0, plans[1], **inp, A=A, D=D, dt_bias=dt_bias)
        assert rel(y_fi, y_rf) < OUT_TOL
        acc = [step % (T + 1)] * len(ids)
        fi.commit(plans[0], acc)
        rf.commit(plans[1], acc)
    assert rel(fi.cache.layers[0]["checkpoint"], rf.cache.layers[0]["checkpoint"]) < STATE_TOL


def _warm(scheme: str) -> float:
    """Build (JIT) and load the kernels the tests use; returns seconds. For a parallel prebuild."""
    t0 = time.time()
    lay = layout(scheme, layers=1)
    m = StateManager(lay, 1 + 2 * lay.pages_per_request, device=DEV, backend="flashinfer", max_batch=2)
    p = Pair.__new__(Pair)
    p.gen, p.dev = torch.Generator(device="cpu").manual_seed(0), DEV
    for r in ("a", "b"):
        m.admit(r)
    plan = m.begin_step(["a", "b"], T)
    A = -torch.ones(H, device=DEV)
    m.verify(0, plan, **p.inputs(plan.total_tokens, with_z=False), A=A, D=torch.ones(H, device=DEV),
             dt_bias=torch.zeros(H, device=DEV))
    torch.cuda.synchronize()
    dt = time.time() - t0
    print(f"warm {scheme}: {dt:.1f} s", flush=True)
    return dt


if __name__ == "__main__" and os.environ.get("SSMSTATE_WARM"):
    _warm(os.environ["SSMSTATE_WARM"])
