"""Live diagnosis shared by the pipe, `run` and `--follow`: bytes in, early notices out, a report at the end.

A `LiveSession` feeds blocks to a Scanner per stream and watches the Diagnoser's match list grow. It
reports on the side, while the input is still flowing:

* a predictive warning (a match of kind "warning") once per rule, marked as a warning;
* a failure (a match of kind "fatal") as soon as its evidence is complete: its traceback has closed
  (the exception and its continuation lines are in), or the line stood alone (no traceback), or the
  input has been quiet / the match has waited `settle` seconds — a server that hangs after a failure
  never closes the traceback's tail, so waiting for more would mean waiting forever.

The early finding is built the way `Diagnoser.finish` builds one (refine hook, captures, remedy), on a
copy of the matches so that the final diagnosis is not affected; the final report (root cause first)
comes from `diagnose.finish` when the input ends.

The notices go to a `Notices` writer (streams/output.Notifier in the front-ends, a list in tests): the
session decides what to say and when, never how bytes reach a terminal. A front-end that shows findings
rather than text (the TUI) also passes `on_finding` / `on_warning`, called with each early Finding and
each first warning Match right after its notice, and reads `so_far()`: the diagnosis as reported so far.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Protocol

from vllm_doctor.diagnosis.engine import Diagnoser
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Diagnosis, Finding, Match
from vllm_doctor.rules.catalog import HOOK_PACKAGES
from vllm_doctor.sources.scan import Scanner

SETTLE_S = 0.5         # the longest a complete-looking failure waits for the rest of its traceback
QUIET_LINES = 8        # lines of other output after which a traceback that stopped growing counts as closed
PREFIX = "vllm-doctor:"


class Notices(Protocol):
    """Where a session's early notices go (streams.output.Notifier)."""

    def write(self, text: str) -> None: ...

    def style(self, text: str, code: str) -> str: ...


