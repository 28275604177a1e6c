"""Runs: the launches an input holds, each diagnosed on its own.

Two files of two launches, a rotated log under --follow, or one file a server was started in twice would
otherwise be read as one start-up: run A's command rewritten with run B's fix. `RunSplitter` is the
scanner's sink (sources.scan.Scanner): it passes every line on to the current run's Diagnoser and opens a
new run where a launch clearly follows an earlier one:

* in one input, at a start line (the `vLLM API server version` banner, a `non-default args` /
  `args: Namespace(...)` dump, a `$ vllm serve ...` shell line) of a run that has already printed its own
  launch, when that run had failed, errored or come up since, or the new launch's version or arguments
  differ. A start line repeated by a process of the same launch (or by another service or node of a
  merged log) is not a new run;
* at a file boundary (saved logs), when the new file's first launch differs from the run's (command,
  version, arguments, model). Worker logs and split logs of one launch have the same launch or none of
  their own: they stay one run;
* at a rotation or truncation of a followed file (`restart`).

Line numbers stay those of each file; a run knows which lines of which file are its own (`Run.parts`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import regex

from vllm_doctor.events.logfacts import ARGS_MARKS, BANNER_VERSION, LOGO_VERSION, launch_command, logged_args
from vllm_doctor.sources.lines import Line, parse_line

if TYPE_CHECKING:
    from vllm_doctor.diagnosis.engine import Diagnoser
    from vllm_doctor.findings import Match

BANNER = "vLLM API server version"
LOGO = "  version "          # newer vLLM prints its logo instead, the version beside it
HEAD_LITERALS = (BANNER.encode(), LOGO.encode(), *(mark.encode() for mark in ARGS_MARKS), b"$ ")
HEAD_TRIES = 64                 # occurrences of a literal looked at in a file's first block
# A shell line that starts vLLM itself (`$ vllm serve`, `python -m vllm.entrypoints…`, a vllm image, the
# Python API); a `$ pip install vllm` or `$ python check.py` typed between launches is no launch.
VLLM_LAUNCH = regex.compile(r"(?:^|[\s/])vllm\s+serve\b|-m\s+vllm\.entrypoints|\bvllm[\w./-]*openai\b|\bLLM\(")
# Arguments that differ between the nodes (or ranks) of one launch: not a different launch.
NODE_LOCAL = frozenset({
    "headless", "data_parallel_start_rank", "data_parallel_rank", "data_parallel_address",
    "data_parallel_rpc_port", "data_parallel_size_local", "node_rank", "nnodes", "master_addr", "master_port"})
NODE_LOCAL_FLAGS = frozenset("--" + key.replace("_", "-") for key in NODE_LOCAL)
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")      # `<function serve at 0x7f…>` differs in every process
END_LEVELS = ("ERROR", "CRITICAL")
# A crash loop's log (a container restarted over and over) holds hundreds of launches: the last ones are
# diagnosed, the older ones only counted.
MAX_RUNS = 16
BANNER_TO_ARGS = 50          # lines between a banner and the args dump of the same launch, at most
# What a launching vLLM prints before its banner (on import): after a run has ended, held back until the
# next start line tells whose it is (its fact, log.platform, must not go to the run before).
PRELUDE = "Automatically detected platform"


@dataclass
class Start:
    """A line that starts a launch, with what it says about the launch."""
    kind: str                       # "banner", "args" or "command"
    line: Line
    version: str | None = None
    args: dict | None = None
    cut: bool = False               # the args dump was cut short (only its whole pairs are in `args`)
    command: str | None = None


def start_of(line: Line) -> Start | None:
    message = line.message
    if BANNER in message or LOGO in message:
        m = BANNER_VERSION.search(message) or LOGO_VERSION.search(message)
        return Start("banner", line, version=m.group(1)) if m else None
    logged = logged_args(message)
    if logged is not None:
        return Start("args", line, args=logged[0], cut=logged[1])
    cmd = launch_command(line.raw)      # what events.logfacts takes for the launch command ...
    if cmd and VLLM_LAUNCH.search(cmd):  # ... and only a launch of vLLM itself
        return Start("command", line, command=cmd)
    return None


@dataclass
class Identity:
    """What a launch's first start lines say it is."""
    command: str | None = None
    version: str | None = None
    args: dict | None = None
    cut: bool = False

    def add(self, start: Start | None) -> None:
        if start is None:
            return
        if start.command is not None and self.command is None:
            self.command = start.command
        if start.version is not None and self.version is None:
            self.version = start.version
        if start.args is not None and self.args is None:
            self.args, self.cut = start.args, start.cut

    @property
    def known(self) -> bool:
        return bool(self.command or self.version or self.args)

    def differs(self, other: "Identity") -> bool:
        """A different launch: a fact both know that differs (the model when nothing else compares)."""
        compared = False
        if self.command and other.command:
            compared = True
            if _command_words(self.command) != _command_words(other.command):
                return True
        if self.version and other.version:
            compared = True
            if self.version != other.version:
                return True
        if self.args and other.args:
            return args_differ(self.args, other.args, self.cut or other.cut)
        if compared:
            return False
        mine, theirs = self.model, other.model
        return bool(mine and theirs and mine != theirs)

    @property
    def model(self) -> str | None:
        if self.args:
            model = self.args.get("model_tag") or self.args.get("model")
            if isinstance(model, str):
                return model
        if self.command:
            try:
                from vllm_doctor.command import Command

                return Command.parse(self.command).model
            except Exception:  # an unparseable command names no model
                return None
        return None


