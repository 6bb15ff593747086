"""Launch selection for the verify kernels: named launch shapes, tuned values as data, an override for tests.

The shapes and thresholds live in ``launch_table.json`` (each shape with one line of why); :func:`choose_launch`
picks one from the grid size, the geometry and the device class (SMs, DRAM bandwidth per SM). Nothing is
autotuned: the interpreter cannot run an autotuner, and the choice must be the same in and out of a CUDA graph.

:func:`override` is the one way to ask for another launch (benchmarks, tests, kernel studies): a named shape and
a few fields, or another device class (a GPU's launches chosen, and captured, on a machine without one).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
import triton

from ssmstate.errors import ConfigError
from ssmstate.ops.triton.common import arch, compiled, dram_gbps_per_sm, num_sms, pow2

#: the fields an override may set (besides ``shape``, a name in the table), and those of one kernel only
OVERRIDE_KEYS = ("BLOCK_P", "BLOCK_S", "FOLD_N", "HEADS", "PROGS", "KSPLIT", "TMA_STORE", "LATE", "HPP", "NC",
                 "maxnreg")
TMA_ONLY_KEYS = frozenset({"HEADS", "PROGS", "KSPLIT", "TMA_STORE", "LATE"})
#: the override keys that switch a launch field on or off (0 or 1)
FLAG_KEYS = ("KSPLIT", "TMA_STORE", "LATE")
LDG_ONLY_KEYS = frozenset({"HPP", "NC"})


@functools.lru_cache(maxsize=None)
def table() -> dict[str, Any]:
    """The tuned values: ``thresholds`` and ``shapes`` (``launch_table.json``)."""
    return json.loads((Path(__file__).with_name("launch_table.json")).read_text())


def _limit(name: str) -> Any:
    return table()["thresholds"][name]


@attrs.frozen
class DeviceClass:
    """What the launch choice reads of a device: compiled for a GPU (else the interpreter), its SMs, its peak
    DRAM bandwidth per SM in GB/s (0.0: not reported), and its compute capability (major * 10 + minor)."""

    compiled: bool
    sms: int = 1
    gbps_per_sm: float = 0.0
    arch: int = 90

    @property
    def hopper(self) -> bool:
        """The TMA and per-warp kernels can run: compute capability 9.0 or later (TMA, mbarriers, the elected
        thread), or the interpreter, which emulates the TMA kernel's copies."""
        return not self.compiled or self.arch >= 90

    @property
    def pdl(self) -> bool:
        """Launches can be programmatic dependents (``griddepcontrol``: compute capability 9.0 or later)."""
        return self.compiled and self.arch >= 90

    @property
    def lean(self) -> bool:
        """Less DRAM bandwidth per SM than ``lean_gbps_per_sm`` (such as the H100 80GB HBM3's 25.4)."""
        return 0.0 < self.gbps_per_sm < _limit("lean_gbps_per_sm")


@attrs.frozen
class Launch:
    """One verify launch: which kernel, and how its programs are shaped (see the shapes in ``launch_table.json``)."""

    shape: str
    kernel: str  # "tma", "ldg" or "warp"
    block_p: int  # head-dim rows per program
    fold_n: int  # N columns per chunk of a flush row's fold (N: the whole tile)
    maxnreg: int = 0  # register cap (0: none; GPU only)
    early: bool = False  # TMA, one head per program: its gathers and tile copy issued beside B's rows
    late: bool = False  # early: the loaded operands reach shared memory only once every load and the copy are out
    l2pf: int = 0  # TMA: L2 prefetches at the start, 1 the first tile, 2 also the rings
    pf_heads: int = 0  # TMA: each head-loop iteration prefetches the next head's tile into L2
    heads: int = 1  # TMA: heads of one group per program (> 1: a 2-stage software pipeline)
    split: bool = False  # TMA: non-flush and flush rows in two persistent streamed launches
    progs: int = 3  # split: programs per SM of the non-flush launch
    ksplit: bool = False  # TMA: non-flush rows take a pow2(W)-row sequence tile
    tma_store: bool = False  # TMA: a whole-tile fold stores the new checkpoint by one TMA bulk copy
    hpp: int = 1  # LDG: heads of one group per program
    nc: int = 0  # LDG: 0 the whole tile, else S0 Cᵀ streamed in NC-column chunks
    block_s: int = 16  # the outputs' tile is pow2(T) tokens wide, at least this (8: products 8 columns wide)