class LiveSession:
    def __init__(self, catalog, options, notifier: Notices, *, source: str = "<stdin>",
                 settle: float = SETTLE_S, clock: Callable[[], float] = time.monotonic,
                 on_finding: Callable[[Finding], None] | None = None,
                 on_warning: Callable[[Match], None] | None = None) -> None:
        self.catalog = catalog
        self.options = options
        self.notifier = notifier
        self.on_finding = on_finding
        self.on_warning = on_warning
        self.source = source
        self.settle = settle
        self.clock = clock
        self.diagnoser = Diagnoser(catalog, Facts())
        if options.live:   # the server runs beside us now: a port fix may probe which ports are free here
            self.diagnoser.facts.set("doctor.live", True, "env")
        if options.command:
            self.diagnoser.facts.set("launch.command", options.command, "user")
        self.literals = self.diagnoser.scan_literals
        self.scanners: dict[str, Scanner] = {}
        self.retired_lines = 0                    # lines of scanners replaced (rotation, truncation)
        self._seen = 0
        self.pending: dict[str, tuple[float, list[Match]]] = {}
        self.reported: list[Finding] = []
        self.reported_rules: set[str] = set()
        self.warned: set[str] = set()
        self.warnings: list[Match] = []           # the first match of each warned rule, in report order
        self.last_fatal_at: float | None = None
        self._enriched = False
        self._growth: dict[int, tuple[tuple, int]] = {}
        self.bytes = 0
        import threading

        # Imports and flag tables an early report needs, loaded while the input starts flowing (in the
        # background, so the passthrough is not held up) rather than when a failure must be shown fast.
        self._warm = threading.Thread(target=self._warm_up, daemon=True)
        self._warm.start()

    def _warm_up(self) -> None:
        import importlib

        names = {"vllm_doctor.diagnosis.launch", "vllm_doctor.diagnosis.saved", "vllm_doctor.remedies.apply",
                 "vllm_doctor.diagnosis.arbitration", "vllm_doctor.facts.gather"}
        for rule in self.catalog.rules.values():
            for kind, spec in (("remedy", rule.remedy), ("refine", rule.refine)):
                if spec:
                    names.add(f"vllm_doctor.{HOOK_PACKAGES[kind]}." + spec.partition(":")[0])
        for name in sorted(names):
            try:
                importlib.import_module(name)
            except Exception:
                pass
        try:
            from vllm_doctor.events.logfacts import LogFacts
            from vllm_doctor.diagnosis.launch import resolve_command

            scratch = Facts()
            resolve_command(scratch, LogFacts(scratch), "vllm serve m --tensor-parallel-size 1")
        except Exception:
            pass

    # ---- input -------------------------------------------------------------------------------------
    def scanner(self, source: str | None = None) -> Scanner:
        source = source or self.source
        scanner = self.scanners.get(source)
        if scanner is None:
            scanner = self.scanners[source] = Scanner(self.literals, self.diagnoser, source=source)
            self.diagnoser.add_source(source)
        return scanner

    def restart(self, source: str | None = None) -> None:
        """The stream starts over (a truncated or rotated file): line numbers restart at 1."""
        source = source or self.source
        scanner = self.scanners.pop(source, None)
        if scanner is not None:
            scanner.close()
            self.retired_lines += scanner.lineno
            self._collect()

    def feed(self, block: bytes, source: str | None = None) -> None:
        self.bytes += len(block)
        self.scanner(source).feed(block)
        if len(self.diagnoser.matches) != self._seen:
            self._collect()

    @property
    def lines(self) -> int:
        return self.retired_lines + sum(s.lineno for s in self.scanners.values())

    def _collect(self) -> None:
        matches = self.diagnoser.matches
        new, self._seen = matches[self._seen:], len(matches)
        now = self.clock()
        for m in new:
            # a wait seen live (shm broadcast, engine core, placement group) predicts a stall: shown as a
            # warning as it happens; the final diagnosis makes it the finding if the output ends in it
            if m.kind in ("warning", "stall"):
                if m.rule_id not in self.warned:
                    self.warned.add(m.rule_id)
                    self.warnings.append(m)
                    self._warn(m)
                    if self.on_warning is not None:
                        self.on_warning(m)
            elif m.kind == "fatal":
                entry = self.pending.get(m.rule_id)
                if entry is None:
                    self.pending[m.rule_id] = (now, [m])
                else:
                    entry[1].append(m)

    # ---- early reports -----------------------------------------------------------------------------
    def timeout(self) -> float | None:
        """Seconds until a pending failure must be reported even without more input (None: no wait)."""
        if not self.pending:
            return None
        first = min(t for t, _ in self.pending.values())
        return max(0.0, first + self.settle - self.clock())

    def poll(self, idle: bool = False) -> None:
        """Report every pending failure whose evidence is complete (all of them when `idle`)."""
        if not self.pending:
            return
        now = self.clock()
        ready = [rid for rid, (t, ms) in self.pending.items()
                 if idle or now - t >= self.settle or all(self._complete(m) for m in ms)]
        if not ready:
            return
        groups: dict[str, list[Match]] = {}
        for rid in ready:
            _, ms = self.pending.pop(rid)
            for m in ms:
                groups.setdefault(rid, []).append(m)
        for finding in self._early_findings(groups):
            self.reported.append(finding)
            self.reported_rules.add(finding.rule)
            self.last_fatal_at = now
            self._announce(finding)
            if self.on_finding is not None:
                self.on_finding(finding)

    def _complete(self, m: Match) -> bool:
        """The match's traceback closed, or stopped growing while QUIET_LINES other lines went by (its
        process may never print again, so the assembler would keep its tail open until the end)."""
        tb = m.traceback
        if tb is None or tb.done:
            return True
        seq = self.diagnoser._seq
        shape = (len(tb.frames), len(tb.message), tb.exc_type)
        seen = self._growth.get(id(tb))
        if seen is None or seen[0] != shape:
            self._growth[id(tb)] = (shape, seq)
            return False
        return seq - seen[1] >= QUIET_LINES

    def flush(self) -> None:
        self.poll(idle=True)

    def _early_findings(self, groups: dict[str, list[Match]]) -> list[Finding]:
        d = self.diagnoser
        self._warm.join(5)
        try:
            from vllm_doctor.diagnosis.launch import resolve_command

            if not self._enriched:
                self._enriched = True
                from vllm_doctor.diagnosis.saved import enrich

                try:
                    enrich(d, self.options)
                except Exception:
                    pass
            command = resolve_command(d.facts, d.logfacts, self.options.command)
        except Exception:
            command = None
        # Everything this rule matched so far (supporting lines too), relabelled on copies.
        relabelled: dict[str, list[Match]] = {}
        wanted = set(groups)
        for m in d.matches:
            if m.rule_id not in wanted:
                continue
            c = copy.copy(m)
            try:
                rid = d._refine(c)
            except Exception:
                rid = m.rule_id
            relabelled.setdefault(rid, []).append(c)
        out: list[Finding] = []
        for rid, ms in relabelled.items():
            rule = self.catalog.rules.get(rid)
            if rule is None or rid in self.reported_rules or not any(m.kind == "fatal" for m in ms):
                continue
            try:
                out.append(d._build(rule, ms, command))
            except Exception:
                continue
        out.sort(key=lambda f: (-f.priority, f.first_seq))
        return out

    def _where(self, line) -> str:
        return f"{line.source or self.source}:{line.lineno}"

    def _warn(self, m: Match) -> None:
        n = self.notifier
        rule = self.catalog.rules.get(m.rule_id)
        title = rule.title if rule else m.rule_id
        n.write(f"{n.style(PREFIX, '1')} {n.style('warning', '1;33')} (predicts a failure) at "
                f"{self._where(m.line)}: {title} [{m.rule_id}]\n"
                f"{PREFIX}   {m.line.message.strip()[:300]}\n")

    def _announce(self, f: Finding) -> None:
        n = self.notifier
        where = self._where(f.evidence[0]) if f.evidence else self.source
        parts = [f"{n.style(PREFIX, '1')} {n.style('failure', '1;31')} at {where}: {f.title} [{f.rule}]\n"]
        for line in f.evidence[:2]:
            parts.append(f"{PREFIX}   {line.raw.strip()[:300]}\n")
        if f.fix is not None:
            parts.append(f"{PREFIX}   fix: {f.fix.summary}\n")
            if f.fix_command:
                parts.append(f"{PREFIX}   run: {n.style(f.fix_command, '1;32')}\n")
        parts.append(f"{PREFIX}   (the full report follows when the input ends)\n")
        n.write("".join(parts))

    def so_far(self) -> Diagnosis:
        """What has been reported so far, while the input still flows: the early findings in the order
        they were reported, the warnings seen, a copy of the facts (the session goes on changing its
        own). Not arbitrated: finish() gives the diagnosis of record."""
        d = self.diagnoser
        facts = Facts()
        facts.merge(d.facts)
        return Diagnosis(list(self.reported), facts, list(self.warnings), None, self.lines, list(d.sources))

    def settled(self) -> Diagnosis:
        """The diagnosis of record for the input so far, the session going on: what finish() would return
        if the input ended now, worked out on a copy of the diagnoser (and of each scanner, for a last
        line still without its newline). For an input that has gone quiet without ending: a server that
        failed and hangs, or one still loading."""
        d = self.diagnoser
        shared = [self.catalog, d._ac, d._literals, d._patterns, *self.catalog.patterns]   # read-only
        clone = copy.deepcopy(d, {id(o): o for o in shared})
        lines = self.retired_lines
        for scanner in self.scanners.values():
            twin = copy.copy(scanner)
            twin.sink = clone
            twin.close()
            lines += twin.lineno
        return self._diagnosis(clone, lines)

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self) -> Diagnosis:
        for scanner in self.scanners.values():
            scanner.close()
        self._collect()
        return self._diagnosis(self.diagnoser, self.lines)

    def _diagnosis(self, diagnoser: Diagnoser, lines: int) -> Diagnosis:
        from vllm_doctor.diagnosis.saved import finish

        diagnosis = finish(diagnoser, self.options, lines)
        if self.source and self.source not in diagnosis.sources:
            diagnosis.sources.insert(0, self.source)
        return diagnosis
