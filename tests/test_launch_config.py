"""The verify launch choice (:mod:`ssmstate.ops.triton.config`): which named shape the heuristic takes for each grid,
geometry and device class, what an override changes, and the launch arguments that follow (captured with
``verify_launches`` on CPU tensors under a GPU's device class; nothing runs).

TRITON_INTERPRET=1 is set before the kernels are imported, as in tests/test_ops_triton.py, so both can share a
process.
"""

from __future__ import annotations

import os
import sys

import attrs
import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("GPU present: the launch choice is exercised compiled in tests/gpu/", allow_module_level=True)
if "ssmstate.ops.triton.common" in sys.modules and not sys.modules["ssmstate.ops.triton.common"].INTERPRETED:
    pytest.skip("Triton kernels were imported in compiled mode before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from ssmstate.errors import ConfigError  # noqa: E402
from ssmstate.ops import triton as ot  # noqa: E402
from ssmstate.ops.triton import common, config  # noqa: E402
from ssmstate.ops.triton.verify import ring_prefetch_bytes  # noqa: E402

H200 = ot.DeviceClass(compiled=True, sms=132, gbps_per_sm=36.4)  # 4,800 GB/s over 132 SMs
H100 = ot.DeviceClass(compiled=True, sms=132, gbps_per_sm=25.4)  # the H100 80GB HBM3: 3,352 GB/s over 132 SMs
A100 = ot.DeviceClass(compiled=True, sms=108, gbps_per_sm=18.9, arch=80)  # the A100 80GB: 2,039 GB/s over 108 SMs
CUDA = torch.device("cuda")


def choose(rows: int, R: int = 20, T: int = 4, *, dev=H200, H: int = 128, P: int = 64, N: int = 128, G: int = 8,
           **kw) -> config.Launch:
    with ot.override(device=dev):
        return ot.choose_launch(rows, H, P, N, R, T, CUDA, G, **kw)


def test_the_table_names_every_shape_with_a_reason():
    shapes = config.table()["shapes"]
    assert {"base", "latency", "one_head", "one_head_wide", "one_head_long_ring", "split", "pipelined", "ldg",
            "ldg_stream", "warp"} == set(shapes)
    for name, spec in shapes.items():
        assert spec["kernel"] in ("tma", "ldg", "warp") and len(spec["why"]) > 20, name
        fields = {k for k in spec if not k.endswith("why")} - {"kernel", "long_ring"}
        known = {*config.OVERRIDE_KEYS, "EARLY", "PFHEADS", "SPLIT", "L2PF"}
        assert fields <= known and set(spec.get("long_ring", {})) <= known, name
        for key in (k for k in spec if k.endswith("_why")):  # a field's own reason names one of the shape's fields
            assert key[:-4] in fields and len(spec[key]) > 20, (name, key)
    assert len(config.OVERRIDE_KEYS) + 1 <= 12  # the user keys: shape and the fields
    assert {k.lower() for k in config.OVERRIDE_KEYS} <= {f.name for f in attrs.fields(config.Launch)}


def test_tma_kernel_chosen_where_the_geometry_allows():
    cpu = torch.device("cpu")
    assert ot.choose_launch(4, 8, 32, 32, 20, 4, cpu, 2).kernel == "tma"
    assert ot.choose_launch(4, 8, 24, 32, 20, 4, cpu, 2).kernel == "ldg"  # P not a multiple of 16
    assert ot.choose_launch(4, 8, 32, 24, 20, 4, cpu, 2).kernel == "ldg"  # N not a power of two
    assert ot.choose_launch(4, 8, 32, 32, 20, 4, cpu, 2, tma_ok=False).kernel == "ldg"  # a strided checkpoint
    interp = ot.DeviceClass(compiled=False)
    assert config.tma_block_p(64, 128, interp) == 64 and config.tma_block_p(48, 128, interp) == 16
    assert config.tma_block_p(64, 512, interp) == 0  # the TMA box holds N whole: at most 256
    assert config.tma_block_p(48, 128, H200) == 0  # one warpgroup's 64-row tile on the GPU
    ldg = ot.choose_launch(4, 8, 24, 32, 20, 4, cpu, 2)
    assert (ldg.hpp, ldg.fold_n, ldg.nc) == (4, 32, 0)  # the interpreter: a group's heads per program, whole tiles


def test_tma_launch_heuristic_on_the_gpu():
    """As measured on the H200: batch 1 (at most one program per SM) runs uncapped with L2 prefetches, a flush row
    folding in 64-column chunks; grids of 96 or more heads per SM up to 1,024 rows (batch 99-1,024 at H=128) take
    the split launches; longer grids with at least 15 programs per SM when a program takes a group's 16 heads run
    those heads in a 2-stage pipeline, flush rows folded in one product; the grids between one head per program
    capped at 96 registers. Rings over 32 rows (W=32: R=36) give non-flush rows their short tile (KSPLIT) and cap
    the one-head launch at 128; the LDG kernel takes over once W itself is over 32."""
    small = choose(1)
    assert (small.shape, small.l2pf, small.early, small.maxnreg, small.fold_n, small.ksplit) == (
        "latency", 2, True, 0, 64, False)
    for rows in (8, 32, 64, 98):  # 1,024 / 4,096 / 8,192 / 12,544 heads: under 96 per SM
        mid = choose(rows)
        assert (mid.shape, mid.maxnreg, mid.early, mid.l2pf, mid.heads, mid.split) == ("one_head", 96, True, 0, 1,
                                                                                          False)
    for rows in (99, 128, 256, 1024):
        split = choose(rows)
        assert (split.shape, split.split, split.progs, split.maxnreg, split.pf_heads, split.ksplit,
                split.tma_store) == ("split", True, 3, 168, 1, True, False)
    large = choose(1025)  # past the rows a split launch ranks in registers
    assert (large.shape, large.heads, large.fold_n, large.pf_heads, large.maxnreg) == ("pipelined", 16, 128, 1, 0)
    # only the measured pipelined launch: 16 heads per program and 32 KB tiles (not 4 heads per group, 3 heads per
    # group, a bf16 checkpoint or N = 256)
    for kw in (dict(G=32), dict(H=24), dict(state_size=2), dict(N=256)):
        assert choose(256, **kw).shape == "one_head", kw
    for T in (4, 8):  # W = 32
        w32 = [choose(rows, R=32 + T, T=T) for rows in (1, 32, 98, 256, 2048)]
        assert all(c.kernel == "tma" and c.ksplit for c in w32)
        assert w32[0].shape == "latency" and w32[3].shape == "split" and w32[3].tma_store
        assert all(c.shape == "one_head_long_ring" and c.maxnreg == 128 for c in (w32[1], w32[2], w32[4]))
    assert choose(1, R=52).kernel == "ldg"  # W = 48
    assert choose(256, R=52).shape == "ldg_stream" and choose(256, R=52).nc == 32


@pytest.mark.parametrize("dev", [H200, H100], ids=["h200", "h100"])
def test_the_fused_layer_takes_the_latency_launch_up_to_its_bound(dev):
    """The fused conv + verify layer runs where the grid has at most ``fused.max_programs_per_sm`` programs per SM,
    in the latency launch (uncapped registers: under the one-head launch's cap the fused program spilled), where the
    verify alone takes a capped one-head launch from two programs per SM; beyond, the pair runs."""
    per_sm = config.table()["fused"]["max_programs_per_sm"]
    for H in (128, 64):  # Nemotron-H-8B, Nemotron 3 Nano
        last = per_sm * dev.sms // H
        with ot.override(device=dev):
            assert config.fused_takes(last, H, 64, 128, CUDA) and not config.fused_takes(last + 1, H, 64, 128, CUDA)
        for rows in (1, last):
            assert choose(rows, H=H, fused=True).shape == "latency", (H, rows)
        assert choose(last, H=H).shape in ("one_head", "one_head_wide"), H
        assert choose(last + 1, H=H, fused=True) == choose(last + 1, H=H)
    assert choose(1, state_size=1, fused=True) == choose(1, state_size=1)


@pytest.mark.parametrize("dev", [H100, ot.DeviceClass(compiled=True, sms=132, gbps_per_sm=0.0)],
                         ids=["h100", "unreported"])
def test_tma_launch_heuristic_by_bandwidth_per_sm(dev):
    """As measured on the H100 80GB HBM3 (25.4 GB/s per SM, under ``lean_gbps_per_sm``): no split launches; one head
    per program up to 15 group programs per SM (batch 248 at H=128), then the pipelined launch; at 2-8 programs per
    SM (batch 2-8) one head per program under 128 registers instead of 96; batch 9-247 in the one-head launch (with
    LATE, as on the H200; not for 8-bit checkpoints); batch 1, 1,025 and W=32 as on the H200. A card that reports no
    bandwidth gets the H200's launches."""
    batches = (1, 2, 4, 8, 9, 64, 98, 99, 128, 247, 248, 256, 1024, 1025)
    h200 = {rows: choose(rows) for rows in batches}
    got = {rows: choose(rows, dev=dev) for rows in batches}
    assert {rows: choose(rows, R=36, dev=dev) for rows in batches} == {rows: choose(rows, R=36) for rows in batches}
    if not dev.lean:
        assert got == h200
        return
    assert {r: got[r] for r in (1, 1025)} == {r: h200[r] for r in (1, 1025)}
    for rows in (9, 64, 98):
        assert h200[rows].shape == "one_head" and h200[rows].late and got[rows] == h200[rows], rows
    assert choose(64, dev=dev, state_size=1) == choose(64, state_size=1)  # 8-bit: the table's quant_shapes
    assert choose(9, dev=dev, state_size=1).shape == "one_head" and not choose(9, dev=dev, state_size=1).late
    for rows in (2, 4, 8):  # 256-1,024 programs: at most 8 per SM
        assert got[rows] == attrs.evolve(h200[rows], shape="one_head_wide", maxnreg=128, late=False), rows
    for rows in (99, 128, 247):
        assert got[rows] == got[98] and got[rows].shape == "one_head", rows
    for rows in (248, 256, 1024):
        assert got[rows] == got[1025] and got[rows].shape == "pipelined", rows


def test_an_override_replaces_the_shape_and_its_fields():
    """A named shape replaces the heuristic's choice for the geometry; fields replace the chosen shape's; keys of
    the other kernel are refused."""
    with ot.override(device=H200, shape="pipelined"):
        assert ot.choose_launch(1, 128, 64, 128, 20, 4, CUDA, 8).shape == "pipelined"
    with ot.override(device=H200, HEADS=8, FOLD_N=64):
        got = ot.choose_launch(256, 128, 64, 128, 20, 4, CUDA, 8)
    assert (got.shape, got.heads, got.fold_n, got.progs) == ("split", 8, 64, 3)
    with pytest.raises(ConfigError, match="do not apply to the TMA kernel"), ot.override(device=H200, NC=16):
        ot.choose_launch(256, 128, 64, 128, 20, 4, CUDA, 8)
    with pytest.raises(ConfigError, match="unknown launch override keys"), ot.override(SPLIT_HEADS=2):
        pass
    with pytest.raises(ConfigError, match="interpreter only"):  # several heads per LDG program: not on the GPU
        _launch_kwargs(8, 20, shape="ldg", HPP=2)
    assert _launch_kwargs(8, 20, dev=ot.DeviceClass(compiled=False), shape="ldg", HPP=2)[0]["HPP"] == 2


def test_a_nested_override_keeps_the_fields_it_leaves_out():
    """An override inside another's block (a benchmark's launch around a variant's forced fused layer) sets its own
    fields over the enclosing ones and leaves the rest; leaving its block restores the enclosing override."""
    with ot.override(device=H200, shape="one_head", FOLD_N=64):
        with ot.override(fused={"MAX_ROWS": 4}, FOLD_N=32):
            got = ot.choose_launch(1, 128, 64, 128, 20, 4, CUDA, 8)
            assert (got.shape, got.fold_n) == ("one_head", 32)
            assert config.fused_takes(4, 128, 64, 128, CUDA) and not config.fused_takes(5, 128, 64, 128, CUDA)
        got = ot.choose_launch(1, 128, 64, 128, 20, 4, CUDA, 8)
        assert (got.shape, got.fold_n) == ("one_head", 64) and not config.fused_takes(4, 128, 64, 128, CUDA)
    with ot.override(device=H200):
        assert ot.choose_launch(1, 128, 64, 128, 20, 4, CUDA, 8).shape == "latency"


def _launch_kwargs(rows: int, R: int, *, dev=H200, pdl: bool = False, **launch) -> list[dict]:
    """The kwargs of each kernel launch ``replay_verify`` would make (nothing runs)."""
    H, P, N, G, T = 32, 64, 128, 2, 4
    bf = torch.bfloat16
    pages, L = rows + 1, rows * T
    t = dict(checkpoint=torch.empty(pages, H, P, N), x_ring=torch.empty(pages, H, R, P, dtype=bf),
             B_ring=torch.empty(pages, G, R, N, dtype=bf), dt_ring=torch.empty(pages, H, R),
             ring_start=torch.zeros(pages, dtype=torch.int32), num_committed=torch.zeros(pages, dtype=torch.int32),
             x=torch.empty(L, H, P, dtype=bf), dt=torch.empty(L, H), A=torch.empty(H), B=torch.empty(L, G, N, dtype=bf),
             C=torch.empty(L, G, N, dtype=bf), page_ids=torch.arange(1, rows + 1, dtype=torch.int32),
             cu_seqlens=torch.arange(0, L + 1, T, dtype=torch.int32))
    with ot.override(device=dev, **launch):
        launches = ot.verify_launches(*t.values(), R - T, torch.empty(L, H, P, dtype=bf), pdl=pdl)
    return [k.kwargs for k in launches]


def test_l2_prefetch_sizes():
    """The TMA kernel's L2 prefetch spans (GPU only): the first tile, the x and dt rings of all the program's heads,
    the group's B ring; a span or offset a bulk prefetch cannot take (not 16-byte aligned) is left out rather than
    faulting. With pdl, a one-head launch of 16+ programs per SM sends the first tile into L2 before its wait."""
    def rings(R, pages=3, H=32, G=2, P=64, N=128):
        return (torch.empty(pages, H, R, P, dtype=torch.bfloat16), torch.empty(pages, G, R, N, dtype=torch.bfloat16),
                torch.empty(pages, H, R))

    xr, Br, dtr = rings(20)
    assert (ring_prefetch_bytes(xr, 16), ring_prefetch_bytes(Br, 1), ring_prefetch_bytes(dtr, 16)) == (
        16 * 20 * 64 * 2, 20 * 128 * 2, 16 * 20 * 4)
    assert ring_prefetch_bytes(dtr, 1) == 20 * 4  # one head: 80 bytes, aligned
    xr, Br, dtr = rings(18)  # dt rows of 72 bytes: one head's start is not 16-byte aligned, 16 heads' is
    assert ring_prefetch_bytes(dtr, 1) == 0 and ring_prefetch_bytes(xr, 1) == 18 * 64 * 2
    assert ring_prefetch_bytes(dtr, 16) == 16 * 18 * 4
    padded = torch.empty(3, 32, 20, 65, dtype=torch.bfloat16)[..., :64]  # a ring whose rows are 130 bytes apart
    assert ring_prefetch_bytes(padded, 16) == 0
    (latency,) = _launch_kwargs(1, 20)  # 32 programs on 132 SMs
    assert (latency["PF_CK"], latency["PF_X"], latency["PF_B"], latency["PF_DT"]) == (32768, 20 * 64 * 2,
                                                                                       20 * 128 * 2, 20 * 4)
    (mid,) = _launch_kwargs(8, 20)
    assert mid["PF_CK"] == 0 and mid["EARLY"] and mid["maxnreg"] == 96
    (mid_pdl,) = _launch_kwargs(80, 20, pdl=True)  # 2,560 programs: 16+ per SM, the first tile into L2 first
    assert mid_pdl["PF_CK"] == 32768 and mid_pdl["GDC"] == 1 and mid_pdl["launch_pdl"]
    (latency_pdl,) = _launch_kwargs(1, 20, pdl=True)  # the tile's TMA copy itself goes out before the wait
    assert latency_pdl["GDC"] == 2
    (interp,) = _launch_kwargs(1, 20, dev=ot.DeviceClass(compiled=False))  # the interpreter runs none
    assert (interp["PF_CK"], interp["PF_X"], interp["PF_AHEAD"]) == (0, 0, 0)


def test_split_launch_arguments():
    """The split shape is two launches: the non-flush rows' under the register cap on PROGS programs per SM, the flush
    rows' uncapped on 2 per SM folding whole tiles; on the GPU the second is a programmatic dependent."""
    first, second = _launch_kwargs(128, 20, shape="split")
    assert (first["ROUTE"], first["maxnreg"], first["FOLD_N"], first["BLOCK_KN"]) == (1, 168, 32, 16)
    assert (second["ROUTE"], "maxnreg" in second, second["FOLD_N"], second["launch_pdl"]) == (2, False, 128, True)
    assert "launch_pdl" not in first  # without pdl=True the first launch waits for nothing


def test_dram_bandwidth_unreported_off_the_gpu():
    """Off the GPU, or where the driver cannot say, the bandwidth reads 0.0: the launches of a card with bandwidth
    to spare."""
    assert common.dram_gbps_per_sm(torch.device("cpu")) == 0.0
    if not torch.cuda.is_available():  # no active Triton driver: the lookup raises inside and falls back
        common.dram_gbps_per_sm_of.cache_clear()
        assert common.dram_gbps_per_sm_of(0) == 0.0
    assert ot.choose_launch(1, 2, 16, 16, 12, 4, torch.device("cpu")).shape == "base"  # the interpreter's TMA launch


def test_8bit_launches_come_from_the_table():
    """An 8-bit checkpoint (one byte per element) takes the table's ``quant_shapes``: the first entry whose grid
    bound holds and whose launch the geometry can take."""
    from ssmstate.ops.triton.config import table

    entries = table()["quant_shapes"]
    assert all(e["shape"] in table()["shapes"] and e["why"] for e in entries)
    for rows in (1, 8, 64, 256, 2048):
        programs = rows * 128
        want = next(e["shape"] for e in entries
                    if (e["max_programs_per_sm"] is None or programs <= e["max_programs_per_sm"] * 132)
                    and not (e["shape"].startswith("split") and rows > 1024))
        assert choose(rows, state_size=1).shape == want, rows
        assert choose(rows, state_size=1, G=32).shape != "pipelined"  # 4 heads per group


def test_8bit_entries_fields_apply_under_an_override(monkeypatch):
    """A ``quant_shapes`` entry's ``fields`` replace its shape's (an 8-bit launch only); an override's win."""
    t = dict(config.table(), quant_shapes=[{"max_programs_per_sm": None, "shape": "one_head",
                                            "fields": {"maxnreg": 128}, "why": "a test entry"}])
    monkeypatch.setattr(config, "table", lambda: t)
    assert choose(64, state_size=1).maxnreg == 128
    assert choose(64).maxnreg == 96  # fp32: the shape's own
    with ot.override(device=H200, maxnreg=0):
        assert ot.choose_launch(64, 128, 64, 128, 20, 4, CUDA, 8, state_size=1).maxnreg == 0


def test_8bit_launches_take_outputs_8_tokens_wide():
    """The 8-bit entries set ``BLOCK_S`` 8 (the codes' readout goes to 8-column products) and the split one 4
    programs per SM under 128 registers; fp32 keeps 16. The kernels get ``pow2(T)`` tokens, at least that; a width
    other than 8 or 16 is refused."""
    for rows in (1, 8, 64, 256):
        assert choose(rows, state_size=1).block_s == 8 and choose(rows).block_s == 16, rows
    split = choose(64, state_size=1)
    assert (split.shape, split.progs, split.maxnreg) == ("split", 4, 128)
    assert all(k["BLOCK_S"] == 8 for k in _launch_kwargs(8, 20, BLOCK_S=8))
    assert all(k["BLOCK_S"] == 16 for k in _launch_kwargs(8, 20))
    assert _launch_kwargs(8, 20, shape="ldg", BLOCK_S=8)[0]["BLOCK_S"] == 8
    with pytest.raises(ConfigError, match="BLOCK_S must be 8 or 16"):
        _launch_kwargs(8, 20, BLOCK_S=4)


def test_the_per_warp_kernel_runs_on_the_gpu_only():
    """``shape="warp"`` (the Gluon kernel) takes only a register cap as a field, and raises on a machine that cannot
    run it (the interpreter) before anything is written."""
    with pytest.raises(ConfigError, match="do not apply"):
        with ot.override(shape="warp", BLOCK_P=32):
            choose(8)
    gen = torch.Generator().manual_seed(0)
    pages, H, P, N, G, R = 3, 2, 64, 64, 1, 20
    ck = torch.randn(pages, H, P, N, generator=gen)
    xr, Br, dtr = torch.zeros(pages, H, R, P), torch.zeros(pages, G, R, N), torch.zeros(pages, H, R)
    before = ck.clone()
    with pytest.raises(ConfigError, match="per-warp"), ot.override(shape="warp"):
        ot.replay_verify(ck, xr, Br, dtr, torch.zeros(pages, dtype=torch.int32), torch.zeros(pages, dtype=torch.int32),
                         torch.randn(4, H, P), torch.randn(4, H), -torch.ones(H), torch.randn(4, G, N),
                         torch.randn(4, G, N), torch.tensor([1], dtype=torch.int32),
                         torch.tensor([0, 4], dtype=torch.int32), 16, torch.empty(4, H, P))
    assert torch.equal(ck, before) and not xr.any()


def test_the_per_warp_kernel_takes_fp32_verifies_on_lean_cards():
    """Where the per-warp kernel takes the call, a card under ``lean_gbps_per_sm`` (the H100 80GB HBM3) runs it at
    every batch; the H200 keeps its TMA launches, and neither the fused layer nor an 8-bit checkpoint takes it."""
    for rows in (1, 2, 4, 8, 16, 64, 128, 256, 1024):
        assert choose(rows, dev=H100, warp_ok=True).kernel == "warp"
        assert choose(rows, dev=H200, warp_ok=True) == choose(rows, dev=H200)
        assert choose(rows, dev=H100) == choose(rows, dev=H100, warp_ok=False)
    assert choose(8, dev=H100, warp_ok=True, fused=True).kernel == "tma"
    assert choose(8, dev=H100, warp_ok=True, state_size=1).kernel == "tma"


def _fused_launches(act: torch.dtype = torch.bfloat16, T: int = 4, W: int = 16, **override):
    """The fused layer's launches for a 3-row step of Nemotron-H-8B's geometry on CPU tensors, built for the H100
    under ``override`` (nothing runs)."""
    H, P, N, G, k, rows = 128, 64, 128, 8, 4, 3
    pages, R, L, Dc = rows + 1, W + T, rows * T, H * P + 2 * G * N
    e, i32 = torch.empty, torch.int32
    conv = torch.zeros(pages, k - 1 + T, Dc, dtype=act).transpose(1, 2)
    with ot.override(device=H100, **override):
        launches = ot.conv_verify.conv_verify_launches(
            torch.zeros(pages, H, P, N), torch.zeros(pages, H, R, P, dtype=act), torch.zeros(pages, G, R, N, dtype=act),
            torch.zeros(pages, H, R), torch.zeros(pages, dtype=i32), torch.zeros(pages, dtype=i32), conv,
            torch.zeros(pages, dtype=i32), e(L, Dc, dtype=act), e(L, H, dtype=act), e(H), e(Dc, k), e(Dc),
            torch.arange(1, rows + 1, dtype=i32), torch.arange(0, L + 1, T, dtype=i32), W, e(L, H, P, dtype=act),
            D=e(H), dt_bias=e(H), counters=torch.zeros(pages, G, dtype=i32), pdl=True,
            row_shift=torch.zeros(rows, dtype=i32), row_cursors=torch.zeros(2, rows, dtype=i32))
    return launches


def test_the_fused_layer_runs_the_per_warp_kernel_under_its_override():
    """``override(shape="warp")`` puts the fused layer on the per-warp kernel with the conv in it (the layer's
    conv arguments, the window's sequence columns, the fixed window slot after FOLD_K history rows); the launch
    table keeps the TMA kernel there; a call the kernel cannot take raises while its launch is built."""
    (launch,) = _fused_launches(shape="warp")
    assert launch.kernel.fn.__name__ == "verify_warp_kernel" and launch.grid == (128, 3)
    kw = launch.kwargs
    assert (kw["KW"], kw["BLOCK_L"], kw["FOLD_K"], kw["BLOCK_S"], kw["GDC"]) == (3, 8, 16, 8, True)
    assert kw["launch_pdl"] is True
    assert launch.args[-18].dim() == 2 and launch.args[-18].shape[1] == 128 * 64 + 2 * 8 * 128  # xBC
    assert {k.kernel.fn.__name__ for k in _fused_launches()} == {"verify_tma_kernel"}
    assert _fused_launches(T=8, W=24, shape="warp")[0].kwargs["BLOCK_L"] == 16
    with pytest.raises(ConfigError, match="per-warp"):  # 32-bit x, B and C: while the launch is built
        _fused_launches(act=torch.float32, shape="warp")


def _verify_launches(x: torch.Tensor, B: torch.Tensor, dev: ot.DeviceClass = H100, pdl: bool = False,
                     **override) -> list[common.KernelLaunch]:
    """The launches ``replay_verify`` makes for a 4-row step of Nemotron-H-8B's geometry on CPU tensors, with
    these x (tokens, H, P) and B (tokens, G, N), built for ``dev`` (nothing runs)."""
    H, P, N, G, R, rows, T = 128, 64, 128, 8, 20, 4, 4
    pages, bf, i32 = rows + 1, torch.bfloat16, torch.int32
    with ot.override(device=dev, **override):
        return ot.verify_launches(
            torch.zeros(pages, H, P, N), torch.zeros(pages, H, R, P, dtype=bf), torch.zeros(pages, G, R, N, dtype=bf),
            torch.zeros(pages, H, R), torch.zeros(pages, dtype=i32), torch.zeros(pages, dtype=i32), x,
            torch.zeros(rows * T, H, dtype=bf), torch.zeros(H), B, B, torch.arange(1, rows + 1, dtype=i32),
            torch.arange(0, rows * T + 1, T, dtype=i32), 16, torch.empty(rows * T, H, P, dtype=bf), pdl=pdl)


def _verify_kernels(x: torch.Tensor, B: torch.Tensor, dev: ot.DeviceClass = H100, **override) -> set[str]:
    """The kernels of :func:`_verify_launches`."""
    return {k.kernel.fn.__name__ for k in _verify_launches(x, B, dev, **override)}


def test_rows_off_16_byte_boundaries_stay_off_the_kernels_that_state_them():
    """The per-warp and TMA kernels load each sequence row (a ring's or the step's) as 16-byte vectors and state
    that alignment to the compiler, which cannot derive it through the per-row pick: a step whose x or B rows are
    off 16-byte boundaries runs on the portable kernel, and an override naming either kernel raises."""
    H, P, N, G, L = 128, 64, 128, 8, 16
    bf = torch.bfloat16
    x, B = torch.zeros(L, H, P, dtype=bf), torch.zeros(L, G, N, dtype=bf)
    x_odd = torch.zeros(L * H * P + 1, dtype=bf)[1:].view(L, H, P)  # 2 bytes past a boundary
    B_odd = torch.zeros(L, G, N + 4, dtype=bf)[:, :, :N]  # rows 264 bytes apart
    assert ot.common.rows_aligned(x, B) and not ot.common.rows_aligned(x_odd) and not ot.common.rows_aligned(B_odd)
    assert _verify_kernels(x, B) == {"verify_warp_kernel"}
    assert _verify_kernels(x, B, dev=H200) == {"verify_tma_kernel"}
    for xs, Bs in ((x_odd, B), (x, B_odd)):
        for dev in (H100, H200):
            assert _verify_kernels(xs, Bs, dev=dev) == {"verify_ldg_kernel"}
        for shape in ("warp", "one_head"):
            with pytest.raises(ConfigError, match="16-byte boundaries"):
                _verify_kernels(xs, Bs, shape=shape)
    # the portable kernel states the alignment where it holds, and only there
    for xs, Bs, aligned in ((x, B, True), (x_odd, B, False), (x, B_odd, False)):
        (launch,) = _verify_launches(xs, Bs, shape="ldg")
        assert launch.kwargs["ALIGNED"] is aligned


def test_gpus_before_hopper_run_the_portable_kernels_without_pdl():
    """A GPU before compute capability 9.0 has no TMA, no elected thread and no programmatic dependent launch (the
    TMA kernel's build aborts the process there: LLVM cannot select ``elect.sync`` for sm_80). Every verify runs the
    portable kernel, on fp32 and 8-bit checkpoints alike; ``pdl=True`` launches plainly; the fused layer gives way to
    the conv, verify pair; an override naming the TMA or per-warp kernel raises."""
    for rows in (1, 4, 32, 256, 1024):
        for state_size in (4, 1):
            assert choose(rows, dev=A100, state_size=state_size).kernel == "ldg"
        assert choose(rows, R=44, T=4, dev=A100).kernel == "ldg"
        assert choose(rows, dev=H100, tma_ok=True).kernel == "tma"
    H, P, N, G, L = 128, 64, 128, 8, 16
    bf = torch.bfloat16
    x, B = torch.zeros(L, H, P, dtype=bf), torch.zeros(L, G, N, dtype=bf)
    (launch,) = _verify_launches(x, B, dev=A100, pdl=True)
    assert launch.kernel.fn.__name__ == "verify_ldg_kernel"
    assert launch.kwargs["GDC"] is False and "launch_pdl" not in launch.kwargs
    hopper = _verify_launches(x, B, dev=H200, pdl=True)[0].kwargs
    assert hopper["GDC"] and hopper["launch_pdl"]
    for shape in ("warp", "one_head", "latency"):
        with pytest.raises(ConfigError, match="compute capability 9.0\\+.*got compute capability 8.0"):
            _verify_kernels(x, B, dev=A100, shape=shape)
    for dev, fused in ((A100, False), (H100, True)):
        with ot.override(device=dev):
            assert config.fused_takes(1, H, P, N, CUDA) is fused
            conv = ot.conv.conv_launch(torch.zeros(2, 7, 4096, dtype=bf).transpose(1, 2),
                                       torch.zeros(2, dtype=torch.int32), torch.zeros(4, 4096, dtype=bf),
                                       torch.zeros(4096, 4), None, torch.ones(1, dtype=torch.int32),
                                       torch.tensor([0, 4], dtype=torch.int32), torch.zeros(4, 4096, dtype=bf),
                                       pdl=True)
        assert conv.kwargs["GDC"] is (dev is H100) and ("launch_pdl" in conv.kwargs) is (dev is H100)


def test_fused_conv_placement_follows_the_triton_version(monkeypatch):
    """The fused layer on the TMA kernel places its conv outputs by ``tl.gather`` under a Triton older than the
    table's ``fused.gather_before_triton`` and by selects from it (``GATHER``, a constant of the launch), whatever an
    override names; a launch without a conv passes one fixed value (one build)."""
    def gather(version, **fused):
        monkeypatch.setattr(config, "triton_version", lambda: version)
        with ot.override(fused=fused):
            return config.fused_gather()

    assert config.table()["fused"]["gather_before_triton"] == "3.7"
    assert gather((3, 6)) and gather((3, 4)) and not gather((3, 7)) and not gather((3, 9)) and not gather((4, 0))
    assert not gather((3, 6), GATHER=0) and gather((3, 9), GATHER=1)
    with pytest.raises(ConfigError, match="GATHER"):
        gather((3, 9), GATHER=2)
    assert config._version("3.10.0rc1") == (3, 10) and config._version("3.7.1+git0123abc") == (3, 7)
    assert config._version("3.7rc1") == (3, 7) and config._version("4.0") == (4, 0)
    monkeypatch.setattr(config, "triton_version", lambda: (3, 6))
    assert all(k["GATHER"] is False for k in _launch_kwargs(1, 20, dev=H200))
