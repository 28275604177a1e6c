"""What the TUI shows, computed from a Diagnosis with Rich only (no Textual): testable without an app.

Nothing here decides anything: the findings, their order, the fix command and the facts are the
pipeline's (the same objects the JSON report serialises); this module only lays them out.
"""
from __future__ import annotations

import difflib
import re
import shlex
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from vllm_doctor.reports.brief import SEVERITY_STYLE

SEVERITY_MARK = {"error": "✖", "warning": "▲", "info": "●"}
STATUS_STYLE = {"healthy": "bold green", "failing": "bold red", "running": "bold yellow",
                "diagnosing": "bold cyan", "unreadable": "bold red"}


def status_of(diagnosis, running: bool = False, diagnosing: bool = False) -> str:
    """`diagnosing`: the live session waits for the rest of a traceback before it says anything."""
    if running:
        return "running"
    if diagnosis is None or (diagnosing and not diagnosis.findings):
        return "diagnosing"
    return "healthy" if not diagnosis.findings else "failing"


def _gpus(facts) -> str | None:
    devices = facts.get("gpu.devices")
    count = facts.get("gpu.count")
    if isinstance(devices, list) and devices:
        names: dict[str, int] = {}
        for d in devices:
            if isinstance(d, dict):
                name = str(d.get("name") or "GPU")
                names[name] = names.get(name, 0) + 1
        text = ", ".join(f"{n}× {name}" for name, n in names.items())
        src = facts.source("gpu.devices")
        return f"{text} ({src})" if src else text
    if count is not None:
        return f"{count} ({facts.source('gpu.count')})"
    tp = facts.get("args.tensor_parallel_size")
    pp = facts.get("args.pipeline_parallel_size")
    if tp or pp:
        return f"tp={tp or 1} pp={pp or 1} (log)"
    return None


def header_fields(diagnosis, running: bool = False, diagnosing: bool = False) -> dict[str, str]:
    """vLLM version, model, GPUs and status, '?' for what the log did not reveal."""
    out = {"version": "?", "model": "?", "gpus": "?", "status": status_of(diagnosis, running, diagnosing)}
    if diagnosis is None:
        return out
    facts = diagnosis.facts
    out["version"] = str(facts.get("vllm.version") or "?")
    out["model"] = str(facts.get("args.model") or "?")
    out["gpus"] = _gpus(facts) or "?"
    return out


def header_text(diagnosis, title: str, running: bool = False, extra: str = "", diagnosing: bool = False) -> Text:
    f = header_fields(diagnosis, running, diagnosing)
    text = Text()
    text.append(" vllm-doctor ", style="bold reverse")
    text.append(" ")
    text.append(f.get("status", "").upper(), style=STATUS_STYLE.get(f["status"], "bold"))
    text.append(f"  {title}", style="bold")
    if extra:
        text.append(f"  {extra}", style="dim")
    text.append("\n")
    text.append(" vLLM ", style="dim")
    text.append(f["version"], style="cyan")
    text.append("  model ", style="dim")
    text.append(f["model"], style="cyan")
    text.append("  GPUs ", style="dim")
    text.append(f["gpus"], style="cyan")
    return text


def finding_label(finding, index: int) -> Text:
    mark = SEVERITY_MARK.get(finding.severity, "●")
    text = Text()
    text.append("ROOT " if index == 0 else "also ", style="bold" if index == 0 else "dim")
    text.append(f"{mark} ", style=SEVERITY_STYLE.get(finding.severity, "bold"))
    text.append(finding.title)
    text.append(f"  {finding.severity}·{finding.confidence}", style="dim")
    return text


# ---- Cause ----------------------------------------------------------------------------------------
def cause_renderable(finding) -> Text:
    text = Text()
    text.append(finding.title + "\n", style=SEVERITY_STYLE.get(finding.severity, "bold"))
    text.append(f"{finding.rule} · severity {finding.severity} · confidence {finding.confidence}\n\n",
                style="dim")
    explanation = finding.explanation or "(no explanation)"
    prose, _, arithmetic = explanation.partition("\n\n")
    # the rule's TOML breaks its prose at ~115 columns: one paragraph, re-wrapped by the pane
    text.append(" ".join(ln.strip() for ln in prose.strip().split("\n")) + "\n")
    if arithmetic.strip():
        text.append("\nArithmetic\n", style="bold")
        for line in arithmetic.strip().split("\n"):
            text.append("  " + line + "\n", style="cyan")
    for note in finding.notes:
        text.append("note: ", style="yellow")
        text.append(note + "\n")
    for error in getattr(finding, "errors", ()):
        text.append("error: ", style="bold red")
        text.append(error + "\n")
    if finding.facts:
        text.append("\nCaptured from the log\n", style="bold")
        for key, value in finding.facts.items():
            text.append(f"  {key} = ", style="dim")
            text.append(f"{value}\n")
    return text


