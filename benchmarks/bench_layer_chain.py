"""A layer's conv + verify, chained over layers, with and without programmatic dependent launch (PDL), on one GPU.

``bench_verify.py`` times the verify kernel alone, each call waiting for the one before. In a model a layer's
verify follows its conv, whose outputs (x, B, C) it reads; the checkpoint it reads first does not depend on
the conv at all. Launched as a programmatic dependent (``replay_verify(pdl=True)``), the verify's programs
start while the conv runs, issue their page id, cursors and first checkpoint tile, and wait
(``griddepcontrol.wait``) only before the conv's outputs. This script measures what that buys, against
FlashInfer's ``checkpointing_ssu`` behind the same conv with and without its own ``enable_pdl`` (it waits
before loading x, B and C and triggers after its output store).

Per batch it times CUDA graphs of at least 16 layers (page sets cycled so every layer reads cold pages, as in
``bench_verify.py``), Nemotron-H geometry (H=128, P=64, N=128, G=8, conv kernel 4), fp32 state, bf16 inputs;
every layer is ``conv_update`` (ours, for every row) then the verify, whose x/B/C are views of the conv's
output. Chains:

* ``conv`` / ``conv_pdl``: the conv alone (what the pair costs beyond the verify);
* ``ours`` / ``ours_pdl``: conv then ``replay_verify`` (both launched with ``pdl`` or neither);
* ``fi_<algo>`` / ``fi_<algo>_pdl``: conv then FlashInfer (algorithm "auto" and "monolith"; ``enable_pdl``
  and the conv's ``pdl`` together);
* ``ours_verify`` / ``fi_<algo>_verify``: the verify alone, chained, as ``bench_verify.py`` times it;
* ``fused`` / ``fused_pdl`` (``--fused``): the layer as one launch, :func:`ssmstate.ops.triton.replay_conv_verify`,
  reading ``xBC`` and writing no conv output; ``fused_cfg<i>``: its ``--fused-configs`` launch overrides;
* ``ours_pdl_cfg<i>``: ``ours_pdl`` with the i-th ``--pdl-configs`` launch override (e.g. ``{"shape": "one_head"}``; see
  :func:`ssmstate.ops.triton.override`).

Reported per layer: the pair's µs, and the verify's share = pair - conv chain of the same PDL mode. Rows are
non-flush (c = min(W - T, W / 2)) and a mixed batch from the commit rule's steady state.

Run (repo root): ``python benchmarks/bench_layer_chain.py --out chain.json``. ``--cpu-smoke`` runs the
script end to end on CPU under the Triton interpreter at toy sizes (timings meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench_verify as bv  # noqa: E402
from progress import progress  # noqa: E402  (benchmarks/progress.py)
from ssmstate import Mamba2Geometry, PageLayout, SpecConfig  # noqa: E402
from ssmstate.layout import conv_spec  # noqa: E402

KW = 3  # conv kernel 4: 3 history columns


def log(*a):
    print(*a, flush=True)


def conv_buffers(pages: int, tokens: int, T: int):
    """Our conv's operands for a layer over ``pages`` pages and up to ``tokens`` window tokens (random, bf16
    activations): ``(conv_window, conv_shift, xBC, weight, bias, conv_out)``."""
    Dc = bv.H * bv.P + 2 * bv.G * bv.N
    conv_win = conv_spec(Dc, KW + T, torch.bfloat16).zeros(pages, bv.DEV).normal_()  # the served order
    conv_shift = torch.zeros(pages, dtype=torch.int32, device=bv.DEV)
    xBC = torch.randn(tokens, Dc, device=bv.DEV, dtype=torch.bfloat16)
    cw = torch.randn(Dc, KW + 1, device=bv.DEV) * 0.3
    cb = torch.randn(Dc, device=bv.DEV) * 0.1
    conv_out = torch.empty(tokens, Dc, device=bv.DEV, dtype=torch.bfloat16)
    return conv_win, conv_shift, xBC, cw, cb, conv_out


def xbc_views(co):
    """x (L, H, P), B and C (L, G, N): views of the conv's output ``co`` (L, conv dim), split as the model splits
    it, so the verify reads what the conv wrote."""
    H, P, N, G = bv.H, bv.P, bv.N, bv.G
    L = co.shape[0]
    return (co[:, : H * P].view(L, H, P), co[:, H * P: H * P + G * N].view(L, G, N),
            co[:, H * P + G * N:].view(L, G, N))


def bench(T: int, W: int, batches: list[int], fi, args, l2: int, pdl_configs: list[dict]) -> list[dict]:
    from ssmstate.ops import triton as trk
    tcv = trk

    H, P, N, G = bv.H, bv.P, bv.N, bv.G
    geom = Mamba2Geometry(num_heads=H, head_dim=P, state_size=N, n_groups=G, conv_kernel=KW + 1, num_layers=1,
                          state_dtype=torch.float32, act_dtype=torch.bfloat16)
    layout = PageLayout.replay(geom, SpecConfig(T - 1, window=W))
    Dc = H * P + 2 * G * N
    width = KW + T
    page_bytes = layout.layer_page_bytes + Dc * width * 2
    sets_for = {b: max(2, math.ceil(4 * l2 / (b * page_bytes))) for b in batches}
    pages = 1 + max(sets_for[b] * b for b in batches)
    pool = bv.Pool(layout, pages, max(batches), seed=T * 100 + W)
    conv_win, conv_shift, xBC, cw, cb, conv_out = conv_buffers(pages, max(batches) * T, T)
    log(f"\n== T={T} W={W}: {pages} pages x {page_bytes / 2**20:.2f} MiB (with the conv window)")
    c_nf = min(W - T, W // 2)
    rows = []
    for b in batches:
        nsets = sets_for[b]
        L = b * T
        cu, sets, rcs = pool.batch_sets(b, T, nsets)
        co = conv_out[:L]
        x, Bv, Cv = xbc_views(co)
        dt, out = pool.dt[:L], pool.out[:L]
        row = {"T": T, "W": W, "batch": b, "page_sets": nsets}

        def conv(j, pdl):
            return lambda: tcv.conv_update(conv_win, conv_shift, xBC[:L], cw, cb, sets[j], cu, co, pdl=pdl)

        def ours(j, pdl, cfg=None):
            def call():
                with trk.override(**(cfg or {})):
                    trk.replay_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, pool.A, Bv, Cv,
                                      sets[j], cu, W, out, D=pool.D, dt_bias=pool.dt_bias, row_cursors=rcs[j],
                                      pdl=pdl)
            return call

        counters = torch.zeros(pages, G, dtype=torch.int32, device=bv.DEV)

        def fused(j, pdl, cfg=None):  # conv + verify in one launch (replay_conv_verify), no conv output written
            def call():
                with trk.override(fused=cfg or {}):
                    trk.replay_conv_verify(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, conv_win,
                                           conv_shift, xBC[:L], dt, pool.A, cw, cb, sets[j], cu, W, out, D=pool.D,
                                           dt_bias=pool.dt_bias, counters=counters, pdl=pdl)
            return call

        def pair(f, g):
            def run():
                f()
                g()
            return run

        fi_call = fi_setup(fi, pool, layout, b, co, out) if fi is not None and W <= 16 else None
        mixed_cs, _ = bv.steady_state(T, W, b, seed=b)
        for scen, cs in (("nonflush", [c_nf] * b), ("mixed", mixed_cs)):
            pool.set_committed(sets, rcs, cs)
            r = {}
            for pdl in (False, True):
                sfx = "_pdl" if pdl else ""
                r[f"conv{sfx}"] = bv.time_calls([conv(j, pdl) for j in range(nsets)], args.reps)
                r[f"ours{sfx}"] = bv.time_calls([pair(conv(j, pdl), ours(j, pdl)) for j in range(nsets)], args.reps)
                if fi_call is not None:
                    for algo in ("auto", "monolith"):
                        try:
                            r[f"fi_{algo}{sfx}"] = bv.time_calls(
                                [pair(conv(j, pdl), fi_call(sets[j], algo, pdl)) for j in range(nsets)], args.reps)
                        except Exception as exc:  # keep ours when FlashInfer breaks
                            row[f"fi_{algo}{sfx}_error"] = repr(exc)[:300]
                            log(f"  flashinfer {algo} pdl={pdl} failed: {row[f'fi_{algo}{sfx}_error']}")
            for i, cfg in enumerate(pdl_configs):  # launch overrides for the PDL chain, against its default
                try:
                    r[f"ours_pdl_cfg{i}"] = bv.time_calls(
                        [pair(conv(j, True), ours(j, True, cfg)) for j in range(nsets)], args.reps)
                except Exception as exc:  # a key this batch's launch does not take
                    row[f"{scen}_ours_pdl_cfg{i}_error"] = repr(exc)[:200]
            if args.fused:
                for pdl in (False, True):
                    r["fused" + ("_pdl" if pdl else "")] = bv.time_calls([fused(j, pdl) for j in range(nsets)],
                                                                         args.reps)
                for i, cfg in enumerate(json.loads(args.fused_configs)):
                    r[f"fused_cfg{i}"] = bv.time_calls([fused(j, False, cfg) for j in range(nsets)], args.reps)
                row[f"{scen}_fused_speedup_vs_ours"] = r["ours"] / r["fused"]
                row[f"{scen}_fused_pdl_speedup_vs_ours_pdl"] = r["ours_pdl"] / r["fused_pdl"]
            r["ours_verify"] = bv.time_calls([ours(j, False) for j in range(nsets)], args.reps)
            if fi_call is not None:
                for algo in ("auto", "monolith"):
                    if f"fi_{algo}" in r:
                        r[f"fi_{algo}_verify"] = bv.time_calls([fi_call(ids, algo, False) for ids in sets], args.reps)
            for k, v in r.items():
                row[f"{scen}_{k}_us"] = v
            # the verify's share of a layer: the pair less the conv chain of the same launch mode
            for k in list(r):
                if k.startswith(("ours", "fi_", "fused")) and not k.endswith("_verify"):
                    row[f"{scen}_{k}_verify_share_us"] = r[k] - r["conv_pdl" if "_pdl" in k else "conv"]
            fis = {k: v for k, v in r.items() if k.startswith("fi_") and not k.endswith("_verify")}
            if fis:
                best_plain = min(v for k, v in fis.items() if not k.endswith("_pdl"))
                best_pdl = min((v for k, v in fis.items() if k.endswith("_pdl")), default=None)
                row[f"{scen}_fi_best_us"] = best_plain
                row[f"{scen}_speedup_vs_fi_best"] = best_plain / r["ours"]
                if best_pdl is not None:
                    row[f"{scen}_fi_best_pdl_us"] = best_pdl
                    row[f"{scen}_speedup_pdl_vs_fi_best_pdl"] = best_pdl / r["ours_pdl"]
            row[f"{scen}_pdl_gain_us"] = r["ours"] - r["ours_pdl"]
        log("  " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
        rows.append(row)
    return rows


def fi_setup(fi, pool, layout: PageLayout, b: int, co, out):
    """FlashInfer's verify on the pool's pages, reading x/B/C from the conv's output (views, as ours)."""
    from flashinfer.mamba import allocate_checkpointing_ssu_scratch, checkpointing_ssu

    H, P, N, G, DEV = bv.H, bv.P, bv.N, bv.G, bv.DEV
    T, W = layout.spec.num_tokens, layout.spec.window
    L = b * T
    act = layout.geometry.act_dtype
    co4 = co.view(b, T, -1)
    x = co4[:, :, : H * P].view(b, T, H, P)
    Bm = co4[:, :, H * P: H * P + G * N].view(b, T, G, N)
    Cm = co4[:, :, H * P + G * N:].view(b, T, G, N)
    dt = pool.dt[:L].view(b, T, H, 1).expand(b, T, H, P)
    o = out.view(b, T, H, P)
    A = pool.A[:, None, None].expand(H, P, N)
    D = pool.D.to(act)[:, None].expand(H, P)
    dtb = pool.dt_bias.to(act)[:, None].expand(H, P)
    scratch = allocate_checkpointing_ssu_scratch(b, H, T, W, act, torch.device(DEV))

    def call(ids, algo, pdl):
        return lambda: checkpointing_ssu(pool.ck, pool.xr, pool.Br, pool.dtr, pool.rs, pool.nc, x, dt, A, Bm, Cm, o,
                                         D=D, dt_bias=dtb, dt_softplus=True, state_batch_indices=ids, pad_slot_id=0,
                                         cb_scaled=scratch[0], cumAdt_vec=scratch[1], cb_old=scratch[2],
                                         algorithm=algo, enable_pdl=pdl)
    return call


