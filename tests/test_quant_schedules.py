"""Quantized checkpoints (int8, fp8, bf16, fp16; nearest and stochastic) on the reference backend.

The float64 serial oracle is mirrored: wherever the manager writes a checkpoint (a flush in verify,
materialize, write_state) the oracle's state is replaced by ``decode(quantize(fp32(state)))`` with the same
seed, layer and page. A flushing verify computes its outputs from the exact folded state (as FlashInfer's
8-bit kernel does) and continues from the stored one, and so does the oracle. The manager computes the
folded state in fp32, the oracle in fp64, so the two quantize values that differ by fp32 rounding: a code
can land one step apart where a value sits on a rounding edge. Hence the stated bound: per element, the
state error is at most one quantization step (2 x scale/2 for int8) per checkpoint write so far, plus fp32
rounding, and such one-step flips are rare (checked as a fraction, for states and outputs alike). Bytes are
compared exactly where both sides quantize the same fp32 value (write_state) and to within one step
elsewhere. Against the exact (unquantized) oracle this adds at most scale/2 per write for int8 nearest
rounding, a grid step per write for stochastic rounding (ssmstate/ops/quant.py, tests/test_quant.py).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
from ssmstate.dtypes import is_quantized
from ssmstate.errors import BackendUnavailableError, ConfigError
from ssmstate.layout import SCALE_NAME
from ssmstate.ops import quant
from tests.harness import Harness
from tests.oracle import SerialOracle
from tests.test_schedules import OPS

DTYPES = (torch.int8, torch.float8_e4m3fn, torch.bfloat16, torch.float16)
FP32_REL = 1e-5  # fp32 vs fp64 arithmetic, relative to the state's magnitude


def grid_step(S: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(H, P, N) fp64: the spacing of the stored grid at each element of fp32 state ``S``."""
    x = S.double()
    if dtype == torch.int8:
        return quant.row_scales(S.float(), dtype)[1].double().unsqueeze(-1).expand_as(x)
    if dtype == torch.float8_e4m3fn:
        enc, scale = quant.row_scales(S.float(), dtype)
        _, e = torch.frexp(x * enc.double().unsqueeze(-1))
        return torch.pow(2.0, torch.clamp(e - 1, min=-6) - 3).double() * scale.double().unsqueeze(-1)
    mbits, emin = (7, -126) if dtype == torch.bfloat16 else (10, -14)
    _, e = torch.frexp(x)
    return torch.pow(2.0, torch.clamp(e - 1, min=emin) - mbits).double()


class QuantOracle(SerialOracle):
    """A serial oracle whose state is replaced by its stored (quantized) value at a flush, after the outputs."""

    def __init__(self, *args: int) -> None:
        super().__init__(*args)
        self.stored: dict[tuple[object, int], torch.Tensor] = {}

    def verify(self, rid, layer, *args, **kwargs):
        y = super().verify(rid, layer, *args, **kwargs)  # outputs from the exact state
        S = self.stored.pop((rid, layer), None)
        if S is not None:  # the accepted states continue from the stored checkpoint
            self.ssm[rid][layer] = S
            super().verify(rid, layer, *args, **kwargs)
        return y


