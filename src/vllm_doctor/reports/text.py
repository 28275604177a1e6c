"""The terminal report (Rich): the rows of reports/brief.py, prose wrapped to the width, commands whole."""
from __future__ import annotations

import io
import os
import sys

from vllm_doctor.findings import Diagnosis


def use_color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def terminal_width(stream) -> int:
    """The terminal's columns; COLUMNS, else 100, when the report goes to a file or a pipe."""
    import shutil

    if hasattr(stream, "isatty") and stream.isatty():
        return max(40, shutil.get_terminal_size((100, 24)).columns)
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return 100


def _console(stream, color: bool):
    from rich.console import Console

    # soft_wrap: Rich never breaks a line itself; brief rows are wrapped (prose) or kept whole (commands) here
    return Console(file=stream, force_terminal=color, no_color=not color, color_system="auto" if color else None,
                   width=10_000, highlight=False, soft_wrap=True)


def _print_rows(console, rows, width: int) -> None:
    import textwrap

    from rich.text import Text

    for row in rows:
        pad = " " * row.indent
        head = pad + row.label
        if row.cut:
            body = Text(row.text, style=row.style)
            body.truncate(max(10, width - len(head)), overflow="ellipsis")
            console.print(Text(head, style=row.label_style) + body)
        elif row.wrap and row.text:
            # a short label (`help: `) hangs its continuation under the text; a long one (a title's
            # `error[rule-id]: `) would leave a narrow column, so its continuation is indented by two
            hang = (" " * len(head) if len(head) <= 12 else pad + "  ") if row.label else pad
            lines = textwrap.wrap(row.text, width=max(20, width), initial_indent=head, subsequent_indent=hang,
                                  break_on_hyphens=False, break_long_words=False) or [head]
            for i, text in enumerate(lines):
                if i == 0 and row.label:
                    console.print(Text(head, style=row.label_style) + Text(text[len(head):], style=row.style))
                else:
                    console.print(Text(text, style=row.style))
        else:
            console.print(Text(head, style=row.label_style) + Text(row.text, style=row.style))


def _report(console, d: Diagnosis, verbose: int, width: int) -> None:
    from vllm_doctor.reports import brief

    rows = brief.finding_rows(d.findings[0], verbose, width)
    rows += [brief.other_row(f) for f in d.findings[1:]]
    if brief.needs_gpu_facts(d):
        rows.append(brief.Row("none here — pass --facts SNAPSHOT from the GPU host", "dim", 2,
                              label="= GPU facts: "))
    rows += brief.fix_rows(d, verbose)
    see = brief.see_row(d, verbose)
    rows += [see] if see else []
    _print_rows(console, rows, width)


def _facts_table(console, d: Diagnosis, verbose: int) -> None:
    from rich.table import Table

    used = {key for f in d.findings for key in f.facts}
    rows = [(k, fact) for k, fact in d.facts.items()
            if k.split(".", 1)[0] in ("vllm", "args", "gpu", "log", "launch") and k != "gpu.devices"
            or (k.startswith("model.") and (verbose >= 2 or k.split(".", 1)[1] in used))]
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
    if verbose < 2:
        return
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


def render_text(d: Diagnosis, stream=None, color: bool | None = None, verbose: int = 0,
                all_runs: bool = False, width: int | None = None) -> str:
    """Render to `stream` (or return the text when stream is None). `width`: the columns prose wraps to."""
    buffer = io.StringIO() if stream is None else stream
    color = use_color(buffer) if color is None else color
    width = width or terminal_width(buffer if stream is not None else sys.stdout)
    console = _console(buffer, color)
    _run(console, d, verbose, width)
    for i, earlier in enumerate(reversed(d.earlier)):
        console.print()
        label = earlier.run_label or f"run {len(d.earlier) - i}"
        if all_runs:
            console.print(f"── earlier run: {label} ──", style="bold")
            _run(console, earlier, verbose, width)
        else:
            _earlier_line(console, earlier, label)
    if d.earlier and not all_runs:
        console.print("  (--all-runs reports every run in full)", style="dim")
    return buffer.getvalue() if stream is None else ""


def _earlier_line(console, d: Diagnosis, label: str) -> None:
    from rich.text import Text

    if not d.findings:
        console.print(Text(f"earlier run ({label}): no problem found", style="dim"))
        return
    f = d.findings[0]
    console.print(Text(f"earlier run ({label}): ", style="bold") + Text(f"{f.severity}[{f.rule}]: {f.title}"))


def _run(console, d: Diagnosis, verbose: int, width: int) -> None:
    from rich.text import Text

    predicted = d.sources == ["predicted"]           # `vllm-doctor check`: a command, not a log
    where = "this command" if predicted else (", ".join(d.sources) or "<stdin>")
    size = "" if predicted else f" ({d.lines:,} line{'' if d.lines == 1 else 's'})"
    if d.run_label:
        console.print(f"run: {d.run_label}", style="bold")
    if not d.findings:
        verb = "no failure predicted for" if predicted else "no problem found in"
        console.print(f"vllm-doctor: {verb} {where}{size}.", style="bold green")
        for w in d.first_warnings()[:5]:       # Text: "[rule-id]" is not Rich markup
            console.print(Text(f"  warning seen: {w.line.message.strip()[:200]} [{w.rule_id}]", style="yellow"))
    else:
        if verbose:
            console.print(f"vllm-doctor: {where}{size}", style="bold")
        _report(console, d, verbose, width)
        if verbose:
            console.print()
            _facts_table(console, d, verbose)
    for notice in d.notices:
        if verbose or notice.startswith(tuple(d.sources)) or not d.findings:
            console.print(f"  {notice}", style="dim")
