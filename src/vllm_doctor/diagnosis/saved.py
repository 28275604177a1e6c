"""Diagnose saved logs: sources → events → rules → facts → remedies, returning a Diagnosis."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.findings import Diagnosis
from vllm_doctor.facts import Facts
from vllm_doctor.rules.catalog import Catalog
from vllm_doctor.sources.files import LogFormatError, open_log
from vllm_doctor.sources.scan import Scanner, read_blocks

PROGRESS_MIN_BYTES = 64 << 20


class InputError(Exception):
    """A file that cannot be read: one line, exit 2."""


@dataclass
class Options:
    command: str | None = None       # --cmd
    model: str | None = None         # --model
    snapshot: str | None = None      # --facts
    # this machine's GPUs/environment: True (--live; the pipe, run, --follow), False (--no-live), None: only
    # when the saved log was written here (facts.origin decides)
    live: bool | None = None
    online: bool = False             # --online allows hub look-ups


def _progress(total: int):
    if total < PROGRESS_MIN_BYTES or not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    from rich.progress import BarColumn, Progress, TransferSpeedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), TransferSpeedColumn(),
                        transient=True, console=None)
    return progress


def scan_file(path: str, diagnoser: Diagnoser, notes: list[str] | None = None) -> int:
    """Scan one saved log into the diagnoser; its line count. A compressed or UTF-16 log is read through
    sources.files (a note says so); an empty file or one that is no text log is an InputError."""
    if os.path.isdir(path):
        raise InputError(f"cannot read {path}: is a directory")
    try:
        stream, how = open_log(path)
    except LogFormatError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    with stream:
        scanner = Scanner(diagnoser.scan_literals, diagnoser, source=path)
        diagnoser.add_source(path)
        try:
            total = os.path.getsize(path) if how is None else 0
        except OSError:
            total = 0
        progress = _progress(total)
        read = 0
        try:
            if progress is None:
                for block in read_blocks(stream):
                    read += len(block)
                    scanner.feed(block)
            else:
                with progress:
                    task = progress.add_task(f"scanning {os.path.basename(path)}", total=total)
                    for block in read_blocks(stream):
                        read += len(block)
                        scanner.feed(block)
                        progress.advance(task, len(block))
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
        if not read:        # "no problem found" in an empty file would be a false all-clear
            raise InputError(f"{path} is empty: nothing to diagnose")
        scanner.close()
        if notes is not None and how:
            cut = " (cut short: read up to where it ends)" if getattr(stream, "cut", False) else ""
            notes.append(f"{path}: {how}{cut}")
        return scanner.lineno


def enrich(diagnoser: Diagnoser, options: Options) -> list[str]:
    """Facts beyond the log: a snapshot, the model's config, this machine (weaker than the log's own)."""
    try:
        from vllm_doctor.facts.gather import gather_facts
    except ImportError:
        return []
    facts = diagnoser.facts
    diagnoser.publish_hosts()
    model = options.model or facts.get("args.model")
    return gather_facts(facts, model=model, online=options.online, live=options.live,
                        snapshot=options.snapshot) or []


def diagnose_paths(paths: list[str], catalog: Catalog, options: Options) -> Diagnosis:
    diagnoser = Diagnoser(catalog, Facts())
    if options.command:
        diagnoser.facts.set("launch.command", options.command, "user")
    total = 0
    notes: list[str] = []
    for path in paths:
        total += scan_file(path, diagnoser, notes)
    diagnosis = finish(diagnoser, options, total)
    diagnosis.notices[:0] = notes
    return diagnosis


def finish(diagnoser: Diagnoser, options: Options, lines: int) -> Diagnosis:
    diagnoser.lines = lines
    # The command first (its flags are facts), then the enrichment that may need args.model.
    from vllm_doctor.diagnosis.launch import resolve_command

    command = resolve_command(diagnoser.facts, diagnoser.logfacts, options.command)
    notices = enrich(diagnoser, options)
    diagnosis = diagnoser.finish(command)
    diagnosis.lines = lines
    diagnosis.notices = notices
    return diagnosis
