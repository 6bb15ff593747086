"""Tiny Nemotron-H checkpoints built in code (no hub download) for the real-engine test.

* ``random``: weights N(0, 0.05), ``lm_head`` x40, so greedy argmax is far from ties (HF cached,
  HF uncached and vLLM without spec decode agree token for token) yet depends on every mixer's state.
  n-gram drafts rarely hit: most verify windows are rejected whole.
* ``cycle``: the residual stream is the token embedding plus small mixer outputs, and ``lm_head``
  maps each token's embedding onto the next token of a fixed permutation with cycles of length 8.
  Greedy text walks those cycles, so once a cycle has been seen n-gram drafts hit and most are
  accepted; the mixers still move every logit (and so every logprob) through the Mamba state.
"""

from __future__ import annotations

import json
import os
import sys

import torch

VOCAB = 512
CYCLE = 8


def config():
    from transformers import NemotronHConfig

    return NemotronHConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        hybrid_override_pattern="M*M-", num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=64,
        max_position_embeddings=1024, tie_word_embeddings=False, mamba_hidden_act="silu", mlp_hidden_act="relu2",
        torch_dtype="float32", bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def _skip(name: str) -> bool:
    """Parameters left at their HF initialisation (A, D, dt bias, norms)."""
    last = name.split(".")[-1]
    return "A_log" in name or last == "D" or "dt_bias" in name or "norm" in name


def build(kind: str, out: str, seed: int = 0) -> None:
    """Write a ``kind`` ("random" or "cycle") checkpoint to directory ``out``."""
    from transformers import NemotronHForCausalLM

    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config()).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not _skip(name):
                p.normal_(0, 0.05)
        if kind == "random":
            model.lm_head.weight.mul_(40.0)
        elif kind == "cycle":
            emb = model.get_input_embeddings().weight
            emb.normal_(0, 1.0)
            g = torch.Generator().manual_seed(seed + 1)
            order = torch.randperm(VOCAB, generator=g)
            nxt = torch.empty(VOCAB, dtype=torch.long)
            for c in range(0, VOCAB, CYCLE):  # cycles of CYCLE tokens
                ids = order[c: c + CYCLE]
                nxt[ids] = ids.roll(-1)
            # logits[y] = w[y] . h, h ~ emb[x]: the row of y = nxt[x] is emb[x] (margin ~ 10 over N(0, 1) rivals)
            # The mixers (N(0, 0.05) weights) shift logits by O(1): greedy margins stay above 3.
            model.lm_head.weight.zero_()
            model.lm_head.weight[nxt] = emb * (10.0 / emb.shape[1])
        else:
            raise ValueError(f"unknown model kind {kind!r}")
    model.save_pretrained(out)
    if kind == "cycle":
        with open(os.path.join(out, "cycle.json"), "w") as f:
            json.dump(nxt.tolist(), f)


def cycle_walk(model_dir: str, start: int, length: int) -> list[int]:
    """``length`` tokens of the cycle model's permutation from ``start`` (a prompt its drafts will hit)."""
    with open(os.path.join(model_dir, "cycle.json")) as f:
        nxt = json.load(f)
    walk = [start]
    while len(walk) < length:
        walk.append(nxt[walk[-1]])
    return walk


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2])
