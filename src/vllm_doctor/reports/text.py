"""The terminal report (Rich): root cause first, evidence with file:line, explanation, old → new command."""
from __future__ import annotations

import io
import os

from vllm_doctor.findings import Diagnosis, Finding

SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}


def use_color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def _console(stream, color: bool):
    from rich.console import Console

    width = None if color else 100
    return Console(file=stream, force_terminal=color, no_color=not color, color_system="auto" if color else None,
                   width=width, highlight=False, soft_wrap=not color)


def _command_block(console, old: str | None, new: str | None, unchanged: bool = False) -> None:
    from rich.text import Text

    if unchanged and old:
        console.print(Text("  then rerun, unchanged:  ", style="dim") + Text(old, style="green"))
        return
    if old and old != new:
        console.print(Text("  was:  ", style="dim") + Text(old, style="red"))
    if new:
        console.print(Text("  run:  ", style="dim") + Text(new, style="bold green"))


def _finding(console, f: Finding, index: int, old_command: str | None) -> None:
    from rich.text import Text

    label = "Root cause" if index == 0 else "Also found"
    head = Text(f"{label}: ", style="bold") + Text(f.title, style=SEVERITY_STYLE.get(f.severity, "bold"))
    head += Text(f"  [{f.rule}, {f.severity}, confidence {f.confidence}]", style="dim")
    console.print(head)
    for line in f.evidence:
        where = f"{line.source or '<stdin>'}:{line.lineno}"
        console.print(Text(f"  {where}: ", style="cyan") + Text(line.raw.strip()[:300]))
    for line in f.supporting[:3]:
        where = f"{line.source or '<stdin>'}:{line.lineno}"
        console.print(Text(f"  {where}: ", style="dim cyan") + Text(line.raw.strip()[:200], style="dim")
                      + Text("  (related)", style="dim"))
    if index == 0 or f.rule != "unrecognized":
        console.print()
        for para in f.explanation.split("\n"):
            console.print(Text("  " + para if para else ""))
        for note in f.notes:
            console.print(Text("  note: ", style="yellow") + Text(note))
        for error in f.errors:
            console.print(Text("  error: ", style="bold red") + Text(error))
    if f.fix is not None:
        console.print()
        console.print(Text("  Fix: ", style="bold green") + Text(f.fix.summary))
        _command_block(console, old_command, f.fix_command, f.unchanged)
        for name, value in f.env.items():
            console.print(Text(f"  env:  {name}={value}", style="dim"))
        for summary, command in f.alternatives:
            console.print(Text("  or: ", style="dim") + Text(summary))
            if command:
                console.print(Text("        " + command, style="green"))
    console.print()


def _facts_table(console, d: Diagnosis) -> None:
    from rich.table import Table

    rows = [(k, fact) for k, fact in d.facts.items()
            if k.split(".", 1)[0] in ("vllm", "args", "model", "gpu", "log", "launch") and k != "gpu.devices"]
    if not rows:
        return
    table = Table(title="Facts used", title_justify="left", show_edge=False, pad_edge=False, box=None)
    table.add_column("fact", style="cyan")
    table.add_column("value")
    table.add_column("from", style="dim")
    for key, fact in rows[:40]:
        value = fact.value if not isinstance(fact.value, (list, dict)) else str(fact.value)[:80]
        table.add_row(key, str(value)[:100], fact.source)
    console.print(table)
    machine = d.facts.get("doctor.machine_facts") or {}
    if any(fact.source in ("nvml", "env") for _, fact in d.facts.items()) and machine.get("used", True):
        why = f": {machine['reason']}" if machine.get("reason") else ""
        console.print(f"  (facts marked nvml/env come from this machine{why})", style="dim")
    elif machine and not machine.get("used") and d.facts.source("doctor.machine_facts") == "env":
        console.print(f"  (this machine's GPUs and environment were left out: {machine['reason']}; "
                      "--live uses them)", style="dim")
    for key, kept, rejected in d.facts.conflicts[:5]:
        console.print(f"  conflict: {key} = {kept.value!r} ({kept.source}) but {rejected.source} says "
                      f"{rejected.value!r}", style="yellow")


def render_text(d: Diagnosis, stream=None, color: bool | None = None) -> str:
    """Render to `stream` (or return the text when stream is None)."""
    from rich.text import Text

    buffer = io.StringIO() if stream is None else stream
    color = use_color(buffer) if color is None else color
    console = _console(buffer, color)
    predicted = d.sources == ["predicted"]           # `vllm-doctor check`: a command, not a log
    where = "this command" if predicted else (", ".join(d.sources) or "<stdin>")
    size = "" if predicted else f" ({d.lines:,} line{'' if d.lines == 1 else 's'})"
    old = d.facts.get("launch.command")
    if not d.findings:
        verb = "no failure predicted for" if predicted else "no problem found in"
        console.print(f"vllm-doctor: {verb} {where}{size}.", style="bold green")
        for w in d.first_warnings()[:5]:       # Text: "[rule-id]" is not Rich markup
            console.print(Text(f"  warning seen: {w.line.message.strip()[:200]} [{w.rule_id}]", style="yellow"))
    else:
        console.print(f"vllm-doctor: {where}{size}", style="bold")
        console.print()
        for i, f in enumerate(d.findings):
            _finding(console, f, i, old)
        _facts_table(console, d)
    for notice in d.notices:
        console.print(f"  {notice}", style="dim")
    return buffer.getvalue() if stream is None else ""
