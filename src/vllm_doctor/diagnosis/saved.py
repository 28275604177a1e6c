"""Diagnose saved logs: sources → events → rules → facts → remedies, returning a Diagnosis."""
from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable

from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.diagnosis.runs import MAX_RUNS, Run, RunSplitter
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
    ignore: frozenset[str] = frozenset()   # --ignore: rule ids the user does not want reported (ignore.py)


def _progress(total: int):
    if total < PROGRESS_MIN_BYTES or not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    from rich.progress import BarColumn, Progress, TransferSpeedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), TransferSpeedColumn(),
                        transient=True, console=None)
    return progress


def scan_file(path: str, runs: RunSplitter, notes: list[str] | None = None) -> int:
    """Scan one saved log into the runs (a new run when its launch differs from the current run's); its
    line count. A compressed or UTF-16 log is read through sources.files (a note says so); an empty file
    or one that is no text log is an InputError."""
    if os.path.isdir(path):
        raise InputError(f"cannot read {path}: is a directory")
    try:
        stream, how = open_log(path)
    except LogFormatError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    with stream:
        try:
            size = os.path.getsize(path) if how is None else 0
        except OSError:
            size = 0
        lines = scan_stream(stream, path, runs, size)
        if notes is not None and how:
            cut = " (cut short: read up to where it ends)" if getattr(stream, "cut", False) else ""
            notes.append(f"{path}: {how}{cut}")
        return lines


def scan_stream(stream, source: str, runs: RunSplitter, size: int = 0, name: str | None = None) -> int:
    """Scan a saved log's byte stream (`size` bytes when known: a progress bar on a big one) into the
    runs as the file `source` (`name`: how an error calls it, default `source`); its line count. Nothing
    read is an InputError."""
    name = name or source
    scanner = Scanner(runs.diagnoser.scan_literals, runs, source=source)
    try:
        read = _scan_blocks(source, read_blocks(stream), scanner, runs, _progress(size), size)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    if not read:        # "no problem found" in an empty file would be a false all-clear
        raise InputError(f"{name} is empty: nothing to diagnose")
    scanner.close()
    runs.end_source(source, scanner.lineno)
    return scanner.lineno


def _scan_blocks(path: str, blocks, scanner: Scanner, runs: RunSplitter, progress, total: int) -> int:
    """Feed the blocks to the scanner; the bytes read. The first block tells the runs whose launch the
    file holds before any of its lines is diagnosed."""
    first = next(blocks, b"")
    runs.begin_file(path, first)
    if not first:
        return 0
    if progress is None:
        read = len(first)
        scanner.feed(first)
        for block in blocks:
            read += len(block)
            scanner.feed(block)
        return read
    with progress:
        task = progress.add_task(f"scanning {os.path.basename(path)}", total=total)
        read = 0
        for block in itertools.chain((first,), blocks):
            read += len(block)
            scanner.feed(block)
            progress.advance(task, len(block))
        return read


def enrich(diagnoser: Diagnoser, options: Options) -> list[str]:
    """Facts beyond the log: a snapshot, the model's config, this machine (weaker than the log's own)."""
    try:
        from vllm_doctor.facts.gather import gather_facts
    except ImportError:
        return []
    facts = diagnoser.facts
    diagnoser.logfacts.publish_hosts()
    model = options.model or facts.get("args.model")
    return gather_facts(facts, model=model, online=options.online, live=options.live,
                        snapshot=options.snapshot) or []


def diagnose_paths(paths: list[str], catalog: Catalog, options: Options) -> Diagnosis:
    """The last run's Diagnosis, the runs before it in `earlier` (diagnosis.runs)."""
    runs = RunSplitter(lambda: new_diagnoser(catalog, options))
    notes: list[str] = []
    for path in paths:
        scan_file(path, runs, notes)
    diagnosis = finish_runs(runs.runs, finish, options, dropped=(runs.dropped, runs.dropped_lines))
    diagnosis.notices[:0] = notes
    return diagnosis


def new_diagnoser(catalog: Catalog, options: Options) -> Diagnoser:
    diagnoser = Diagnoser(catalog, Facts())
    if options.command:
        diagnoser.facts.set("launch.command", options.command, "user")
    return diagnoser


def finish(diagnoser: Diagnoser, options: Options, lines: int) -> Diagnosis:
    diagnoser.lines = lines
    # The command first (its flags are facts), then the enrichment that may need args.model.
    from vllm_doctor.diagnosis.launch import resolve_command

    command = resolve_command(diagnoser.facts, diagnoser.logfacts, options.command)
    notices = enrich(diagnoser, options)
    diagnosis = diagnoser.finish(command)
    diagnosis.lines = lines
    diagnosis.notices = notices + diagnosis.notices     # the engine's own (skipped regexes, a stop) after
    if diagnosis.nodes is not None:                     # this machine is one node among several
        from vllm_doctor.events.nodes import DRIVER_LABEL
        from vllm_doctor.facts.origin import this_node

        facts = diagnosis.facts
        mine = this_node(facts, diagnosis.nodes.nodes, DRIVER_LABEL)
        machine = {k: f.value for k, f in facts.items() if k.startswith("gpu.") and f.source == "nvml"}
        notice = diagnosis.nodes.mark_machine(mine, machine)
        diagnosis.notices += [notice] if notice else []
    return diagnosis


def finish_runs(runs: list[Run], finish_one: Callable[[Diagnoser, object, int], Diagnosis], options,
                now: dict[str, int] | None = None, done: dict[Run, Diagnosis] | None = None,
                dropped: tuple[int, int] = (0, 0)) -> Diagnosis:
    """Every run's Diagnosis; the last run's is returned, the others in its `earlier` (oldest first). A
    run without lines (a rotation nothing followed) is left out. `done`: earlier runs already finished
    (run -> Diagnosis), reused and kept up to date; `dropped`: (runs, lines) older than those diagnosed."""
    kept = [run for run in runs if run.lines(now)] or runs[-1:]
    done = {} if done is None else done
    for gone in set(done) - set(kept):
        del done[gone]
    out: list[Diagnosis] = []
    for i, run in enumerate(kept):
        last = i == len(kept) - 1
        diagnosis = done.get(run)             # a Diagnoser is finished once
        if diagnosis is None:
            diagnosis = finish_one(run.diagnoser, options if last else _earlier_options(run, options),
                                   run.lines(now))
            if not last:
                done[run] = diagnosis
        out.append(diagnosis)
    top = out[-1]
    if len(out) > 1:
        for run, diagnosis in zip(kept, out):
            diagnosis.run_label = run.label(now)
        top.earlier = out[:-1]
    if dropped[0]:
        top.notices.append(f"{dropped[0]} earlier run{'s' if dropped[0] > 1 else ''} ({dropped[1]:,} lines) not "
                           f"diagnosed: only the last {MAX_RUNS} runs of the input are")
    return top


def _earlier_options(run: Run, options):
    """--cmd is the command of the run asked about, the last one: an earlier run keeps its own."""
    if not getattr(options, "command", None):
        return options
    old = run.diagnoser.facts
    facts = Facts()
    for key, fact in old.items():
        if not (key == "launch.command" and fact.source == "user"):
            facts.set(key, fact.value, fact.source)
    facts.conflicts = [c for c in old.conflicts if c[0] != "launch.command"]
    if run.diagnoser.logfacts.command_line:
        facts.set("launch.command", run.diagnoser.logfacts.command_line, "log")
    run.diagnoser.facts = run.diagnoser.logfacts.facts = facts
    return replace(options, command=None)