class QuantHarness(Harness):
    """A :class:`Harness` whose oracle quantizes where the manager writes a checkpoint."""

    def __init__(self, geom: Mamba2Geometry, spec: SpecConfig, num_pages: int, sr: bool, seed: int) -> None:
        super().__init__(geom, spec, num_pages, seed=seed)
        self.m = StateManager(PageLayout.replay(geom, spec), num_pages, stochastic_rounding=sr, seed=seed * 7919)
        H, P, N, G = geom.heads_per_rank, geom.head_dim, geom.state_size, geom.groups_per_rank
        self.o = QuantOracle(geom.num_layers, H, P, N, G, geom.conv_dim_per_rank, geom.conv_kernel)
        self.sr = sr
        self.c: dict[object, int] = {}  # mirror of num_committed
        self.bound: dict[tuple[object, int], torch.Tensor] = {}  # per-element state error bound
        self.writes = 0
        self.checked = 0  # elements compared after writes
        # the state elements (request, layer, index) ever more than fp32 rounding apart after a write: an element
        # once a step off evolves from its own value (the fold is elementwise in S), so it stays off in later
        # writes and is one flip, counted once
        self.flipped: set[tuple[object, int, int]] = set()
        self.out_checked = self.out_off = 0  # the same for outputs

    # -- the oracle's quantized writes ----------------------------------------------------------------
    def _seed(self) -> torch.Tensor | None:
        s = self.m.cache.checkpoint_seed
        return None if s is None else s.clone()

    def _oracle_write(self, rid: object, layer: int, seed: torch.Tensor | None, later: bool = False) -> torch.Tensor:
        """The oracle's stored state for a checkpoint write now; installed at once, or at the step's verify."""
        dt = self.g.state_dtype
        S = self.o.ssm[rid][layer].float()
        page = torch.tensor([self.m.page_of(rid)])
        stored, scale = quant.quantize(S.unsqueeze(0), dt, seed=seed, layer=layer, pages=page if self.sr else None)
        Sq = quant.dequantize(stored, scale)[0].double()
        if later:
            self.o.stored[(rid, layer)] = Sq
        else:
            self.o.ssm[rid][layer] = Sq
        key = (rid, layer)
        prev = self.bound.get(key, torch.zeros_like(S, dtype=torch.float64))
        self.bound[key] = prev + grid_step(S, dt)
        self.writes += 1
        return Sq

    def admit(self) -> object:
        rid = super().admit()
        self.c[rid] = 0
        return rid

    def release(self, rid: object) -> None:
        super().release(rid)
        del self.c[rid]
        for layer in range(self.g.num_layers):
            self.bound.pop((rid, layer), None)

    def write_random_state(self, rid: object) -> None:
        g = self.g
        for layer in range(g.num_layers):
            S = torch.randn(g.heads_per_rank, g.head_dim, g.state_size, generator=self.gen) * 3
            conv = torch.randn(g.conv_dim_per_rank, g.conv_kernel - 1, generator=self.gen)
            seed = self._seed()
            self.m.write_state(rid, layer, S, conv)
            self.o.write_state(rid, layer, S.double(), conv.to(g.conv_state_dtype).double())
            self._oracle_write(rid, layer, seed)
            # write_state quantizes the given fp32 value on both sides: the stored bytes are exactly quantize(S)
            t, page = self.m.cache.layers[layer], self.m.page_of(rid)
            want, want_scale = quant.quantize(S.unsqueeze(0), g.state_dtype, seed=seed, layer=layer,
                                              pages=torch.tensor([page]) if self.sr else None)
            assert torch.equal(t["checkpoint"][page].view(torch.uint8) if t["checkpoint"].element_size() == 1
                               else t["checkpoint"][page], want[0].view(torch.uint8) if want.element_size() == 1
                               else want[0])
            if want_scale is not None:
                assert torch.equal(t[SCALE_NAME][page], want_scale[0])
            self.bound[(rid, layer)] = torch.zeros_like(S, dtype=torch.float64)  # exact: nothing to carry

    def materialize(self, rids: list[object]) -> None:
        seed = self._seed()
        self.m.materialize(rids)
        for rid in rids:
            if self.c[rid]:
                for layer in range(self.g.num_layers):
                    self._oracle_write(rid, layer, seed)
                    self._check_bytes(rid, layer, self.o.ssm[rid][layer], self.bound[(rid, layer)])
            self.c[rid] = 0

    def step(self, rids, qs, accepted, pad=0, device_counts=False) -> None:
        W = self.spec.window
        flushing = [rid for rid, q in zip(rids, qs) if self.c[rid] + q > W]
        seed = self._seed()
        written = {}
        for rid in flushing:
            for layer in range(self.g.num_layers):
                Sq = self._oracle_write(rid, layer, seed, later=True)
                written[(rid, layer)] = (Sq, self.bound[(rid, layer)].clone())
        super().step(rids, qs, accepted, pad, device_counts)
        for (rid, layer), (want, bound) in written.items():  # the checkpoint holds the state the step began from
            self._check_bytes(rid, layer, want, bound)
        for i, rid in enumerate(rids):
            a = 0 if accepted is None else accepted[i]
            self.c[rid] = a if rid in flushing else self.c[rid] + a

    # -- comparisons ---------------------------------------------------------------------------------
    def _check_bytes(self, rid: object, layer: int, want: torch.Tensor, bound: torch.Tensor) -> None:
        """The stored checkpoint decodes to the oracle's quantized state ``want`` within ``bound`` (one step per
        write where a value sat on a rounding edge, fp32 vs fp64 fold) plus fp32 rounding."""
        t, page = self.m.cache.layers[layer], self.m.page_of(rid)
        scale = t[SCALE_NAME][page] if SCALE_NAME in t else None
        got = quant.dequantize(t["checkpoint"][page], scale).double()
        step = grid_step(want.float(), self.g.state_dtype)
        err = (got - want).abs()
        self.checked += err.numel()
        off = (err > FP32_REL * want.abs().amax() + 1e-30).flatten().nonzero().flatten().tolist()
        self.flipped.update((rid, layer, i) for i in off)
        assert torch.all(err <= bound + FP32_REL * want.abs().amax() + 1e-30), \
            f"checkpoint bytes of {rid} layer {layer} off by {float((err / step).max()):.3g} steps"

    def check_rare_flips(self) -> None:
        """Codes one step apart are rare (a value on a rounding edge); a wrong seed, layer or page in the
        stochastic-rounding hash, or a second rounding, moves a large fraction of them."""
        off = len(self.flipped)
        assert off <= 2 + 0.002 * self.checked, f"{off} state elements off the oracle's in {self.checked} compared"
        # a flipped state element shows in the outputs of its row until it has decayed: a few dozen values
        assert self.out_off <= 40 + 0.01 * self.out_checked, f"{self.out_off} of {self.out_checked} outputs off"

    def _cmp(self, got, want, what, scale_tol=None) -> None:
        """Outputs: within fp32 rounding, except where a one-step flip of the state shows through ``C`` and the
        gate (|dy| <= sum_n bound |C_n| |silu(z)|, with |C|, |silu(z)| < 6 for these draws); flips are counted."""
        a, b = got.double(), want.double()
        worst = max((float(v.sum(-1).amax()) for v in self.bound.values()), default=0.0)
        fp32 = FP32_REL * 10 * max(float(b.abs().amax()), 1.0)
        err = (a - b).abs()
        self.out_checked += err.numel()
        self.out_off += int((err > fp32).sum())
        assert float(err.amax()) <= fp32 + worst * 36, f"{what}: {float(err.amax()):.3g} > {fp32 + worst * 36:.3g}"

    def check_states(self, state_tol=None) -> None:
        for rid in self.active:
            for layer in range(self.g.num_layers):
                got = self.m.read_state(rid, layer).double()
                want = self.o.ssm[rid][layer]
                bound = self.bound.get((rid, layer), torch.zeros_like(want))
                err = (got - want).abs()
                lim = bound + FP32_REL * max(float(want.abs().amax()), 1e-3)
                assert torch.all(err <= lim), f"state {rid} layer {layer}: excess {float((err - lim).max()):.3g}"
                conv = self.m.read_conv(rid, layer)
                assert torch.equal(conv.double(), self.o.conv[rid][layer].to(self.g.conv_state_dtype).double())