@attrs.frozen
class _Override:
    device: DeviceClass | None
    launch: dict[str, Any]
    fused: dict[str, int] = attrs.field(factory=dict)
    conv: dict[str, int] = attrs.field(factory=dict)


_OVERRIDE: contextvars.ContextVar[_Override | None] = contextvars.ContextVar("ssmstate_launch_override", default=None)


@contextlib.contextmanager
def override(device: DeviceClass | None = None, fused: dict[str, int] | None = None,
             conv: dict[str, int] | None = None, **launch: Any) -> Iterator[None]:
    """Within the block, verify launches use ``launch`` and/or the launch choice sees ``device``.

    ``launch``: ``shape`` (a name in the table: that shape instead of the heuristic's choice) and any of
    :data:`OVERRIDE_KEYS`, which replace the chosen shape's fields. ``device``: the device class the choice and the
    launch arguments assume (e.g. ``DeviceClass(compiled=True, sms=132, gbps_per_sm=25.4)`` to capture an H100's
    launches on CPU tensors). ``fused``: fields of the fused conv + verify launch (:data:`FUSED_KEYS`); ``conv``:
    of the conv update's (:data:`CONV_KEYS`). For benchmarks and tests; results agree to fp32/tf32 rounding across
    launches. Inside another override's block, the fields this one leaves out keep the enclosing values.
    """
    _check_fused_override(fused or {})
    _check_conv_override(conv or {})
    unknown = set(launch) - {"shape", *OVERRIDE_KEYS}
    if unknown:
        raise ConfigError(f"unknown launch override keys {sorted(unknown)}; known: shape, {', '.join(OVERRIDE_KEYS)}")
    if "shape" in launch and launch["shape"] not in table()["shapes"]:
        raise ConfigError(f"unknown launch shape {launch['shape']!r}; known: {sorted(table()['shapes'])}")
    for key in OVERRIDE_KEYS:
        if key in launch and (isinstance(launch[key], bool) or not isinstance(launch[key], int)):
            raise ConfigError(f"override {key} must be an int, got {launch[key]!r}")
    for key in FLAG_KEYS:
        if launch.get(key, 0) not in (0, 1):
            raise ConfigError(f"override {key} must be 0 or 1, got {launch[key]!r}")
    outer = _OVERRIDE.get()  # a nested override keeps the enclosing one's fields it does not set
    if outer is not None:
        device = device if device is not None else outer.device
        launch = {**outer.launch, **launch}
        fused, conv = {**outer.fused, **(fused or {})}, {**outer.conv, **(conv or {})}
    token = _OVERRIDE.set(_Override(device, dict(launch), dict(fused or {}), dict(conv or {})))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def device_class(device: torch.device) -> DeviceClass:
    """The device class of ``device``, or the one an :func:`override` names."""
    ov = _OVERRIDE.get()
    if ov is not None and ov.device is not None:
        return ov.device
    if not compiled(device):
        return DeviceClass(compiled=False)
    return DeviceClass(compiled=True, sms=num_sms(device), gbps_per_sm=dram_gbps_per_sm(device), arch=arch(device))


