"""What `s` saves (no Textual here): the selected finding's corrected command as a shell script, or, for
a finding without one, its report as text; by default to a new file in the current directory.

The clipboard is no sure way out: `y` sends the command by OSC 52, which many terminals (and tmux
without set-clipboard) drop without a word, so a file is the copy that is known to have happened.
"""
from __future__ import annotations

import io
import os

from rich.console import Console

from vllm_doctor.tui import view

SCRIPT_NAME = "vllm-doctor-fix.sh"
REPORT_NAME = "vllm-doctor-report.txt"


def has_command(finding) -> bool:
    """A command line a shell can run; a compose, pod-spec or LLM(...) edit is saved as the report."""
    return finding.rewrite is not None and finding.rewrite.runnable and bool(view.fix_command_text(finding))


def free_name(finding, directory: str = ".") -> str:
    """A file name in `directory` that is not taken: vllm-doctor-fix.sh, vllm-doctor-fix-2.sh, ..."""
    stem, ext = os.path.splitext(SCRIPT_NAME if has_command(finding) else REPORT_NAME)
    name, n = stem + ext, 1
    while os.path.exists(os.path.join(directory, name)):
        n += 1
        name = f"{stem}-{n}{ext}"
    return name


def _plain(renderable, width: int = 100) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def script_text(finding) -> str:
    summary = finding.fix.summary if finding.fix is not None else ""
    return f"#!/bin/sh\n# vllm-doctor: {finding.rule}: {summary}\n{view.fix_command_text(finding)}\n"


def report_text(finding, old_command: str | None) -> str:
    """The finding as the Cause and Fix panes show it, and the log lines it stands on."""
    parts = [_plain(view.cause_renderable(finding)), _plain(view.fix_renderable(finding, old_command)),
             "Evidence\n"]
    for line in [*finding.evidence, *finding.supporting]:
        parts.append(f"  {line.source or '<stdin>'}:{line.lineno}: {line.raw}\n")
    return "\n".join(parts)


def save(path: str, finding, old_command: str | None, mask=None) -> str:
    """Write the finding's script (or report) to `path`, through `mask` with --anonymize; returns what it
    wrote ("corrected command" or "report"). Raises OSError."""
    command = has_command(finding)
    text = script_text(finding) if command else report_text(finding, old_command)
    if mask is not None:
        text = mask(text)
    with open(os.path.expanduser(path), "w", encoding="utf-8") as out:
        out.write(text)
    return "corrected command" if command else "report"
