"""Kernels stay inside the page they serve, whatever the cursors say: a script for ``compute-sanitizer``.

Drives the Triton backend through the manager (conv, verify, commit from a device count tensor, materialize)
over a random schedule with random acceptance, at each batch size the launch heuristic distinguishes (1, 8, 64,
128, 256 at Nemotron-H geometry: H=128, P=64, N=128, G=8, bf16 inputs, fp32 state, T=4, W=16), on both verify
kernels (the TMA kernel with the heuristic's launch shape, and the portable kernel's `ldg` and `ldg_stream` launches)
and on the fused conv + verify kernel (``conv_verify``, kernel ``fused``). Before some steps it writes
out-of-range values straight into the cursor tensor of a few pages (negative and huge ``ring_start``,
``num_committed``, ``conv_shift``; ``pending`` between begin_step and commit). A twin manager runs the same
schedule with no corruption; after every step:

* pages outside the step are bit for bit as before it;
* every page never corrupted matches the twin (bit for bit expected; a difference beyond 1e-6 relative fails);
* a corrupted page that took part in a commit has its cursors back in range.

Under ``compute-sanitizer --tool memcheck`` any access outside an allocation is an error. On the GPU::

    compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu/sanitize_kernels.py

Without CUDA it runs under the Triton interpreter at a tiny size (``python tests/gpu/sanitize_kernels.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager  # noqa: E402
from ssmstate.backends.triton import TritonBackend  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402

BIG = 1 << 30
INT_MIN = -(1 << 31)
BAD_VALUES = (-1, -7, INT_MIN, BIG, 999)


class ShapeBackend(TritonBackend):
    """The Triton backend with one named verify launch shape (``ssmstate.ops.triton.override``) instead of the
    heuristic's choice: the portable kernel's ``ldg`` and ``ldg_stream`` launches."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape

    def verify(self, cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out):
        with ot.override(shape=self.shape):
            return super().verify(cache, layer, plan, x, dt, A, B, C, D, dt_bias, z, out)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-30))