# ---- Fix ------------------------------------------------------------------------------------------
TOKEN = re.compile(r"""(?:[^\s'"]+|'[^']*'?|"(?:\\.|[^"\\])*"?)+""")


def _spans(command: str) -> list[tuple[str, int, int]]:
    """Shell-ish words of `command` with their positions; quotes kept, so the text is never altered."""
    return [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(command)]


def _tokens(command: str) -> list[str]:
    return [t for t, _, _ in _spans(command)]


def command_diff(old: str | None, new: str | None) -> tuple[Text | None, Text | None]:
    """Old and new command, verbatim, with the changed words highlighted (removed: red strike,
    added or changed: black on green)."""
    if not new:
        return (Text(old, style="red") if old else None), None
    if not old:
        return None, Text(new, style="bold green")
    a, b = _spans(old), _spans(new)
    matcher = difflib.SequenceMatcher(a=[t for t, _, _ in a], b=[t for t, _, _ in b], autojunk=False)
    old_text, new_text = Text(old), Text(new, style="green")
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        for _, start, end in a[i1:i2]:
            old_text.stylize("bold red strike", start, end)
        for _, start, end in b[j1:j2]:
            new_text.stylize("bold black on green", start, end)
    return old_text, new_text


def changed_tokens(old: str | None, new: str | None) -> list[str]:
    """The words of `new` that are not in `old` at the same place (what the highlight marks)."""
    if not new:
        return []
    if not old:
        return _tokens(new)
    a, b = _tokens(old), _tokens(new)
    out = []
    for op, _, _, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            out += b[j1:j2]
    return out


def fix_parts(finding, old_command: str | None) -> tuple[Group, Text | None, Group, Text | None]:
    """The Fix pane in four parts: the prose (wraps to the pane), the was/run commands (never wrapped: the
    pane scrolls them sideways, so a mouse copy gives the whole command), the hint, environment and the
    alternatives' summaries (wrap), and the alternatives' commands (scroll like the first)."""

    if finding.fix is None:
        parts: list[Any] = [Text("No fix is computed for this finding.", style="yellow")]
        if finding.notes:
            parts.append(Text("\n".join(f"note: {n}" for n in finding.notes), style="dim"))
        for error in getattr(finding, "errors", ()):
            parts.append(Text(f"error: {error}", style="bold red"))
        return Group(*parts), None, Group(), None
    head = Text()
    head.append("Fix: ", style="bold green")
    head.append(finding.fix.summary or "")
    rewrite = getattr(finding, "rewrite", None)
    runnable = rewrite is None or rewrite.runnable
    old_text, new_text = command_diff(old_command, finding.fix_command if runnable else None)
    grid: list[tuple[Text, Text]] = []
    if old_text is not None and new_text is not None and old_command != finding.fix_command:
        grid.append((Text("was:", style="dim"), old_text))
    if new_text is not None:
        grid.append((Text("run:", style="bold"), new_text))
    elif rewrite is not None and rewrite.form == "edit":            # compose, pod spec, LLM(...) script
        grid.append((Text("edit:", style="bold"), Text(rewrite.instruction, style="green")))
    elif rewrite is not None and rewrite.form == "flags":
        grid.append((Text("change:", style="bold"), Text("; ".join(rewrite.changes), style="green")))
        grid.append((Text(""), Text(rewrite.instruction, style="dim")))
    elif rewrite is not None:
        grid.append((Text("then:", style="bold"), Text("rerun your command, unchanged")))
    tail: list[Any] = []
    if finding.fix_command:
        tail.append(Text("     y send to the clipboard (OSC 52) · s save to a file", style="dim italic"))
    if finding.env:
        tail += [Text(""), Text("environment:", style="bold")]
        tail += [Text(f"  {name}={value}", style="green") for name, value in finding.env.items()]
    alt_commands: list[tuple[Text, Text]] = []
    if finding.alternatives:
        tail += [Text(""), Text("Alternatives", style="bold")]
        alts = Table.grid(padding=(0, 1))
        alts.add_column(no_wrap=True)
        alts.add_column(overflow="fold")
        for n, (summary, command) in enumerate(finding.alternatives, 1):
            alts.add_row(Text(f"{n}.", style="bold"), Text(summary))
            if command:
                alt_commands.append((Text(f"or {n}:", style="bold"), Text(command, style="green")))
        tail.append(alts)
    return Group(head, Text("")), _unwrapped(grid), Group(*tail), _unwrapped(alt_commands)