def _command_words(command: str) -> list[str]:
    """The command's words without the node-local flags (and their values)."""
    words, out, skip = command.split(), [], False
    for word in words:
        if skip:
            skip = False
            if not word.startswith("-"):
                continue
        flag = word.split("=", 1)[0]
        if flag in NODE_LOCAL_FLAGS:
            skip = "=" not in word
            continue
        out.append(word)
    return out


def args_differ(a: dict, b: dict, cut: bool = False) -> bool:
    """Two args dumps of different launches (node-local arguments and object addresses aside). A dump
    cut short compares on the keys both have."""
    keys = (a.keys() & b.keys()) if cut else (a.keys() | b.keys())
    for key in keys - NODE_LOCAL:
        if ADDRESS.sub("0x", repr(a.get(key))) != ADDRESS.sub("0x", repr(b.get(key))):
            return True
    return False


def head_identity(head: bytes) -> Identity:
    """The first launch a file's first block shows (a cheap look before scanning it)."""
    ident = Identity()
    for literal in HEAD_LITERALS:
        at = head.find(literal)
        for _ in range(HEAD_TRIES):
            if at < 0:
                break
            start = start_of(_line_at(head, at))
            if start is not None:
                ident.add(start)
                break
            at = head.find(literal, head.find(b"\n", at) + 1 or len(head))
    return ident


def _line_at(data: bytes, at: int) -> Line:
    begin = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    return parse_line(data[begin:end if end >= 0 else len(data)])


@dataclass(eq=False)
class Part:
    """Lines first..last of one source that belong to a run."""
    run: "Run"
    source: str
    first: int
    last: int | None = None         # None while the run still reads this source
    total: int | None = None        # the source's line count, once it ended
    note: str = ""                  # "before rotation", "before truncation"

    def count(self, now: int | None = None) -> int:
        last = self.last if self.last is not None else now
        return max(0, (last or 0) - self.first + 1)

    def label(self, now: int | None = None) -> str:
        last = self.last if self.last is not None else now
        whole = self.first == 1 and last is not None and last == self.total
        text = self.source if whole else f"{self.source}:{self.first}-{last if last is not None else ''}"
        return f"{text} ({self.note})" if self.note else text


