"""A report ready to paste into an issue: root cause, fix, facts table, the evidence folded away."""
from __future__ import annotations

from vllm_doctor.findings import Diagnosis, Finding, Rewrite
from vllm_doctor.reports.brief import MANY


def _rewrite(rw: Rewrite | None) -> list[str]:
    """The fix in the user's shape: a command to run only when it is one (findings.Rewrite)."""
    if rw is None:
        return []
    out: list[str] = []
    if rw.form in ("command", "rebuilt") and rw.command:
        if rw.was and rw.was.split() != rw.command.split():
            out += ["Before:", "", "```sh", rw.was, "```", ""]
        label = "Run (rebuilt from the arguments vLLM logged):" if rw.form == "rebuilt" else "Run:"
        out += [label, "", "```sh", rw.command, "```", ""]
    elif rw.form == "edit":
        out += [f"Edit: {rw.instruction}", ""]
    elif rw.form == "flags":
        out += ["Change: " + "; ".join(f"`{c}`" for c in rw.changes), "", rw.instruction, ""]
    else:
        out += ["Then rerun your command, unchanged.", ""]
    if len(rw.rules) > 1:
        out += ["This fixes " + ", ".join(f"`{r}`" for r in rw.rules) + ".", ""]
    out += [f"> **Conflict:** {c}  " for c in rw.conflicts] + ([""] if rw.conflicts else [])
    return out


def _finding(f: Finding, combined: Rewrite | None, root: bool) -> list[str]:
    out = [f"## {'Root cause' if root else 'Also found'}: {f.title}", "",
           f"`{f.rule}` · severity **{f.severity}** · confidence **{f.confidence}**", ""]
    out += [f.explanation.replace("\n", "  \n"), ""]
    if f.notes or f.errors:
        out += [f"> **Note:** {n}  " for n in f.notes] + [f"> **Error:** {e}  " for e in f.errors] + [""]
    if f.fix is not None:
        out += [f"**Fix:** {f.fix.summary}", ""]
        if root:
            out += _rewrite(combined or f.rewrite)
        for summary, command in f.alternatives:
            out.append(f"- {summary}" + (f": `{command}`" if command else ""))
        if f.alternatives:
            out.append("")
    if f.evidence:
        out += ["<details><summary>Evidence</summary>", "", "```"]
        out += [f"{ln.source or '<stdin>'}:{ln.lineno}: {ln.raw}" for ln in f.evidence]
        if f.more_like_it >= MANY:
            out.append(f"… and {f.more_like_it:,} more lines like these")
        out += ["```", "", "</details>", ""]
    return out


def render_markdown(d: Diagnosis, verbose: int = 0) -> str:
    where = ", ".join(d.sources) or "<stdin>"
    out = [f"# vllm-doctor report for {where}", ""]
    if not d.findings:
        out += ["No problem found.", ""]
    for i, f in enumerate(d.findings):
        out += _finding(f, d.combined, i == 0)
    rows = [(k, fact) for k, fact in d.facts.items() if not isinstance(fact.value, (list, dict))]
    if rows:
        out += ["## Facts", "", "| fact | value | source |", "|---|---|---|"]
        out += [f"| `{k}` | {str(fact.value).replace('|', '/')} | {fact.source} |" for k, fact in rows]
        out.append("")
    for earlier in reversed(d.earlier):
        out += [f"## Earlier run: {earlier.run_label or 'before this one'}", ""]
        out += [f"- `{f.rule}`: {f.title}" for f in earlier.findings] or ["- no problem found"]
        out.append("")
    return "\n".join(out)