def run_quant_schedule(h: QuantHarness, ops: list[tuple[str, int]]) -> None:
    T = h.spec.num_tokens
    for op, seed in ops:
        rng = random.Random(seed)
        if op == "admit" or not h.active:
            if h.m.can_admit():
                rid = h.admit()
                if rng.random() < 0.5:
                    h.write_random_state(rid)
            continue
        if op in ("step", "rollback"):
            rids = rng.sample(h.active, rng.randint(1, len(h.active)))
            qs = [rng.randint(1, T) for _ in rids]
            acc = None if op == "rollback" else [rng.choice([0, q, rng.randint(0, q)]) for q in qs]
            h.step(rids, qs, acc, device_counts=rng.random() < 0.3)
        elif op == "release":
            h.release(rng.choice(h.active))
        elif op == "materialize":
            h.materialize(rng.sample(h.active, rng.randint(1, len(h.active))))
        elif op == "preempt":
            rid = rng.choice(h.active)
            before = _page_bytes(h, rid)
            saved = h.m.preempt(rid)
            h.m.resume(rid, saved)
            assert _page_bytes(h, rid) == before  # codes, scales, rings, conv, cursors: byte for byte
        elif op == "write_state":
            rid = rng.choice(h.active)
            h.materialize([rid])
            h.write_random_state(rid)
        h.check_states()
    h.check_rare_flips()


