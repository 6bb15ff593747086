"""Drive a StateManager and the serial oracle through the same schedule and compare."""

from __future__ import annotations

import random

import torch

from ssmstate import Mamba2Geometry, PageLayout, SpecConfig, StateManager
from tests.oracle import SerialOracle


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-6))


class Harness:
    """One manager + one oracle; every verb applied to both, every output compared."""

    def __init__(self, geom: Mamba2Geometry, spec: SpecConfig, num_pages: int, scheme: str = "replay",
                 backend: str = "reference", device: str = "cpu", seed: int = 0, use_conv: bool = True,
                 use_extras: bool = True, tol: float = 1e-5) -> None:
        self.g, self.spec = geom, spec
        layout = PageLayout.replay(geom, spec) if scheme == "replay" else PageLayout.native(geom, spec)
        self.m = StateManager(layout, num_pages, device=device, backend=backend)
        H, P, N, G = geom.heads_per_rank, geom.head_dim, geom.state_size, geom.groups_per_rank
        self.o = SerialOracle(geom.num_layers, H, P, N, G, geom.conv_dim_per_rank, geom.conv_kernel)
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.use_conv, self.tol = use_conv, tol
        gen = self.gen
        self.params = []
        for _ in range(geom.num_layers):
            A = -(torch.rand(H, generator=gen) * 1.0 + 0.3)
            D = torch.randn(H, generator=gen) if use_extras else None
            dt_bias = torch.randn(H, generator=gen) * 0.3 if use_extras else None
            w = torch.randn(geom.conv_dim_per_rank, geom.conv_kernel, generator=gen) * 0.5
            bias = torch.randn(geom.conv_dim_per_rank, generator=gen) * 0.1 if use_extras else None
            self.params.append((A, D, dt_bias, w, bias))
        self.active: list[object] = []
        self.saved: dict[object, object] = {}
        self.next_id = 0
        self.max_err = 0.0

    def _dev(self, t):
        return None if t is None else t.to(self.device)

    def admit(self) -> object:
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.m.admit(rid)
        self.o.admit(rid)
        self.active.append(rid)
        return rid

    def release(self, rid: object) -> None:
        self.m.release(rid)
        self.o.release(rid)
        self.active.remove(rid)

    def write_random_state(self, rid: object) -> None:
        g = self.g
        for layer in range(g.num_layers):
            S = torch.randn(g.heads_per_rank, g.head_dim, g.state_size, generator=self.gen)
            conv = torch.randn(g.conv_dim_per_rank, g.conv_kernel - 1, generator=self.gen)
            S_stored = S.to(g.state_dtype)
            conv_stored = conv.to(g.conv_state_dtype)
            self.m.write_state(rid, layer, self._dev(S), self._dev(conv))
            self.o.write_state(rid, layer, S_stored.double(), conv_stored.double())

    def step(self, rids: list[object], qs: list[int], accepted: list[int] | None, pad: int = 0,
             device_counts: bool = False) -> None:
        g, m = self.g, self.m
        H, P, N, G = g.heads_per_rank, g.head_dim, g.state_size, g.groups_per_rank
        plan = m.begin_step(rids, qs, pad_to=len(rids) + pad if pad else None)
        L = plan.total_tokens
        act = g.act_dtype
        cu = plan.cu_seqlens_host.tolist()
        for layer in range(g.num_layers):
            A, D, dt_bias, w, bias = self.params[layer]
            if self.use_conv:
                xBC = torch.randn(L, g.conv_dim_per_rank, generator=self.gen).to(act)
                yc = m.conv(layer, plan, self._dev(xBC), self._dev(w), self._dev(bias)).cpu()
                for i, rid in enumerate(rids):
                    ref = self.o.conv_step(rid, layer, xBC[cu[i]:cu[i + 1]], w, bias)
                    self._cmp(yc[cu[i]:cu[i + 1]], ref, f"conv layer {layer} {rid}", scale_tol=max(self.tol, 8e-3) if act != torch.float32 else self.tol)
            x = torch.randn(L, H, P, generator=self.gen).to(act)
            dt = torch.randn(L, H, generator=self.gen) * 0.5 - 0.5
            Bm = torch.randn(L, G, N, generator=self.gen).to(act)
            Cm = torch.randn(L, G, N, generator=self.gen).to(act)
            z = torch.randn(L, H, P, generator=self.gen).to(act) if D is not None else None
            y = m.verify(layer, plan, self._dev(x), self._dev(dt), self._dev(Bm), self._dev(Cm), self._dev(A),
                         D=self._dev(D), dt_bias=self._dev(dt_bias), z=self._dev(z)).cpu()
            for i, rid in enumerate(rids):
                sl = slice(cu[i], cu[i + 1])
                ref = self.o.verify(rid, layer, x[sl], dt[sl], Bm[sl], Cm[sl], A, D, dt_bias,
                                    None if z is None else z[sl])
                self._cmp(y[sl], ref, f"verify layer {layer} {rid}")
        if accepted is None:
            m.rollback(plan)
            accepted = [0] * len(rids)
        elif device_counts:
            m.commit(plan, torch.tensor(accepted, dtype=torch.int32, device=self.device))
        else:
            m.commit(plan, accepted)
        for rid, a in zip(rids, accepted):
            self.o.commit(rid, a)

    def _cmp(self, got: torch.Tensor, want: torch.Tensor, what: str, scale_tol: float | None = None) -> None:
        """Relative error, scaled by the output norm, with a floor of 0.1·tol per element (rms).

        The floor keeps a near-cancelling handful of values (a 4-element output gated by
        silu(z) ≈ 0) from turning fp32 rounding into a false failure; for O(1) outputs of
        realistic size the relative term dominates.
        """
        tol = self.tol if scale_tol is None else scale_tol
        a, b = got.double(), want.double()
        scale = max(float(b.norm()), 0.1 * b.numel() ** 0.5)
        err = float((a - b).norm()) / scale
        self.max_err = max(self.max_err, err)
        assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g} (output norm {float(b.norm()):.3g})"

    def check_states(self, state_tol: float | None = None) -> None:
        tol = self.tol if state_tol is None else state_tol
        for rid in self.active:
            for layer in range(self.g.num_layers):
                got = self.m.read_state(rid, layer).cpu()
                self._cmp(got, self.o.ssm[rid][layer], f"state layer {layer} {rid}", scale_tol=tol)
                if self.use_conv:
                    conv = self.m.read_conv(rid, layer).cpu()
                    assert torch.equal(conv.double(), self.o.conv[rid][layer].to(self.g.conv_state_dtype).double()), \
                        f"conv history layer {layer} {rid}"


#: a tiny NemotronH config.json (4 layers, "M*M-") for tests against vLLM's real config and layer classes
TINY_NEMOTRON_H = {
    "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hidden_size": 64,
    "num_hidden_layers": 4, "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 8,
    "ssm_state_size": 8, "n_groups": 2, "conv_kernel": 4, "chunk_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "torch_dtype": "float32",
    "vocab_size": 256, "intermediate_size": 128, "rms_norm_eps": 1e-5, "layer_norm_epsilon": 1e-5,
    "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2", "use_conv_bias": True, "use_bias": False,
    "residual_in_fp32": False, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
}