@dataclass(eq=False)
class Run:
    diagnoser: "Diagnoser"
    parts: list[Part] = field(default_factory=list)
    ident: Identity = field(default_factory=Identity)
    origin: tuple | None = None     # (compose service, node IP) of its first banner or args dump
    launched: bool = False          # a start line was seen
    watching: bool = False          # printed its banner or args: a failure or readiness from here on ends it
    ended: bool = False
    repeat: Start | None = None     # its banner printed again: a relaunch whose args come next, or a repeat

    def lines(self, now: dict[str, int] | None = None) -> int:
        """Its line count; `now`: how far each source still being read has got."""
        return sum(p.count((now or {}).get(p.source)) for p in self.parts)

    def label(self, now: dict[str, int] | None = None) -> str:
        now = now or {}
        return ", ".join(p.label(now.get(p.source)) for p in self.parts if p.count(now.get(p.source)))

    def record(self, start: Start) -> None:
        self.launched = True
        self.repeat = start if start.kind == "banner" and self.ident.version is not None else None
        if start.kind in ("banner", "args") and not self.watching:
            self.watching, self.ended = True, False
            self.origin = _origin(start.line)
        self.ident.add(start)

    def splits_at(self, start: Start) -> bool:
        """Does this start line open a new run after this one?"""
        if not self.launched:
            return False
        ident = self.ident
        if start.kind == "command":          # a person typed a launch: another one, or this one again
            return (ident.command is None or self.ended or bool(self.diagnoser.error_lines)
                    or _command_words(start.command or "") != _command_words(ident.command))
        if self.origin is not None and _origin(start.line) != self.origin:
            return False                     # another service or node of a merged log: not a relaunch
        if ident.version is None and ident.args is None:
            # only its shell line so far: a banner belongs to it, unless argparse already refused it
            return start.kind == "banner" and bool(self.diagnoser.error_lines)
        if start.kind == "banner":
            return self.ended or (ident.version is not None and start.version != ident.version)
        if ident.args is None:
            return False
        return self.ended or args_differ(ident.args, start.args or {}, ident.cut or start.cut)

    def ends_with(self, line: Line, new: list["Match"]) -> bool:
        """The line shows this run failing, erroring or ready (after its banner or args)."""
        message = line.message
        return (line.level in END_LEVELS or "Traceback (most recent call last)" in message
                or any(m.kind == "fatal" for m in new) or bool(self.diagnoser.error_lines)
                or "server_ready" in self.diagnoser.logfacts.last_seen)


def _near(before: Line | None, line: Line) -> bool:
    """A launch prints its prelude, banner and args dump within a few lines of each other."""
    return (before is not None and before.source == line.source
            and 0 <= line.lineno - before.lineno <= BANNER_TO_ARGS)


def _origin(line: Line) -> tuple:
    return (getattr(line, "service", None), line.ip)


