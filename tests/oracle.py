"""Token-by-token serial oracle for the Mamba2 recurrence and the causal conv (tests only).

Keeps, per request and layer, the SSM state and the conv history in float64;
a step runs the recurrence one token at a time and remembers the state after
every token, so a commit of ``a`` tokens just picks state ``a``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SerialOracle:
    def __init__(self, num_layers: int, H: int, P: int, N: int, G: int, conv_dim: int, conv_kernel: int) -> None:
        self.L, self.H, self.P, self.N, self.G = num_layers, H, P, N, G
        self.conv_dim, self.k = conv_dim, conv_kernel
        self.ssm: dict[object, list[torch.Tensor]] = {}
        self.conv: dict[object, list[torch.Tensor]] = {}
        self._pending_ssm: dict[object, list[list[torch.Tensor]]] = {}
        self._pending_conv: dict[object, list[list[torch.Tensor]]] = {}

    def admit(self, rid: object) -> None:
        self.ssm[rid] = [torch.zeros(self.H, self.P, self.N, dtype=torch.float64) for _ in range(self.L)]
        self.conv[rid] = [torch.zeros(self.conv_dim, self.k - 1, dtype=torch.float64) for _ in range(self.L)]

    def release(self, rid: object) -> None:
        del self.ssm[rid], self.conv[rid]

    def write_state(self, rid: object, layer: int, state: torch.Tensor, conv: torch.Tensor | None) -> None:
        self.ssm[rid][layer] = state.double().clone()
        if conv is not None:
            self.conv[rid][layer] = conv.double().clone()

    def verify(self, rid: object, layer: int, x, dt, B, C, A, D=None, dt_bias=None, z=None) -> torch.Tensor:
        """Outputs (q, H, P) float64 for one request's window; remembers every intermediate state."""
        S = self.ssm[rid][layer].clone()
        h2g = torch.arange(self.H) // (self.H // self.G)
        dtp = dt.double()
        if dt_bias is not None:
            dtp = dtp + dt_bias.double()
        dtp = F.softplus(dtp)
        states = [S.clone()]
        ys = []
        for t in range(x.shape[0]):
            a = torch.exp(A.double() * dtp[t])
            Bt = B[t].double()[h2g]
            Ct = C[t].double()[h2g]
            S = a[:, None, None] * S + dtp[t][:, None, None] * x[t].double()[:, :, None] * Bt[:, None, :]
            y = torch.einsum("hpn,hn->hp", S, Ct)
            if D is not None:
                y = y + D.double()[:, None] * x[t].double()
            if z is not None:
                y = y * F.silu(z[t].double())
            ys.append(y)
            states.append(S.clone())
        self._pending_ssm.setdefault(rid, [None] * self.L)[layer] = states
        return torch.stack(ys)

    def conv_step(self, rid: object, layer: int, xBC, weight, bias=None, activation="silu") -> torch.Tensor:
        hist = self.conv[rid][layer]
        seq = torch.cat([hist, xBC.double().T], dim=1)
        q = xBC.shape[0]
        out = []
        for t in range(q):
            y = (seq[:, t:t + self.k] * weight.double()).sum(-1)
            if bias is not None:
                y = y + bias.double()
            if activation == "silu":
                y = F.silu(y)
            out.append(y)
        hists = [seq[:, a:a + self.k - 1].clone() for a in range(q + 1)]
        self._pending_conv.setdefault(rid, [None] * self.L)[layer] = hists
        return torch.stack(out)

    def commit(self, rid: object, accepted: int) -> None:
        for layer, states in enumerate(self._pending_ssm.pop(rid, [None] * self.L)):
            if states is not None:
                self.ssm[rid][layer] = states[accepted]
        for layer, hists in enumerate(self._pending_conv.pop(rid, [None] * self.L)):
            if hists is not None:
                self.conv[rid][layer] = hists[accepted]
