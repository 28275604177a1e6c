"""A report ready to paste into an issue: root cause, fix, facts table, the evidence folded away."""
from __future__ import annotations

from vllm_doctor.findings import Diagnosis, Finding


def _finding(f: Finding, old: str | None, root: bool) -> list[str]:
    out = [f"## {'Root cause' if root else 'Also found'}: {f.title}", "",
           f"`{f.rule}` · severity **{f.severity}** · confidence **{f.confidence}**", ""]
    out += [f.explanation.replace("\n", "  \n"), ""]
    if f.notes or f.errors:
        out += [f"> **Note:** {n}  " for n in f.notes] + [f"> **Error:** {e}  " for e in f.errors] + [""]
    if f.fix is not None:
        out += [f"**Fix:** {f.fix.summary}", ""]
        if f.fix_command:
            if old and old != f.fix_command:
                out += ["Before:", "", "```sh", old, "```", ""]
            out += ["Run:", "", "```sh", f.fix_command, "```", ""]
        elif f.unchanged and old:
            out += ["Then rerun, unchanged:", "", "```sh", old, "```", ""]
        for summary, command in f.alternatives:
            out.append(f"- {summary}" + (f": `{command}`" if command else ""))
        if f.alternatives:
            out.append("")
    if f.evidence:
        out += ["<details><summary>Evidence</summary>", "", "```"]
        out += [f"{ln.source or '<stdin>'}:{ln.lineno}: {ln.raw}" for ln in f.evidence]
        out += ["```", "", "</details>", ""]
    return out


def render_markdown(d: Diagnosis) -> str:
    where = ", ".join(d.sources) or "<stdin>"
    out = [f"# vllm-doctor report for {where}", ""]
    if not d.findings:
        out += ["No problem found.", ""]
    old = d.facts.get("launch.command")
    for i, f in enumerate(d.findings):
        out += _finding(f, old, i == 0)
    rows = [(k, fact) for k, fact in d.facts.items() if not isinstance(fact.value, (list, dict))]
    if rows:
        out += ["## Facts", "", "| fact | value | source |", "|---|---|---|"]
        out += [f"| `{k}` | {str(fact.value).replace('|', '/')} | {fact.source} |" for k, fact in rows]
        out.append("")
    return "\n".join(out)