def _unwrapped(rows: list[tuple[Text, Text]]) -> Text | None:
    """Rows of (label, command) as one Text that never wraps: its width is its longest row's, which the pane
    scrolls. None for no rows."""
    if not rows:
        return None
    pad = max(len(label.plain) for label, _ in rows) + 1
    out = Text(no_wrap=True, overflow="ignore")
    for i, (label, text) in enumerate(rows):
        out.append_text(label)
        out.append(" " * (pad - len(label.plain)))
        out.append_text(text)
        if i + 1 < len(rows):
            out.append("\n")
    return out


def fix_renderable(finding, old_command: str | None) -> Group:
    """The whole Fix pane as one renderable (what `s` saves as the report)."""
    head, commands, tail, alt_commands = fix_parts(finding, old_command)
    return Group(*(part for part in (head, commands, tail, alt_commands) if part is not None))


def fix_command_text(finding) -> str | None:
    """The text `y` copies and `s` saves: env assignments (if any) then the corrected command."""
    if finding is None or not finding.fix_command:
        return None
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (finding.env or {}).items())
    return f"{env} {finding.fix_command}" if env and finding.fix_command and not any(
        f"{k}=" in finding.fix_command for k in finding.env) else finding.fix_command


# ---- Facts ----------------------------------------------------------------------------------------
def memory_bar(used: float | None, total: float | None, width: int = 20) -> Text:
    if not total:
        return Text("?" * 0 + "memory unknown", style="dim")
    frac = max(0.0, min(1.0, (used or 0) / total))
    filled = int(round(frac * width))
    style = "red" if frac > 0.9 else "yellow" if frac > 0.6 else "green"
    bar = Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")
    bar.append(f" {(used or 0) / 1024:.1f}/{total / 1024:.1f} GiB", style="")
    return bar


def _matrix_table(title: str, matrix) -> Group | None:
    if not isinstance(matrix, list) or not matrix or not all(isinstance(r, list) for r in matrix):
        return None
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    for j in range(len(matrix)):
        table.add_column(f"GPU{j}", justify="center")
    for i, row in enumerate(matrix):
        cells = []
        for cell in row:
            c = str(cell)
            style = "green" if c in ("OK", "NV1", "NV2", "NV4", "NV8", "NV12", "NV18") or c.startswith("NV") \
                else "red" if c in ("NS", "SYS") else "dim" if c == "X" else "yellow"
            cells.append(Text(c, style=style))
        table.add_row(f"  GPU{i}", *cells)
    return Group(Text(f"  {title}", style="bold"), table)


SECTIONS = (("Model", ("model.", "args.model")), ("Launch", ("args.", "launch.")),
            ("Log", ("vllm.", "log.")), ("GPUs", ("gpu.",)), ("Environment", ("env.",)))


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in list(value.items())[:30]) or "{}"
    if isinstance(value, list):
        return ", ".join(map(str, value[:30]))
    return str(value)