class RunSplitter:
    """The scanner's sink over the runs of one input (see the module's docstring)."""

    def __init__(self, make: Callable[[], "Diagnoser"],
                 on_split: Callable[[Run, Line | None], None] | None = None) -> None:
        """`make`: a new run's Diagnoser. `on_split(old_run, start_line)`: called as a run ends, before
        the next one is fed (start_line None for a restart)."""
        self.make = make
        self.on_split = on_split
        self.runs: list[Run] = [Run(make())]
        self.dropped = 0                          # older runs left out (MAX_RUNS)
        self.dropped_lines = 0
        self._open: dict[str, Part] = {}          # source -> the part reading it now
        self._generation: dict[str, list[Part]] = {}   # source -> its parts since it (re)started
        self._source: str | None = None
        self._held: list[Line] = []               # prelude lines of what may be the next launch

    @property
    def run(self) -> Run:
        return self.runs[-1]

    @property
    def diagnoser(self) -> "Diagnoser":
        return self.runs[-1].diagnoser

    @property
    def needs_context(self) -> bool:
        return self.runs[-1].diagnoser.needs_context

    @property
    def repeats(self):
        """The current run's known lines (diagnosis/repeats.py); none while prelude lines are held (the
        next line decides whose they are)."""
        return None if self._held else self.runs[-1].diagnoser.repeats

    # ---- sources -----------------------------------------------------------------------------------
    def begin_source(self, source: str) -> None:
        """A source starts (or starts over) at its line 1, in the current run."""
        self._generation[source] = []
        self._open_part(source, 1)
        self.run.diagnoser.add_source(source)

    def begin_file(self, source: str, head: bytes) -> None:
        """A saved file about to be scanned, `head` its first block: a new run when its first launch
        differs from the current run's; otherwise it continues that run (a worker's log, a split log),
        its own start lines judged from its own lines."""
        self._release()
        run = self.run
        if run.launched and (ident := head_identity(head)).known and run.ident.differs(ident):
            self._new_run(None)
        else:
            run.ended, run.repeat = False, None
        self.begin_source(source)

    def end_source(self, source: str, lines: int, note: str = "") -> None:
        """The source ended (or was rotated away) after `lines` lines."""
        self._release()
        part = self._open.pop(source, None)
        if part is not None:
            part.last = lines
        for part in self._generation.pop(source, []):
            part.total = lines
            part.note = note
        if self._source == source:
            self._source = None

    def restart(self, source: str, lines: int, note: str) -> None:
        """A followed file was rotated or truncated after `lines` lines: what comes next is a new run."""
        self.end_source(source, lines, note)
        self._new_run(None)

    def _open_part(self, source: str, first: int) -> None:
        old = self._open.get(source)
        if old is not None and old.last is None:
            old.last = first - 1
        part = Part(self.run, source, first)
        self.run.parts.append(part)
        self._open[source] = part
        self._generation.setdefault(source, []).append(part)
        self._source = source

    def _enter(self, source: str, lineno: int) -> None:
        """A line of another source than the last one: the part that reads it must be this run's."""
        part = self._open.get(source)
        if part is None:
            self._open_part(source, 1)
            self.run.diagnoser.add_source(source)
        elif part.run is not self.run:
            self._open_part(source, lineno)
        self._source = source

    # ---- lines -------------------------------------------------------------------------------------
    def feed(self, line: Line, key: tuple[bytes, bytes] | None = None) -> list["Match"]:
        """`key`: the scanner's keys of the line, for the run's repeat cache (diagnosis/repeats.py)."""
        if line.source != self._source:
            self._enter(line.source, line.lineno)
        message = line.message
        if self._held and not _near(self._held[0], line):
            self._release()
        if "args: " in message or "version " in message or line.raw.startswith("$ "):
            key = None
            start = start_of(line)
            if start is not None:
                self._start(start)
                self.run.diagnoser.repeats.clear()     # a launch's lines are its own, however alike
        run = self.runs[-1]
        if run.ended and PRELUDE in message:
            self._held.append(line)
            return []
        return self._feed(run, line, key)

    def _feed(self, run: Run, line: Line, key: tuple[bytes, bytes] | None = None) -> list["Match"]:
        new = run.diagnoser.feed(line, key)
        if run.watching and not run.ended and run.ends_with(line, new):
            run.ended = True
            run.diagnoser.repeats.clear()    # the run changed state: its known lines are looked at afresh
        return new

    def _release(self) -> None:
        """No launch followed the held prelude lines: they are the current run's after all."""
        held, self._held = self._held, []
        for line in held:
            self._feed(self.run, line)

    def _start(self, start: Start) -> None:
        run = self.run
        if not run.splits_at(start):
            self._release()
            run.record(start)
            return
        # the relaunch's banner came just before the args that told it apart: the new run starts there
        banner = run.repeat if start.kind == "args" and _near(run.repeat.line if run.repeat else None,
                                                              start.line) else None
        lead = sorted(self._held + ([banner.line] if banner else []), key=lambda ln: ln.lineno)
        self._held = []
        self._new_run(lead[0] if lead else start.line)
        new = self.run
        for line in lead:
            if banner is not None and line is banner.line:
                new.record(banner)
            self._feed(new, line)
        new.record(start)

    def _new_run(self, first: Line | None) -> None:
        if first is None:
            self._release()
        elif (part := self._open.get(first.source)) is not None and part.last is None:
            part.last = first.lineno - 1          # the old run's lines end here (its label, on_split)
        old = self.run
        if self.on_split is not None:
            self.on_split(old, first)
        self.runs.append(Run(self.make()))
        if len(self.runs) > MAX_RUNS:
            gone = self.runs.pop(0)
            self.dropped += 1
            self.dropped_lines += gone.lines()
            gone.diagnoser = None     # its parts stay in _generation (line counts): not its matches
        if first is not None:
            self._open_part(first.source, first.lineno)
            self.run.diagnoser.add_source(first.source)
