"""The terminal report: the rows of reports/brief.py, prose wrapped to the width, commands whole.

Coloured output goes through Rich. Plain output (a file, a pipe, NO_COLOR) is written directly, byte for
byte what Rich's Console would write, without importing Rich (~35 ms, a third of a small log's answer):
whatever it cannot write exactly as Rich would (control characters, a table) it hands to a Console on the
same buffer. Every string is literal text, never Rich markup or an emoji code: file names, notices, facts
and log lines come from the user's input (`[/x]` in a model path made Rich raise MarkupError).
"""
from __future__ import annotations

import io
import os
import re
import sys

from vllm_doctor.facts.keys import SERVER_STATE, SERVER_URL
from vllm_doctor.findings import Diagnosis

# What Rich changes in literal text: control codes and tabs (stripped, expanded). Text without them prints
# as it is; with them, Rich prints it.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


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


class _RichOut:
    """The report's lines through a Rich Console (colour)."""

    def __init__(self, console) -> None:
        self.console = console

    def text(self, *parts: tuple[str, str]) -> None:
        """(text, style) parts on one line: literal text, never markup (the first part's style is the
        line's, under the others', as Rich's Text + Text has it)."""
        from rich.text import Text

        line = Text(parts[0][0], style=parts[0][1])
        for text, style in parts[1:]:
            line = line + Text(text, style=style)
        self.console.print(line)

    def cut(self, head: tuple[str, str], body: tuple[str, str], width: int) -> None:
        """`head` then `body`, the body cut to `width` cells with an ellipsis."""
        from rich.text import Text

        text = Text(body[0], style=body[1])
        text.truncate(width, overflow="ellipsis")
        self.console.print(Text(head[0], style=head[1]) + text)

    def line(self, text: str = "", style: str | None = None) -> None:
        """One line of literal text in one style; no text: an empty line."""
        from rich.text import Text

        self.console.print(Text(text, style=style or ""))

    def table(self, table, width: int) -> None:
        self.console.print(table, width=width, soft_wrap=False)     # cells wrap inside the terminal


class _PlainOut:
    """The same lines without colour, written as Rich writes them (soft wrap: never cut, never wrapped)."""

    def __init__(self, file) -> None:
        self.file = file
        self._rich: _RichOut | None = None

    @property
    def rich(self) -> _RichOut:
        if self._rich is None:
            self._rich = _RichOut(_console(self.file, False))
        return self._rich

    def text(self, *parts: tuple[str, str]) -> None:
        line = "".join(text for text, _ in parts)
        if _CONTROL.search(line):
            self.rich.text(*parts)
        else:
            self.file.write(line + "\n")

    def cut(self, head: tuple[str, str], body: tuple[str, str], width: int) -> None:
        text = body[0]
        # cells are characters for ASCII and the ellipsis (brief.evidence_window's), else Rich counts them
        if not (text.replace("…", "").isascii() and (head[0] + text).isprintable()):
            self.rich.cut(head, body, width)
        else:
            self.file.write(head[0] + (text if len(text) <= width else text[:width - 1] + "…") + "\n")

    def line(self, text: str = "", style: str | None = None) -> None:
        if _CONTROL.search(text):
            self.rich.line(text, style)
        else:
            self.file.write(text + "\n")

    def table(self, table, width: int) -> None:
        self.rich.table(table, width)


def _writer(buffer, color: bool):
    return _RichOut(_console(buffer, True)) if color else _PlainOut(buffer)


def _print_rows(out, rows, width: int) -> None:
    import textwrap

    for row in rows:
        pad = " " * row.indent
        head = pad + row.label
        if row.cut:
            out.cut((head, row.label_style), (row.text, row.style), max(10, width - len(head)))
        elif row.wrap and row.text:
            # a short label (`help: `) hangs its continuation under the text; a long one (a title's
            # `error[rule-id]: `) would leave a narrow column, so its continuation is indented by two
            hang = (" " * len(head) if len(head) <= 12 else pad + "  ") if row.label else pad
            lines = textwrap.wrap(row.text, width=max(20, width), initial_indent=head, subsequent_indent=hang,
                                  break_on_hyphens=False, break_long_words=False) or [head]
            for i, text in enumerate(lines):
                if i == 0 and row.label:
                    out.text((head, row.label_style), (text[len(head):], row.style))
                else:
                    out.text((text, row.style))
        else:
            out.text((head, row.label_style), (row.text, row.style))