def print_table(rows: list[dict], have_fi: bool) -> None:
    log("\nµs per layer (conv + verify); share = pair - conv chain of the same launch mode")
    for scen in ("nonflush", "mixed"):
        log(f"\n{scen}:")
        hdr = f"{'T':>2} {'W':>3} {'batch':>5} | {'conv':>6} {'conv+pdl':>8} | {'ours':>7} {'ours+pdl':>8} " \
              f"{'share':>6} {'share+pdl':>9} {'verify':>7}"
        if have_fi:
            hdr += f" | {'FI best':>7} {'FI+pdl':>7} {'share':>6} {'share+pdl':>9} | {'ours/FI':>7} {'pdl/pdl':>7}"
        log(hdr)
        for r in rows:
            g = lambda k: r.get(f"{scen}_{k}")  # noqa: E731
            line = (f"{r['T']:>2} {r['W']:>3} {r['batch']:>5} | {g('conv_us'):6.2f} {g('conv_pdl_us'):8.2f} | "
                    f"{g('ours_us'):7.2f} {g('ours_pdl_us'):8.2f} {g('ours_verify_share_us'):6.2f} "
                    f"{g('ours_pdl_verify_share_us'):9.2f} {g('ours_verify_us'):7.2f}")
            if have_fi and g("fi_best_us") is not None:
                fb, fp = g("fi_best_us"), g("fi_best_pdl_us")
                fb_share = fb - g("conv_us")
                fp_share = (fp - g("conv_pdl_us")) if fp is not None else float("nan")
                line += (f" | {fb:7.2f} {fp if fp is not None else float('nan'):7.2f} {fb_share:6.2f} "
                         f"{fp_share:9.2f} | {g('speedup_vs_fi_best'):7.2f} "
                         f"{g('speedup_pdl_vs_fi_best_pdl') or float('nan'):7.2f}")
            log(line)
    if any("nonflush_fused_us" in r for r in rows):
        log("\nfused conv + verify (one launch per layer), µs per layer, against ours (conv + verify launches)")
        for scen in ("nonflush", "mixed"):
            log(f"{scen}:\n{'T':>2} {'W':>3} {'batch':>5} | {'fused':>7} {'fused+pdl':>9} | {'ours':>7} "
                f"{'ours+pdl':>8} | {'x':>5} {'x pdl':>5}")
            for r in rows:
                g = lambda k: r.get(f"{scen}_{k}")  # noqa: E731
                log(f"{r['T']:>2} {r['W']:>3} {r['batch']:>5} | {g('fused_us'):7.2f} {g('fused_pdl_us'):9.2f} | "
                    f"{g('ours_us'):7.2f} {g('ours_pdl_us'):8.2f} | {g('fused_speedup_vs_ours'):5.2f} "
                    f"{g('fused_pdl_speedup_vs_ours_pdl'):5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="chain.json")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--configs", default="4:16", help="T:W pairs")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--pdl-configs", default="[]",
                    help="JSON list of launch overrides also timed in the PDL chain (ours_pdl_cfg<i>)")
    ap.add_argument("--fused", action="store_true",
                    help="also time the fused conv + verify kernel (fused, fused_pdl: one launch per layer)")
    ap.add_argument("--fused-configs", default="[]",
                    help="JSON list of fused launch overrides (override(fused=...)) timed as fused_cfg<i>")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run end to end on CPU under TRITON_INTERPRET=1 at toy sizes (timings meaningless)")
    args = ap.parse_args()
    t0 = time.time()
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        bv.DEV, bv.SMOKE, bv.H, bv.P, bv.N, bv.G = "cpu", True, 4, 16, 16, 2
        args.no_flashinfer = True
    elif not torch.cuda.is_available():
        sys.exit("bench_layer_chain.py needs a CUDA GPU")
    fi, fi_version = bv.load_flashinfer(args.no_flashinfer)
    import triton
    if bv.SMOKE:
        name, l2 = "cpu (Triton interpreter smoke run)", 64 * 2 ** 10
    else:
        props = torch.cuda.get_device_properties(0)
        name = props.name
        l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20) or 50 * 2 ** 20
    env = {"gpu": name, "l2_bytes": l2, "torch": torch.__version__, "triton": triton.__version__,
           "flashinfer": fi_version, "python": platform.python_version(), "command": " ".join(sys.argv)}
    log(json.dumps(env))
    batches = [int(b) for b in args.batches.split(",")]
    pdl_configs = json.loads(args.pdl_configs)
    env["pdl_configs"] = pdl_configs
    rows: list[dict] = []
    pairs = args.configs.split(",")
    bar = progress(len(pairs) * len(batches), "bench_layer_chain (T:W pair x batch)")
    for pair in pairs:
        T, W = (int(v) for v in pair.split(":"))
        rows += bench(T, W, batches, fi, args, l2, pdl_configs)
        bar.update(len(batches))
        with open(args.out, "w") as fh:  # after every (T, W): a run cut short still leaves its results
            json.dump({"env": env, "geometry": {"H": bv.H, "P": bv.P, "N": bv.N, "G": bv.G, "conv_kernel": KW + 1,
                                                "state": "float32", "act": "bfloat16"},
                       "rows": rows, "seconds": time.time() - t0}, fh, indent=1)
    bar.close()
    print_table(rows, fi is not None)
    log(f"wrote {args.out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