def run(batch: int, kernel: str, args: argparse.Namespace, geom: Mamba2Geometry, spec: SpecConfig,
        dev: torch.device) -> dict[str, int]:
    layout = PageLayout.replay(geom, spec)
    n_req = batch + 2
    pages = n_req + 2  # the null page, every request, one page never handed out
    ms = [StateManager(layout, pages, device=dev, backend="triton", max_batch=batch) for _ in range(2)]
    if kernel not in ("tma", "fused"):
        for m in ms:
            m.backend = ShapeBackend(kernel)
    m, twin = ms
    gen = torch.Generator().manual_seed(args.seed * 1000 + batch)
    H, P, N, G = geom.heads_per_rank, geom.head_dim, geom.state_size, geom.groups_per_rank
    Dc, k, T, W, R = geom.conv_dim_per_rank, geom.conv_kernel, spec.num_tokens, spec.window, spec.ring_len
    act = geom.act_dtype

    def rnd(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=gen) * scale).to(dev, dtype)

    params = [dict(A=-(torch.rand(H, generator=gen) + 0.3).to(dev), D=rnd(H), dt_bias=rnd(H, scale=0.3),
                   w=rnd(Dc, k, scale=0.5), b=rnd(Dc, scale=0.1)) for _ in range(geom.num_layers)]
    ids = [f"r{i}" for i in range(n_req)]
    for rid in ids:
        S = [rnd(H, P, N, scale=0.5) for _ in range(geom.num_layers)]
        cw = [rnd(Dc, k - 1, dtype=geom.conv_state_dtype) for _ in range(geom.num_layers)]
        for mm in ms:
            mm.admit(rid)
            for layer in range(geom.num_layers):
                mm.write_state(rid, layer, S[layer], cw[layer])
    tainted: set[int] = set()
    stats = dict(steps=0, corrupted=0, verify_launches=0, bit_diffs=0)
    for step in range(args.steps):
        sub = [ids[i] for i in torch.randperm(n_req, generator=gen)[:batch].tolist()]
        qs = [T if torch.rand(1, generator=gen).item() < 0.6 else int(torch.randint(1, T + 1, (1,), generator=gen))
              for _ in sub]
        # corrupt a few pages' cursors behind the managers' backs (m only): before begin_step, so the row
        # cursors the step gathers hold the corrupted values too
        if step % 2 == 0:
            for rid in [sub[0]] + ([sub[-1]] if batch > 1 else []):
                page = m.page_of(rid)
                row = int(torch.randint(0, 4, (1,), generator=gen))
                row = 3 if row == 2 else row  # pending is overwritten by begin_step: corrupted after it below
                m.cache.cursors[row, page] = BAD_VALUES[int(torch.randint(0, len(BAD_VALUES), (1,), generator=gen))]
                tainted.add(page)
                stats["corrupted"] += 1
        idle = [p for p in range(pages) if p not in {m.page_of(r) for r in sub}]
        before = {(li, name): t[idle].clone() for li, layer in enumerate(m.cache.layers) for name, t in layer.items()}
        plans = [mm.begin_step(sub, qs) for mm in ms]
        if step % 3 == 1:  # a corrupted pending cursor reaches the commit
            page = m.page_of(sub[0])
            m.cache.pending[page] = BAD_VALUES[step % len(BAD_VALUES)]
            tainted.add(page)
            stats["corrupted"] += 1
        L = plans[0].total_tokens
        for layer, prm in enumerate(params):
            xBC = rnd(L, Dc, dtype=act)
            dt = rnd(L, H, scale=0.5) - 0.5
            z = rnd(L, H, P, dtype=act)
            for mm, plan in zip(ms, plans):
                if kernel == "fused":  # the fused conv + verify kernel, one launch per layer, at every batch
                    with ot.override(fused={"MAX_ROWS": 1 << 30}):
                        mm.conv_verify(layer, plan, xBC, dt, prm["A"], prm["w"], prm["b"], D=prm["D"],
                                       dt_bias=prm["dt_bias"], z=z)
                    continue
                xbc = mm.conv(layer, plan, xBC, prm["w"], prm["b"])
                x = xbc[:, : H * P].reshape(L, H, P)
                B = xbc[:, H * P: H * P + G * N].reshape(L, G, N)
                C = xbc[:, H * P + G * N:].reshape(L, G, N)
                mm.verify(layer, plan, x, dt, B, C, prm["A"], D=prm["D"], dt_bias=prm["dt_bias"], z=z)
            stats["verify_launches"] += 1  # on the corrupted manager (its twin ran as many)
        acc = torch.tensor([int(torch.randint(0, q + 1, (1,), generator=gen)) for q in qs], dtype=torch.int32)
        if step % 5 == 4:
            acc[0] = qs[0] + 1  # out of range: the whole step commits 0 on the device, error_flag set
        m.commit(plans[0], acc.to(dev))
        # a batch with a count out of range (here, or a corrupted pending read clamped below a count) commits 0
        # for every row: the twin then commits 0 too
        flagged = int(m.error_flag.item())
        m.error_flag.zero_()
        # row 0's count is out of range unless this step also corrupted its pending (step % 3 == 1), which the
        # kernel reads clamped to [0, T] and may then admit the count
        assert flagged or step % 5 != 4 or step % 3 == 1, f"step {step}: an out-of-range count was not flagged"
        # unflagged, row 0's count may still exceed its real q (admitted by a corrupted pending): the twin takes
        # it clamped to q, as row 0's page is tainted and left out of the comparison anyway
        twin_acc = torch.zeros_like(acc) if flagged else torch.minimum(acc, torch.tensor(qs, dtype=acc.dtype))
        twin.commit(plans[1], twin_acc.to(dev))
        twin.error_flag.zero_()
        if step % 4 == 3:
            for mm in ms:
                mm.materialize(sub[: max(1, batch // 4)])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        stats["steps"] += 1
        # 1. pages outside the step: untouched
        for (li, name), t in before.items():
            assert torch.equal(m.cache.layers[li][name][idle], t), f"step {step}: layer {li} {name} of an idle page"
        # 2. pages never corrupted: as the twin's
        keep = [p for p in range(pages) if p not in tainted]
        assert torch.equal(m.cache.cursors[:, keep], twin.cache.cursors[:, keep]), f"step {step}: cursors"
        for li, (la, lb) in enumerate(zip(m.cache.layers, twin.cache.layers)):
            for name in la:
                a, b = la[name][keep], lb[name][keep]
                if not torch.equal(a, b):
                    stats["bit_diffs"] += int((a != b).sum())
                    err = _rel(a, b)
                    assert err <= 1e-6, f"step {step}: layer {li} {name} of a clean page differs (rel {err:.3g})"
        # 3. the corrupted pages that took part in a commit: cursors back in range
        cur = m.cache.cursors.cpu()
        for rid in sub:
            p = m.page_of(rid)
            rs, c, q, s = (int(v) for v in cur[:, p])
            if p in tainted:
                assert 0 <= rs < R and 0 <= c <= W and q == 0 and 0 <= s <= T, (step, p, rs, c, q, s)
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu = torch.cuda.is_available()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 128, 256] if gpu else [1, 3])
    ap.add_argument("--kernels", nargs="+", default=["tma", "ldg", "ldg_stream", "fused"],
                    choices=["tma", "ldg", "ldg_stream", "fused"])
    ap.add_argument("--steps", type=int, default=6 if gpu else 4)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if gpu:
        dev = torch.device("cuda")
        geom = Mamba2Geometry(num_heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4,
                              num_layers=args.layers, state_dtype=torch.float32, act_dtype=torch.bfloat16)
        spec = SpecConfig(3, window=16)
    else:
        dev = torch.device("cpu")
        geom = Mamba2Geometry(num_heads=4, head_dim=16, state_size=16, n_groups=2, conv_kernel=4,
                              num_layers=args.layers, state_dtype=torch.float32, act_dtype=torch.float32)
        spec = SpecConfig(3, window=8)
    print(f"device {torch.cuda.get_device_name() if gpu else 'cpu (Triton interpreter)'}; H={geom.heads_per_rank} "
          f"P={geom.head_dim} N={geom.state_size} G={geom.groups_per_rank} T={spec.num_tokens} W={spec.window}")
    t0 = time.time()
    total = dict(steps=0, corrupted=0, verify_launches=0, bit_diffs=0)
    for batch in args.batches:
        for kernel in args.kernels:
            with ot.override(**({"shape": kernel} if kernel in ("ldg", "ldg_stream") else {})):
                cfg = ot.choose_launch(batch, geom.heads_per_rank, geom.head_dim, geom.state_size, spec.ring_len,
                                       spec.num_tokens, dev, G=geom.groups_per_rank, fused=kernel == "fused")
            stats = run(batch, kernel, args, geom, spec, dev)
            for key in total:
                total[key] += stats[key]
            print(f"batch {batch:4d} {kernel}: {stats}  launch {cfg}", flush=True)
    print(f"sanitize_kernels: OK: {total['steps']} steps, {total['verify_launches']} verify launches, "
          f"{total['corrupted']} corrupted cursors, every idle page bit-identical, every clean page as the twin's "
          f"({total['bit_diffs']} elements not bit-identical), {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
