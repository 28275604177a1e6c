"""A report ready to paste into an issue: root cause, fix, facts table, the evidence folded away."""
from __future__ import annotations

import re

from vllm_doctor.findings import Diagnosis, Finding, Rewrite
from vllm_doctor.reports.brief import MANY


_TICKS = re.compile(r"`+")


def _fenced(lines: list[str], info: str = "") -> list[str]:
    """A code block around `lines` whose fence no line can close: longer than any backtick run in them
    (a log or command line holding ``` would otherwise end the block and turn the rest into markdown)."""
    longest = max((len(m) for line in lines for m in _TICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *lines, fence]


def _code(text: str) -> str:
    """`text` as inline code, whatever backticks it holds (CommonMark: a longer backtick string around it)."""
    ticks = "`" * (max((len(m) for m in _TICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _cell(value: object) -> str:
    """A table cell on one line (a newline in a value would end the row)."""
    return " ".join(str(value).replace("|", "/").split())


def _rewrite(rw: Rewrite | None) -> list[str]:
    """The fix in the user's shape: a command to run only when it is one (findings.Rewrite)."""
    if rw is None:
        return []
    out: list[str] = []
    if rw.form in ("command", "rebuilt") and rw.command:
        if rw.was and rw.was.split() != rw.command.split():
            out += ["Before:", "", *_fenced([rw.was], "sh"), ""]
        label = "Run (rebuilt from the arguments vLLM logged):" if rw.form == "rebuilt" else "Run:"
        out += [label, "", *_fenced([rw.command], "sh"), ""]
    elif rw.form == "edit":
        out += [f"Edit: {rw.instruction}", ""]
    elif rw.form == "flags":
        out += ["Change: " + "; ".join(_code(c) for c in rw.changes), "", rw.instruction, ""]
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
            out.append(f"- {summary}" + (f": {_code(command)}" if command else ""))
        if f.alternatives:
            out.append("")
    if f.evidence:
        lines = [f"{ln.source or '<stdin>'}:{ln.lineno}: {ln.raw}" for ln in f.evidence]
        if f.more_like_it >= MANY:
            lines.append(f"… and {f.more_like_it:,} more lines like these")
        out += ["<details><summary>Evidence</summary>", "", *_fenced(lines), "", "</details>", ""]
    return out


def _first_failure(d: Diagnosis) -> list[str]:
    """Where it started, in a log of several nodes or processes (the JSON's first_failure; nothing on one
    machine, whose report reads as before)."""
    from vllm_doctor.reports.json_report import first_failure

    if d.nodes is None and "failed_first_line" not in d.findings[0].facts:
        return []
    first = first_failure(d)
    if not first or not (first["node"] or first["process"]):
        return []
    where = ", ".join(f"{k} {_code(str(first[k]))}" for k in ("node", "process", "rank") if first[k] is not None)
    out = [f"**First failure:** {where}, line {first['line']}", ""]
    if d.nodes is not None and (d.nodes.followed or d.nodes.tied):
        out += [f"Then: {d.nodes.after()}", ""]
    return out


def render_markdown(d: Diagnosis, verbose: int = 0) -> str:
    where = ", ".join(d.sources) or "<stdin>"
    out = [f"# vllm-doctor report for {where}", ""]
    if not d.findings:
        out += ["No problem found.", ""]
    for i, f in enumerate(d.findings):
        out += _finding(f, d.combined, i == 0)
        if i == 0:
            out += _first_failure(d)
    rows = [(k, fact) for k, fact in d.facts.items() if not isinstance(fact.value, (list, dict))]
    if rows:
        out += ["## Facts", "", "| fact | value | source |", "|---|---|---|"]
        out += [f"| `{k}` | {_cell(fact.value)} | {fact.source} |" for k, fact in rows]
        out.append("")
    for earlier in reversed(d.earlier):
        out += [f"## Earlier run: {earlier.run_label or 'before this one'}", ""]
        out += [f"- `{f.rule}`: {f.title}" for f in earlier.findings] or ["- no problem found"]
        out.append("")
    return "\n".join(out)
