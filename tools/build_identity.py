"""Dump, for every launch the verify heuristic picks, what the sm_90a build of it is, without a GPU.

For each (device class, batch, T, W, pdl, state dtype) the launches :func:`replay_verify` would make on the GPU
are captured on CPU tensors (the Nemotron-H layer of ``kernel_resources.py``: H=128, P=64, N=128, G=8, bf16 inputs,
row cursors as the manager passes them) and compiled through Triton's own ``ptxas`` for sm_90a. Each launch gets its
registers, stack, shared memory, warps, SASS instruction count and a hash of its SASS opcode sequence (operands and
symbol names left out), so two checkouts' dumps compare launch by launch: the same rows mean the same kernels.

Run: ``python tools/build_identity.py --out a.json`` in each checkout, then
``python tools/build_identity.py --compare a.json b.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernel_resources as kr  # noqa: E402

#: device classes: SMs and peak DRAM GB/s per SM (the H200 and the H100 80GB HBM3 as the driver reports them, and a
#: smaller card for the generic path)
DEVICES = {"h200": (132, 36.4), "h100": (132, 25.4), "generic": (108, 18.0)}
BATCHES = (1, 8, 32, 64, 128, 256, 1024)


def cases(quick: bool) -> list[dict]:
    out = []
    for dev, batch, T, W, pdl, state in itertools.product(
            ("h200", "h100"), BATCHES, (2, 4, 8), (16, 32), (False, True), ("float32", "bfloat16")):
        out.append(dict(device=dev, batch=batch, T=T, W=W, pdl=pdl, state=state))
    # the generic path and the LDG kernel (a window over 32 rows)
    for batch, T, W, state in itertools.product((1, 8, 64, 256), (4,), (16, 32, 64), ("float32", "bfloat16")):
        out.append(dict(device="generic", batch=batch, T=T, W=W, pdl=False, state=state))
    for batch, dev in itertools.product((1, 8, 64, 256), ("h200", "h100")):
        out.append(dict(device=dev, batch=batch, T=4, W=64, pdl=False, state="float32"))
    if quick:
        out = [c for c in out if c["batch"] in (1, 64, 256) and c["T"] == 4 and c["state"] == "float32"]
    return out


def _opcodes(cubin: bytes) -> list[str]:
    sass = kr.cuobjdump(cubin, "--dump-sass")
    return [m.group(1) for line in sass.splitlines()
            if (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]+)", line))]


def build(fn, args, kwargs) -> dict:
    k = kr.compile_launch(fn, args, kwargs)
    ops = _opcodes(k.asm["cubin"])
    row = {"num_warps": k.metadata.num_warps, "shared": k.metadata.shared, "instructions": len(ops),
           "sass_hash": hashlib.sha256("\n".join(ops).encode()).hexdigest()[:16]}
    row.update(kr.resources(k.asm["cubin"]))
    return row


def key(fn, args, kwargs) -> str:
    """What a compile depends on: the kernel's source, its constants and the arguments' specialization."""
    from triton.compiler import make_backend
    backend = make_backend(kr.TARGET)
    binder = kr.create_function_from_signature(fn.signature, fn.params, backend)
    _, specialization, options = binder(*args, **kwargs)
    const = {k: v for k, v in kwargs.items()}
    return hashlib.sha256(repr((fn.cache_key, specialization, sorted(const.items(), key=str), options)).encode()
                          ).hexdigest()[:16]


def dump(quick: bool) -> list[dict]:
    rows, built = [], {}
    for c in cases(quick):
        sms, gbps = DEVICES[c["device"]]
        launches = kr.capture(c["batch"], c["T"], c["W"], None, c["pdl"], sms=sms, gbps_per_sm=gbps,
                              state_dtype=c["state"])
        for j, (name, fn, (grid, args, kwargs)) in enumerate(launches):
            k = key(fn, args, kwargs)
            if k not in built:
                built[k] = build(fn, args, kwargs)
            rows.append({**c, "launch": j, "grid": list(grid), **built[k]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    ident = ("device", "batch", "T", "W", "pdl", "state", "launch")
    fields = ("grid", "num_warps", "shared", "registers", "stack", "local", "instructions", "sass_hash")
    bmap = {tuple(r[k] for k in ident): r for r in b}
    same = diff = 0
    for r in a:
        o = bmap.pop(tuple(r[k] for k in ident), None)
        if o is None:
            print("only in", a_path, {k: r[k] for k in ident})
            diff += 1
            continue
        d = {f: (r[f], o[f]) for f in fields if r[f] != o[f]}
        if d:
            print("differs", {k: r[k] for k in ident}, d)
            diff += 1
        else:
            same += 1
    for r in bmap.values():
        print("only in", b_path, {k: r[k] for k in ident})
        diff += 1
    print(f"{same} launches identical, {diff} differ or missing")
    return 1 if diff else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="batch 1, 64, 256 at T=4, fp32 state only")
    ap.add_argument("--compare", nargs=2)
    a = ap.parse_args()
    if a.compare:
        sys.exit(compare(*a.compare))
    rows = dump(a.quick)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