def _page_bytes(h: QuantHarness, rid: object) -> list[bytes]:
    page = h.m.page_of(rid)
    out = [h.m.cache.cursors[:, page].numpy().tobytes()]
    for layer in h.m.cache.layers:
        out += [t[page].contiguous().view(torch.uint8).numpy().tobytes() for t in layer.values()]
    return out


@st.composite
def quant_configs(draw):
    G = draw(st.sampled_from([1, 2]))
    geom = Mamba2Geometry(
        num_heads=G * draw(st.sampled_from([1, 2])), head_dim=draw(st.sampled_from([2, 4])),
        state_size=draw(st.sampled_from([4, 8])), n_groups=G, conv_kernel=draw(st.sampled_from([2, 4])),
        num_layers=draw(st.sampled_from([1, 2])), state_dtype=draw(st.sampled_from(DTYPES)),
        act_dtype=torch.float32,
    )
    K = draw(st.integers(0, 4))
    return geom, SpecConfig(K, window=draw(st.integers(K + 1, 8)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=quant_configs(), sr=st.booleans(),
       ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2**31)), min_size=5, max_size=25),
       seed=st.integers(0, 2**16))
def test_quantized_checkpoints_match_the_mirrored_oracle(cfg, sr, ops, seed):
    geom, spec = cfg
    h = QuantHarness(geom, spec, num_pages=5, sr=sr, seed=seed)
    run_quant_schedule(h, ops)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sr", [False, True])
def test_long_run_writes_and_bounds(dtype, sr):
    """A fixed long schedule that flushes often: the bound holds and many checkpoint writes happen."""
    geom = Mamba2Geometry(2, 4, 8, 1, 4, 2, state_dtype=dtype, act_dtype=torch.float32)
    h = QuantHarness(geom, SpecConfig(3, window=4), num_pages=4, sr=sr, seed=3)
    for _ in range(3):
        h.write_random_state(h.admit())
    rng = random.Random(1)
    for i in range(60):
        qs = [rng.randint(1, 4) for _ in h.active]
        h.step(list(h.active), qs, [rng.randint(0, q) for q in qs])
        if i % 20 == 19:
            h.materialize(list(h.active))
        h.check_states()
    h.check_rare_flips()
    assert h.writes > 100 and h.checked > 1000


def test_seed_advances_on_the_device_per_step_and_write():
    geom = Mamba2Geometry(2, 4, 8, 1, 4, 1, state_dtype=torch.int8, act_dtype=torch.float32)
    h = QuantHarness(geom, SpecConfig(1, window=2), num_pages=3, sr=True, seed=5)
    seed = h.m.cache.checkpoint_seed
    start = int(seed.item())
    rid = h.admit()
    h.write_random_state(rid)  # one per layer
    h.step([rid], [2], [2])
    h.step([rid], [2], None)  # a verified rollback is a step too
    h.materialize([rid])
    assert h.m.cache.checkpoint_seed is seed and int(seed.item()) == start + 4