def _report(out, d: Diagnosis, verbose: int, width: int) -> None:
    from vllm_doctor.reports import brief

    rows = brief.finding_rows(d.findings[0], verbose, width, story=d.nodes)
    rows += [brief.other_row(f) for f in d.findings[1:]]
    if d.nodes is not None:
        rows.append(brief.Row(d.nodes.after(), indent=2, label="= nodes: "))   # the `-->` line named the first
    if brief.needs_gpu_facts(d):
        rows.append(brief.Row("none here — pass --facts SNAPSHOT from the GPU host", "dim", 2,
                              label="= GPU facts: "))
    elif d.nodes is not None and d.nodes.this_machine not in (None, d.nodes.first):
        rows.append(brief.Row(f"this machine's ({d.nodes.this_machine}), not those of {d.nodes.first}, where it "
                              "started", "dim", 2, label="= GPU facts: "))
    rows += brief.fix_rows(d, verbose)
    see = brief.see_row(d, verbose)
    rows += [see] if see else []
    _print_rows(out, rows, width)


def _facts_table(out, d: Diagnosis, verbose: int, width: int) -> None:
    from rich.table import Table
    from rich.text import Text

    used = {key for f in d.findings for key in f.facts}
    rows = [(k, fact) for k, fact in d.facts.items()
            if k.split(".", 1)[0] in ("vllm", "args", "gpu", "log", "launch") and k != "gpu.devices"
            or (k.startswith("model.") and (verbose >= 2 or k.split(".", 1)[1] in used))]
    if not rows:
        return
    table = Table(title="Facts used", title_justify="left", show_edge=False, pad_edge=False, box=None)
    table.add_column("fact", style="cyan")
    table.add_column("value", overflow="fold")
    table.add_column("from", style="dim")
    for key, fact in rows[:40]:
        value = fact.value if not isinstance(fact.value, (list, dict)) else str(fact.value)[:80]
        table.add_row(Text(key), Text(str(value)[:100]), Text(fact.source))     # literal: never markup
    out.table(table, width)
    if verbose < 2:
        return
    machine = d.facts.get("doctor.machine_facts") or {}
    if any(fact.source in ("nvml", "env") for _, fact in d.facts.items()) and machine.get("used", True):
        why = f": {machine['reason']}" if machine.get("reason") else ""
        out.line(f"  (facts marked nvml/env come from this machine{why})", style="dim")
    elif machine and not machine.get("used") and d.facts.source("doctor.machine_facts") == "env":
        out.line(f"  (this machine's GPUs and environment were left out: {machine['reason']}; "
                   "--live uses them)", style="dim")
    for key, kept, rejected in d.facts.conflicts[:5]:
        out.line(f"  conflict: {key} = {kept.value!r} ({kept.source}) but {rejected.source} says "
                   f"{rejected.value!r}", style="yellow")


def render_text(d: Diagnosis, stream=None, color: bool | None = None, verbose: int = 0,
                all_runs: bool = False, width: int | None = None) -> str:
    """Render to `stream` (or return the text when stream is None). `width`: the columns prose wraps to."""
    buffer = io.StringIO() if stream is None else stream
    color = use_color(buffer) if color is None else color
    width = width or terminal_width(buffer if stream is not None else sys.stdout)
    out = _writer(buffer, color)
    _run(out, d, verbose, width)
    for i, earlier in enumerate(reversed(d.earlier)):
        out.line()
        label = earlier.run_label or f"run {len(d.earlier) - i}"
        if all_runs:
            out.line(f"── earlier run: {label} ──", style="bold")
            _run(out, earlier, verbose, width)
        else:
            _earlier_line(out, earlier, label)
    if d.earlier and not all_runs:
        out.line("  (--all-runs reports every run in full)", style="dim")
    return buffer.getvalue() if stream is None else ""


def _earlier_line(out, d: Diagnosis, label: str) -> None:
    if not d.findings:
        out.text((f"earlier run ({label}): no problem found", "dim"))
        return
    f = d.findings[0]
    out.text((f"earlier run ({label}): ", "bold"), (f"{f.severity}[{f.rule}]: {f.title}", ""))