def facts_renderable(facts) -> Group:
    parts: list[Any] = []
    items = list(facts.items())
    if not items:
        return Group(Text("No facts: the log revealed none and none were gathered.", style="dim"))
    done: set[str] = set()
    for title, prefixes in SECTIONS:
        rows = [(k, f) for k, f in items if k not in done and any(k.startswith(p) for p in prefixes)]
        if not rows:
            continue
        parts.append(Text(title, style="bold underline"))
        if title == "GPUs":
            devices = facts.get("gpu.devices")
            if isinstance(devices, list) and devices:
                src = facts.source("gpu.devices")
                for d in devices:
                    if not isinstance(d, dict):
                        continue
                    line = Text(f"  GPU{d.get('index', '?')} ", style="bold")
                    line.append(f"{d.get('name', '?')}  ")
                    if d.get("error"):
                        line.append(str(d["error"]), style="red")
                    else:
                        line += memory_bar(d.get("memory_used_mib"), d.get("memory_total_mib"))
                    line.append(f"  ({src})", style="dim")
                    parts.append(line)
            p2p = facts.get("gpu.p2p")
            if isinstance(p2p, dict):
                for label, matrix in p2p.items():
                    table = _matrix_table(f"P2P {label} ({facts.source('gpu.p2p')})", matrix)
                    if table is not None:
                        parts.append(table)
            elif isinstance(p2p, list):
                table = _matrix_table(f"P2P ({facts.source('gpu.p2p')})", p2p)
                if table is not None:
                    parts.append(table)
            topo = _matrix_table(f"Topology ({facts.source('gpu.topology')})", facts.get("gpu.topology"))
            if topo is not None:
                parts.append(topo)
            done |= {"gpu.devices", "gpu.p2p", "gpu.topology"}
            rows = [(k, f) for k, f in rows if k not in done]
        table = Table(box=None, pad_edge=False, show_header=False, expand=False)
        table.add_column("fact", style="cyan", no_wrap=True)
        table.add_column("value", overflow="fold")
        table.add_column("from", style="dim", no_wrap=True)
        for key, fact in rows:
            done.add(key)
            table.add_row("  " + key, _fmt(fact.value)[:400], fact.source)
        if rows:
            parts.append(table)
        parts.append(Text(""))
    rest = [(k, f) for k, f in items if k not in done]
    if rest:
        parts.append(Text("Other", style="bold underline"))
        table = Table(box=None, pad_edge=False, show_header=False)
        table.add_column("fact", style="cyan", no_wrap=True)
        table.add_column("value", overflow="fold")
        table.add_column("from", style="dim", no_wrap=True)
        for key, fact in rest:
            table.add_row("  " + key, _fmt(fact.value)[:400], fact.source)
        parts.append(table)
    conflicts = getattr(facts, "conflicts", [])
    for key, kept, rejected in conflicts[:5]:
        parts.append(Text(f"conflict: {key} = {kept.value!r} ({kept.source}) but {rejected.source} says "
                          f"{rejected.value!r}", style="yellow"))
    if any(f.source in ("nvml", "env") for _, f in items):
        parts.append(Text("facts from nvml/env describe this machine, not necessarily the one that wrote "
                          "the log", style="dim"))
    return Group(*parts)


# ---- Evidence -------------------------------------------------------------------------------------
def evidence_lines(diagnosis, source: str | None) -> list[int]:
    """0-based numbers, ascending, of the lines of `source` that a finding (of any run) stands on, as
    evidence or support, or a predictive warning."""
    if diagnosis is None or source is None:
        return []
    findings = [f for run in (*getattr(diagnosis, "earlier", ()), diagnosis) for f in run.findings]
    lines = [ln for f in findings for ln in (*f.evidence, *f.supporting)] + [m.line for m in diagnosis.warnings]
    return sorted({ln.lineno - 1 for ln in lines if ln.source == source and ln.lineno > 0})


def evidence_renderable(finding, k: int, reader, radius: int = 6):
    """Evidence line k of the finding with `radius` lines of log around it, the line highlighted.

    `reader(source) -> LogIndex | None` gives the index of a source file (None: show the line alone).
    Context lines are cut at the pane's edge; the evidence line itself wraps so it is read in full.
    """
    evidence = finding.evidence if finding is not None else []
    if not evidence:
        return Text("This finding has no evidence lines.", style="dim")
    k = max(0, min(k, len(evidence) - 1))
    line = evidence[k]
    where = f"{line.source or '<stdin>'}:{line.lineno}"
    head = Text()
    head.append(f"evidence {k + 1}/{len(evidence)}  ", style="bold")
    head.append(where, style="cyan")
    head.append("   n next · p previous · o open in log", style="dim")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(overflow="fold")
    index = reader(line.source) if reader else None
    lineno = line.lineno
    if index is None or index.line_count < lineno:
        grid.add_row(Text(f"{lineno}▶", style="bold yellow"), Text(line.raw, style="bold reverse"))
        return Group(head, Text(""), grid)
    first = max(1, lineno - radius)
    last = min(index.line_count, lineno + radius)
    for n in range(first, last + 1):
        body = index.line(n - 1)
        if n == lineno:
            grid.add_row(Text(f"{n}▶", style="bold yellow"), Text(body, style="bold reverse"))
        else:
            grid.add_row(Text(f"{n} ", style="dim"), Text(body, no_wrap=True, overflow="ellipsis"))
    return Group(head, Text(""), grid)