def test_rounding_options_are_checked():
    g32 = Mamba2Geometry(2, 4, 8, 1, 4, 1)
    gi8 = Mamba2Geometry(2, 4, 8, 1, 4, 1, state_dtype="int8")
    spec = SpecConfig(1, window=2)
    with pytest.raises(ConfigError, match="stochastic rounding"):
        StateManager(PageLayout.replay(g32, spec), 3, stochastic_rounding=True)
    with pytest.raises(ConfigError):
        StateManager(PageLayout.replay(gi8, spec), 3, stochastic_rounding=1)
    with pytest.raises(ConfigError):
        StateManager(PageLayout.replay(gi8, spec), 3, stochastic_rounding=True, seed=2**63)
    with pytest.raises(ConfigError, match="native"):
        PageLayout.native(gi8, spec)
    gbf = Mamba2Geometry(2, 4, 8, 1, 4, 1, state_dtype="bf16")
    with pytest.raises(ConfigError, match="native"):
        StateManager(PageLayout.native(gbf, spec), 5, stochastic_rounding=True)
    assert StateManager(PageLayout.replay(gi8, spec), 3).cache.checkpoint_seed is None


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_other_backends_on_8bit_layouts(dtype):
    """Triton serves 8-bit checkpoints at any geometry it serves, FlashInfer's 8-bit kernel at head_dim 64 only;
    both take stochastic rounding (FlashInfer refuses a bf16 one when it verifies: it rounds bf16 to nearest)."""
    from ssmstate.backends.flashinfer import FlashInferBackend, unsupported_reasons
    from ssmstate.backends.triton import TritonBackend
    from ssmstate.checks import check_rounding

    spec = SpecConfig(3, window=8)
    g32 = Mamba2Geometry(4, 32, 64, 1, 4, 1, state_dtype=dtype)
    assert any("head_dim P=64" in r for r in unsupported_reasons(PageLayout.replay(g32, spec)))
    g64 = Mamba2Geometry(4, 64, 64, 1, 4, 1, state_dtype=dtype, act_dtype="bf16")
    assert unsupported_reasons(PageLayout.replay(g64, spec)) == []
    TritonBackend().check(PageLayout.replay(g32, spec), torch.device("cuda"))  # no GPU needed to say yes
    for backend in (FlashInferBackend(), TritonBackend()):  # the check the manager runs after backend.check
        check_rounding(backend, PageLayout.replay(g64, spec), True, 0)


def test_layout_scale_bytes_and_fresh_pages():
    g = Mamba2Geometry(4, 8, 16, 2, 4, 2, state_dtype="fp8")
    layout = PageLayout.replay(g, SpecConfig(3, window=8))
    names = [t.name for t in layout.tensors]
    assert names[:2] == ["checkpoint", SCALE_NAME]
    scale = layout.tensors[1]
    assert scale.shape == (4, 8) and scale.dtype == torch.float32 and scale.nbytes == 4 * 8 * 4
    m = StateManager(layout, 3)
    assert m.cache.nbytes == layout.pool_bytes(3)
    rid = "a"
    page = m.admit(rid)
    for t in m.cache.layers:
        # a fresh page stores what encoding a zero state stores: codes 0, scales 1
        want_q, want_s = quant.encode(torch.zeros(4, 8, 16), torch.float8_e4m3fn)
        assert torch.equal(t["checkpoint"][page].view(torch.uint8), want_q.view(torch.uint8))
        assert torch.equal(t[SCALE_NAME][page], want_s)
    assert torch.equal(m.read_state(rid, 0), torch.zeros(4, 8, 16))
    assert is_quantized(g.state_dtype)
