"""The real-engine results as the markdown table docs/vllm.md carries."""

from __future__ import annotations


def markdown_table(rows: list[dict]) -> str:
    head = ("| vLLM | backend | state | K | compiled | case | tokens matched | max logprob error | "
            "drafted / accepted | windows rejected whole | preemptions |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        p = r["plugin"]
        windows = f"{p.get('windows rejected whole', 0)} / {p.get('windows', 0)}" if r["K"] else "-"
        lines.append(
            f"| {r['vllm']} | {r['backend']} | {r.get('state_dtype', 'fp32')} | {r['K']} | "
            f"{'yes' if r['compiled'] else 'no'} | {r['case']} | "
            f"{r['tokens_matched']}/{r['tokens']} | {r['max_logprob_err']:.1e} | "
            f"{int(r['drafted'])} / {int(r['accepted'])} | {windows} | {int(r['preemptions'])} |")
    return "\n".join(lines)