def tma_block_p(P: int, N: int, dev: DeviceClass) -> int:
    """Head-dim rows per program of the TMA kernel for this geometry, or 0 where it does not apply.

    One warpgroup's tensor-core tile is 64 rows (so P must be a multiple of 64 on the GPU); the interpreter takes
    any power-of-two tile >= 16 that divides P. The TMA box holds N whole: a power of two in [16, 256]. A GPU
    before compute capability 9.0 has no TMA.
    """
    if N & (N - 1) or not 16 <= N <= 256 or not dev.hopper:
        return 0
    if dev.compiled:
        return 64 if P % 64 == 0 else 0
    return next((b for b in (64, 32, 16) if P % b == 0), 0)


def tma_heads(H: int, G: int, cap: int = 16) -> int:
    """Heads per program of a pipelined TMA launch: the largest power of two <= ``cap`` dividing H / G."""
    hpg = H // max(G, 1)
    heads = 1
    while heads * 2 <= cap and hpg % (heads * 2) == 0:
        heads *= 2
    return heads


def ldg_block_p(rows: int, H: int, P: int, dev: DeviceClass) -> int:
    """Head-dim rows per program of the LDG kernel (and materialize): the largest power-of-two tile <= 64 dividing
    P (tails masked), halved while the grid is under ``ldg_split_p_programs_per_sm``; the interpreter takes P
    whole (up to 128)."""
    if not dev.compiled:
        return min(pow2(P), 128)
    block = next((b for b in (64, 32, 16) if P % b == 0), min(64, pow2(P)))
    while rows * H * -(-P // block) < _limit("ldg_split_p_programs_per_sm") * dev.sms and block > 16 \
            and P % (block // 2) == 0:
        block //= 2
    return block


def named_launch(shape: str, *, block_p: int, N: int, long_ring: bool, hpp: int = 1) -> Launch:
    """The table's ``shape`` as a :class:`Launch` for this geometry, with the shape's ``long_ring`` fields on a ring
    over 32 rows."""
    spec = dict(table()["shapes"][shape])
    if long_ring:
        spec.update(spec.get("long_ring", {}))
    fold_n = spec.get("FOLD_N", 32) or pow2(N)
    return Launch(shape=shape, kernel=spec["kernel"], block_p=block_p, fold_n=fold_n,
                  maxnreg=spec.get("maxnreg", 0), early=bool(spec.get("EARLY", 0)), late=bool(spec.get("LATE", 0)),
                  l2pf=spec.get("L2PF", 0),
                  pf_heads=spec.get("PFHEADS", 0), heads=spec.get("HEADS", 1), split=bool(spec.get("SPLIT", 0)),
                  progs=spec.get("PROGS", 3), ksplit=bool(spec.get("KSPLIT", 0)),
                  tma_store=bool(spec.get("TMA_STORE", 0)), hpp=hpp, nc=spec.get("NC", 0),
                  block_s=spec.get("BLOCK_S", 16))


def heuristic_shape(rows: int, H: int, P: int, N: int, R: int, T: int, dev: DeviceClass, G: int,
                    state_size: int, tma_ok: bool = True, fused: bool = False, warp_ok: bool = False) -> str:
    """The shape :func:`choose_launch` takes without an override (the reasons are the table's ``why`` lines);
    ``tma_ok``: the checkpoint tensor can be read by TMA (contiguous, 16-byte aligned); ``fused``: for the fused
    conv + verify layer, which takes the latency launch up to ``fused.max_programs_per_sm``; ``warp_ok``: the
    per-warp kernel takes the call (:func:`ssmstate.ops.triton.verify_warp.warp_supported`)."""
    seq_ok = pow2(R - T) <= _limit("tma_max_seq_rows")
    block_tma = tma_block_p(P, N, dev) if tma_ok else 0
    if not block_tma or not (seq_ok or not dev.compiled):
        programs = rows * H * -(-P // ldg_block_p(rows, H, P, dev))
        return "ldg_stream" if dev.compiled and programs >= _limit("ldg_stream_programs_per_sm") * dev.sms else "ldg"
    if not dev.compiled:
        return "base"
    long_ring = pow2(R) > _limit("tma_max_seq_rows")
    programs = rows * H * (P // block_tma)
    sms = dev.sms
    if state_size == 1 and not long_ring:
        return quant_entry(rows, programs, sms, tma_heads(H, G))["shape"]
    if warp_ok and not fused and dev.lean:
        return "warp"
    pipelined = (tma_heads(H, G) == _limit("pipelined_heads")
                 and block_tma * N * state_size == _limit("pipelined_tile_bytes"))
    long_grid = programs // _limit("pipelined_heads") >= _limit("pipelined_group_programs_per_sm") * sms
    many = programs >= _limit("split_heads_per_sm") * sms
    if programs <= sms or (fused and _fused_fits(programs, sms)):
        return "latency"
    if pipelined and many and rows <= _limit("split_max_rows") and (long_ring or not dev.lean):
        return "split"
    if pipelined and not long_ring and long_grid:
        return "pipelined"
    if long_ring:
        return "one_head_long_ring"
    return "one_head_wide" if dev.lean and programs <= _limit("one_head_wide_programs_per_sm") * sms else "one_head"


def quant_entry(rows: int, programs: int, sms: int, heads: int) -> dict[str, Any]:
    """The launch of an 8-bit checkpoint (a quarter of fp32's bytes per tile): the first of the table's
    ``quant_shapes`` whose ``max_programs_per_sm`` (one program per head and P tile; null: no bound) the grid is
    within and that this geometry can take (a pipelined launch needs 16 heads per group, a split one at most
    ``split_max_rows`` rows): its ``shape`` and the ``fields`` that replace the shape's own."""
    for entry in table()["quant_shapes"]:
        bound = entry["max_programs_per_sm"]
        if bound is not None and programs > bound * sms:
            continue
        name = entry["shape"]
        if (name == "pipelined" and heads != _limit("pipelined_heads")) or (
                name.startswith("split") and rows > _limit("split_max_rows")):
            continue
        return entry
    return {"shape": "one_head"}


def choose_launch(rows: int, H: int, P: int, N: int, R: int, T: int, device: torch.device, G: int = 1,
                  state_size: int = 4, tma_ok: bool = True, fused: bool = False, warp_ok: bool = False) -> Launch:
    """The verify launch for ``rows`` rows of this geometry on ``device`` (``state_size``: bytes per checkpoint
    element; ``tma_ok``, ``fused``, ``warp_ok``: as in :func:`heuristic_shape`), with any :func:`override`
    applied."""
    dev = device_class(device)
    ov = _OVERRIDE.get()
    fields = dict(ov.launch) if ov is not None else {}
    shape = fields.pop("shape", None)
    if shape is None:
        shape = heuristic_shape(rows, H, P, N, R, T, dev, G, state_size, tma_ok, fused, warp_ok)
        block = tma_block_p(P, N, dev)
        if state_size == 1 and dev.compiled and block and table()["shapes"][shape]["kernel"] == "tma" \
                and pow2(R) <= _limit("tma_max_seq_rows"):  # an 8-bit launch's own fields, under the override's
            fields = {**quant_entry(rows, rows * H * (P // block), dev.sms, tma_heads(H, G)).get("fields", {}),
                      **fields}
    kernel = table()["shapes"][shape]["kernel"]
    if kernel == "warp":  # one (row, head) per program, 4 warps of 16 rows: only a register cap to choose
        foreign = sorted(set(fields) - {"maxnreg"})
    else:
        foreign = sorted(set(fields) & (LDG_ONLY_KEYS if kernel == "tma" else TMA_ONLY_KEYS))
    if foreign:
        raise ConfigError(f"override keys {foreign} do not apply to the {kernel.upper()} kernel (shape {shape!r})")
    hpg = H // max(G, 1)
    if kernel == "warp":
        launch = named_launch(shape, block_p=P, N=N, long_ring=False)
    elif kernel == "tma":
        launch = named_launch(shape, block_p=tma_block_p(P, N, dev) or 64, N=N,
                              long_ring=pow2(R) > _limit("tma_max_seq_rows"))
    else:
        launch = named_launch(shape, block_p=ldg_block_p(rows, H, P, dev), N=N, long_ring=False,
                              hpp=1 if dev.compiled else hpg)
        if not dev.compiled:  # the interpreter folds whole tiles
            launch = attrs.evolve(launch, fold_n=pow2(N))
        elif pow2(R) <= _limit("tma_max_seq_rows"):  # a 64-row sequence tile (W = 32) spills under this cap
            launch = attrs.evolve(launch, maxnreg=80)
    # every override key, lower-cased, names its Launch field
    return attrs.evolve(launch, **{k.lower(): bool(v) if k in FLAG_KEYS else v for k, v in fields.items()})


def pdl_tile(launch: Launch, programs: int, sms: int) -> int:
    """With ``pdl=True``, what of the checkpoint goes out before the wait: 2 the first tile's TMA copy (one head per
    program, up to ``pdl_tile_copy_programs_per_sm``), 1 its read into L2 (from ``pdl_tile_l2_programs_per_sm``),
    else 0."""
    if not launch.early:
        return 0
    if programs <= _limit("pdl_tile_copy_programs_per_sm") * sms:
        return 2
    return 1 if programs >= _limit("pdl_tile_l2_programs_per_sm") * sms else 0


def check_launch(launch: Launch, *, H: int, G: int, N: int, R: int, rows: int, dev: DeviceClass) -> None:
    """Raise :class:`ConfigError` for a launch these kernels cannot run correctly (an override's fields)."""
    hpg = H // max(G, 1)
    fold_n = launch.fold_n
    if fold_n < 1 or fold_n & (fold_n - 1) or (dev.compiled and fold_n < 16):
        raise ConfigError(f"FOLD_N must be a power of two (>= 16 on the GPU), got {fold_n}")
    if launch.block_p < 1 or launch.block_p & (launch.block_p - 1):
        raise ConfigError(f"BLOCK_P must be a power of two, got {launch.block_p}")
    if launch.block_s not in (8, 16):
        raise ConfigError(f"BLOCK_S must be 8 or 16 (the outputs' tile's least width), got {launch.block_s}")
    if launch.kernel == "ldg":
        _check_ldg(launch, hpg, R, dev)
    elif launch.kernel == "tma":
        _check_tma(launch, hpg, N, R, rows)


def _check_ldg(launch: Launch, hpg: int, R: int, dev: DeviceClass) -> None:
    if dev.compiled and launch.hpp != 1:
        raise ConfigError(f"HPP {launch.hpp}: several heads per program run in the interpreter only (one head per "
                          f"program on the GPU)")
    if launch.nc < 0 or launch.nc & (launch.nc - 1):
        raise ConfigError(f"NC must be 0 or a power of two, got {launch.nc}")
    if dev.compiled and launch.maxnreg and launch.nc == 0 and pow2(R) > 32:
        raise ConfigError("maxnreg with the whole-tile LDG kernel and a ring of more than 32 rows built a faulting "
                          "kernel (misaligned address); drop maxnreg or stream the tile (NC > 0)")


def _check_tma(launch: Launch, hpg: int, N: int, R: int, rows: int) -> None:
    if launch.heads < 1 or hpg % launch.heads:
        raise ConfigError(f"HEADS must divide the {hpg} heads per group, got {launch.heads}")
    if launch.progs < 1:
        raise ConfigError(f"PROGS must be >= 1, got {launch.progs}")
    if launch.split and rows > _limit("split_max_rows"):
        raise ConfigError(f"the split launches rank the rows in registers: at most {_limit('split_max_rows')} rows, "
                          f"got {rows}")
    if launch.tma_store and not launch.split and launch.fold_n < N:
        raise ConfigError(f"TMA_STORE needs a launch that folds whole tiles (split, or FOLD_N >= N={N}), got "
                          f"FOLD_N={launch.fold_n}")
    min_regs = _limit("long_ring_min_regs")
    if pow2(R) > 32 and 0 < launch.maxnreg < min_regs and not (launch.split and launch.ksplit):
        # ptxas (Triton 3.6's) built one such launch at maxnreg 104 into a kernel whose shared-memory store faults,
        # from PTX byte-identical to the correct maxnreg-128 build but for the cap
        raise ConfigError(f"maxnreg {launch.maxnreg} is below {min_regs} on a ring of {R} rows (a {pow2(R)}-row "
                          f"sequence tile in the capped launch): use maxnreg >= {min_regs} or 0 (uncapped)")


# -- the fused conv + verify kernel ----------------------------------------------------------

#: the fields ``override(fused=...)`` may set
FUSED_KEYS = ("BLOCK_P", "FOLD_N", "num_warps", "maxnreg", "HPP", "MAX_ROWS", "TMA", "GATHER")


@attrs.frozen
class FusedLaunch:
    """One fused conv + verify launch (``launch_table.json``'s ``fused``)."""

    block_p: int  # head-dim rows per program
    fold_n: int  # N columns per chunk of a flush row's fold
    num_warps: int
    hpp: int = 1  # heads of one group per program (the interpreter's: fewer, longer programs)
    maxnreg: int = 0  # register cap (0: none; GPU only)


def _check_fused_override(fields: dict[str, int]) -> None:
    unknown = set(fields) - set(FUSED_KEYS)
    if unknown:
        raise ConfigError(f"unknown fused override keys {sorted(unknown)}; known: {', '.join(FUSED_KEYS)}")
    for key, v in fields.items():
        flag = key in ("TMA", "GATHER")
        pow2_key = key not in ("maxnreg", "MAX_ROWS") and not flag
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (pow2_key and (v < 1 or v & (v - 1))) \
                or (flag and v > 1):
            raise ConfigError(f"fused override {key} must be a power of two (maxnreg, MAX_ROWS: an int >= 0; TMA, "
                              f"GATHER: 0 or 1), got {v!r}")


def fused_takes(rows: int, H: int, P: int, N: int, device: torch.device) -> bool:
    """Whether the "triton" backend's ``conv_verify`` runs a step of ``rows`` rows in the fused kernel rather than its
    conv and verify launches: on a GPU, where the TMA kernel's grid (one program per head and P tile) has at most
    the table's ``fused.max_programs_per_sm`` programs per SM, which the fused layer runs in the latency launch;
    with an :func:`override`'s ``MAX_ROWS``, up to that many rows on any device."""
    ov = _OVERRIDE.get()
    if ov is not None and "MAX_ROWS" in ov.fused:
        return rows <= ov.fused["MAX_ROWS"]
    dev = device_class(device)
    block = tma_block_p(P, N, dev)
    return dev.compiled and block > 0 and _fused_fits(rows * H * (P // block), dev.sms)


def _fused_fits(programs: int, sms: int) -> bool:
    """Whether a TMA grid of ``programs`` is small enough for the fused layer (``fused.max_programs_per_sm``)."""
    return programs <= table()["fused"]["max_programs_per_sm"] * sms


def fused_tma() -> bool:
    """Whether the fused layer takes the TMA verify kernel where that kernel takes the geometry, or the portable
    fused kernel everywhere: the table's ``fused.tma``, or an :func:`override`'s ``TMA``."""
    ov = _OVERRIDE.get()
    if ov is not None and "TMA" in ov.fused:
        return bool(ov.fused["TMA"])
    return bool(table()["fused"]["tma"])


def fused_gather() -> bool:
    """Whether the fused layer on the TMA kernel puts its conv outputs into the sequence rows by ``tl.gather``
    (Triton older than the table's ``fused.gather_before_triton``) or by selects in the loads' layout; an
    :func:`override`'s ``GATHER`` names either."""
    ov = _OVERRIDE.get()
    if ov is not None and "GATHER" in ov.fused:
        return bool(ov.fused["GATHER"])
    return triton_version() < _version(table()["fused"]["gather_before_triton"])


def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor)."""
    return _version(triton.__version__)


@functools.lru_cache(maxsize=None)  # read on every fused launch: parsed once per version string
def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()  # "3.7.1", "3.10.0rc1", "3.8+git1234"
    return int(major), int(minor)


def fused_launch(rows: int, H: int, P: int, N: int, G: int, dev: DeviceClass) -> FusedLaunch:
    """The fused kernel's launch for ``rows`` rows of this geometry, with any :func:`override` of it applied.

    On the GPU one head per program, ``BLOCK_P`` head-dim rows, halved (down to ``min_block_p``) while the grid has
    fewer than ``split_p_programs_per_sm`` programs per SM; the interpreter takes a group's heads and P whole."""
    spec = table()["fused"]
    if dev.compiled:
        block = min(spec["BLOCK_P"], pow2(P))
        while rows * H * -(-P // block) < spec["split_p_programs_per_sm"] * dev.sms and block > spec["min_block_p"]:
            block //= 2
        launch = FusedLaunch(block_p=block, fold_n=spec["FOLD_N"], num_warps=spec["num_warps"],
                             maxnreg=spec.get("maxnreg", 0))
    else:
        launch = FusedLaunch(block_p=min(pow2(P), 128), fold_n=pow2(N), num_warps=4, hpp=H // max(G, 1))
    ov = _OVERRIDE.get()
    fields = ov.fused if ov is not None else {}
    names = {"BLOCK_P": "block_p", "FOLD_N": "fold_n", "num_warps": "num_warps", "maxnreg": "maxnreg", "HPP": "hpp"}
    launch = attrs.evolve(launch, **{names[k]: v for k, v in fields.items() if k in names})
    if dev.compiled and launch.fold_n < 16:
        raise ConfigError(f"FOLD_N must be >= 16 on the GPU, got {launch.fold_n}")
    if (H // max(G, 1)) % launch.hpp:
        raise ConfigError(f"HPP must divide the {H // max(G, 1)} heads per group, got {launch.hpp}")
    return launch


# -- the conv update ------------------------------------------------------------------------

#: the fields ``override(conv=...)`` may set: warps per program, and channels per program (default: a thread's
#: 16 bytes of channels times the program's threads)
CONV_KEYS = ("num_warps", "BLOCK_D")


def _check_conv_override(fields: dict[str, int]) -> None:
    unknown = set(fields) - set(CONV_KEYS)
    if unknown:
        raise ConfigError(f"unknown conv override keys {sorted(unknown)}; known: {', '.join(CONV_KEYS)}")
    for key, v in fields.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
            raise ConfigError(f"conv override {key} must be a power of two, got {v!r}")


def conv_block(conv_dim: int, element_size: int) -> tuple[int, int]:
    """(channels, warps) per program of the conv update: ``launch_table.json``'s ``conv`` warps, each thread holding
    16 bytes of channels of every column, or an :func:`override`'s fields."""
    ov = _OVERRIDE.get()
    fields = ov.conv if ov is not None else {}
    warps = fields.get("num_warps", table()["conv"]["num_warps"])
    block = fields.get("BLOCK_D", max(1, 16 // element_size) * 32 * warps)
    return min(block, pow2(conv_dim)), warps


# -- the conv + verify pair under programmatic dependent launch ----------------------------------------------------


def pair_pdl_max_rows() -> int:
    """The most rows a step may have for the "triton" backend's ``conv_verify`` to launch its conv + verify pair as
    programmatic dependents on its own (``launch_table.json``'s ``pair_pdl``)."""
    return table()["pair_pdl"]["max_rows"]