def _run(out, d: Diagnosis, verbose: int, width: int) -> None:
    predicted = d.sources == ["predicted"]           # `vllm-doctor check`: a command, not a log
    served = d.sources[:1] == ["health"]             # `vllm-doctor health`: a running server
    where = "this command" if predicted else f"the server at {d.facts.get(SERVER_URL)}" if served else (
        ", ".join(d.sources) or "<stdin>")
    size = "" if predicted or served else f" ({d.lines:,} line{'' if d.lines == 1 else 's'})"
    if d.run_label:
        out.line(f"run: {d.run_label}", style="bold")
    if not d.findings and d.unchecked:
        _aside(out, f"vllm-doctor: could not check {where}: {len(d.unchecked)} check(s) that matter could not run "
               f"(exit 3).", width, "bold yellow", indent="")
    elif not d.findings:
        verb = "no failure predicted for" if predicted else "no problem found in"
        if d.ignored:          # what was found is not nothing: said, never an all-clear
            verb = "nothing left to report for" if predicted else "nothing left to report in"
        ran = sum(c.ran for c in d.coverage)
        counted = f" ({ran} of {len(d.coverage)} checks ran)" if d.coverage else ""
        _aside(out, f"vllm-doctor: {verb} {where}{size}{counted}.", width, "bold green", indent="")
        if served and d.facts.get(SERVER_STATE):
            _aside(out, f"the server: {d.facts.get(SERVER_STATE)}", width)
        for w in d.first_warnings()[:5]:
            head, tag, msg = "  warning seen: ", f" [{w.rule_id}]", w.line.message.strip()[:200]
            room = max(20, width - len(head) - len(tag))        # the rule stays whole; the message is cut
            out.text((head + (msg if len(msg) <= room else msg[:room - 1] + "…") + tag, "yellow"))
    else:
        if verbose:
            _aside(out, f"vllm-doctor: {where}{size}", width, "bold", indent="")
        _report(out, d, verbose, width)
        if verbose:
            out.line()
            _facts_table(out, d, verbose, width)
    if d.ignored:
        out.line(f"  {d.ignored} finding{'s' if d.ignored > 1 else ''} not shown (--ignore)", style="dim")
    _coverage(out, d, verbose, width)
    if d.memory:
        _aside(out, memory_line(d.memory), width)
    from vllm_doctor.facts.model_table import NOTICE_MARK

    # NVML's own error changes no answer here: a finding that needs GPU facts says "GPU facts: none here"
    nvml_error = d.facts.get("gpu.nvml_error")
    for notice in d.notices:     # where a finding's numbers came from is always said (the model table)
        if notice == nvml_error and not verbose:
            continue
        if verbose or notice.startswith(tuple(d.sources)) or not d.findings or NOTICE_MARK in notice:
            _aside(out, notice, width)


def memory_line(m: dict) -> str:
    """`check`: the memory model's figures per GPU and whether the context fits (checks/memory_checks.py)."""
    text = (f"memory per GPU (predicted, tp {m['tp']} x pp {m['pp']}): weights {m['weights_gib']:.1f} GiB, KV cache "
            f"{m['kv_cache_gib']:.1f} GiB = {m['kv_cache_tokens']:,} tokens")
    mml = m.get("max_model_len")
    if mml and m.get("context_fits"):
        text += f"; max_model_len {mml:,} fits"
        if m.get("max_concurrency"):
            text += f", {m['max_concurrency']:.1f} requests of it at once"
    elif mml:
        text += f"; max_model_len {mml:,} does not fit (at most {m['largest_max_model_len']:,})"
    return text + f" (confidence {m['confidence']})"


def _aside(out, text: str, width: int, style: str = "dim", indent: str = "  ") -> None:
    """A line of the report's own prose (its headline: indent ""; a note under it: "  "), wrapped to the width at
    spaces (a long path stays whole), its continuation two further in."""
    import textwrap

    for part in textwrap.wrap(text, width=max(20, width), initial_indent=indent, subsequent_indent=indent + "  ",
                              break_on_hyphens=False, break_long_words=False) or [text]:
        out.line(part, style=style)


def _coverage(out, d: Diagnosis, verbose: int, width: int = 100) -> None:
    """`check`: the checks that could not run and why (essential ones always; with -v every check)."""
    for c in sorted(d.coverage, key=lambda c: (c.ran, not c.essential)):
        if c.ran and verbose:
            _aside(out, f"checked: {c.label}", width)
        elif not c.ran and (c.essential or verbose):
            _aside(out, f"not checked: {c.label}: {c.why}", width, "yellow" if c.essential else "dim")
