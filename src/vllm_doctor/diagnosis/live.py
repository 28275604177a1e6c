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
from vllm_doctor.diagnosis.runs import MAX_RUNS, Run, RunSplitter
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Diagnosis, Finding, Match
from vllm_doctor.rules.hooks import HOOK_PACKAGES
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
        # one Diagnoser per run: a second launch in the stream, or a rotated or truncated file, is
        # diagnosed on its own (diagnosis/runs.py)
        self.runs = RunSplitter(self._new_diagnoser, on_split=self._run_ends)
        self._earlier: dict[Run, Diagnosis] = {}     # earlier runs, finished
        self._earlier_so_far: list[Diagnosis] = []  # ... and what was reported of them as they ran
        self.literals = self.diagnoser.scan_literals
        self.scanners: dict[str, Scanner] = {}
        self.pending: dict[str, tuple[float, list[Match]]] = {}
        self.reported: list[Finding] = []
        # rules --ignore names are never told live: as if already told (diagnosis/ignore.py drops them at the end)
        self.reported_rules: set[str] = set(getattr(options, "ignore", ()))
        self.warned: set[str] = set(getattr(options, "ignore", ()))
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

    # ---- runs --------------------------------------------------------------------------------------
    def _new_diagnoser(self) -> Diagnoser:
        diagnoser = Diagnoser(self.catalog, Facts())
        diagnoser.store.track()     # the session reports each match as it comes
        if self.options.live:   # the server runs beside us now: a port fix may probe which ports are free here
            diagnoser.facts.set("doctor.live", True, "env")
        if self.options.command:
            diagnoser.facts.set("launch.command", self.options.command, "user")
        return diagnoser

    @property
    def diagnoser(self) -> Diagnoser:
        """The current run's diagnoser."""
        return self.runs.diagnoser

    def _run_ends(self, run: Run, start) -> None:
        """A run is over (a new launch at `start`, or a restart): its failures are reported now, and the
        next run's are reported afresh."""
        self._collect()
        self.poll(idle=True)
        so_far = self.so_far()
        so_far.run_label, so_far.earlier = run.label(self._now()), []
        self._earlier_so_far = [*self._earlier_so_far, so_far][-(MAX_RUNS - 1):]
        self.pending, self._growth = {}, {}
        self.reported, self.reported_rules = [], set(getattr(self.options, "ignore", ()))
        self.warned, self.warnings = set(getattr(self.options, "ignore", ())), []
        self._enriched = False
        if start is not None:
            self.notifier.write(f"{PREFIX} a new launch starts at {self._where(start)}: it is diagnosed as "
                                f"a run of its own\n")

    # ---- input -------------------------------------------------------------------------------------
    def scanner(self, source: str | None = None) -> Scanner:
        source = source or self.source
        scanner = self.scanners.get(source)
        if scanner is None:
            scanner = self.scanners[source] = Scanner(self.literals, self.runs, source=source)
            self.runs.begin_source(source)
        return scanner

    def restart(self, source: str | None = None, reason: str = "rotation") -> None:
        """The stream starts over (a truncated or rotated file): line numbers restart at 1, and what
        follows is a new run (`reason`: "rotation" or "truncation", named in the earlier run's label)."""
        source = source or self.source
        scanner = self.scanners.pop(source, None)
        if scanner is not None:
            scanner.close()
            self._collect()
            self.runs.restart(source, scanner.lineno, f"before {reason}")

    def feed(self, block: bytes, source: str | None = None) -> None:
        self.bytes += len(block)
        self.scanner(source).feed(block)
        if self.diagnoser.store.fresh:
            self._collect()

    @property
    def lines(self) -> int:
        """The current run's lines so far."""
        return self.runs.run.lines(self._now())

    def _now(self) -> dict[str, int]:
        return {source: scanner.lineno for source, scanner in self.scanners.items()}

    def _collect(self) -> None:
        now = self.clock()
        for m in self.diagnoser.store.take_fresh():
            # a wait seen live (shm broadcast, engine core, placement group) predicts a stall: shown as a
            # warning as it happens; the final diagnosis makes it the finding if the output ends in it
            if m.kind in ("warning", "stall"):
                rule = self.catalog.rules.get(m.rule_id)
                if m.kind == "stall" and rule is not None and rule.answerable:
                    continue    # NCCL's `Init START`: every healthy NCCL_DEBUG=INFO run prints it, and its
                    # `Init COMPLETE` follows; only a log that ends unanswered is a stall (the final report)
                if m.rule_id not in self.warned:
                    self.warned.add(m.rule_id)
                    self.warnings.append(m)
                    self._warn(m)
                    if self.on_warning is not None:
                        self.on_warning(m)
            elif m.kind == "fatal" and m.rule_id not in self.reported_rules:
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
        from vllm_doctor.diagnosis.arbitration import absorbed_by

        for finding in self._early_findings(groups):
            self.reported_rules.add(finding.rule)
            root = absorbed_by(finding, self.reported)
            if root is not None:        # its lines are the reported failure's evidence (the final report's too)
                root.supporting.extend(finding.evidence)
                continue
            self.reported.append(finding)
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
        # Everything this rule matched so far (supporting lines too: the store's bounded sample),
        # relabelled on copies.
        relabelled: dict[str, list[Match]] = {}
        for m in d.store.of_rules(groups):
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
        # a failure's wording that vLLM printed as a WARNING and went on from (`Failed to import from vllm._C`,
        # printed by design on TPU, CPU and GPU-less hosts) predicts nothing yet: the final report decides
        why = "vLLM printed it as a warning and went on" if m.pattern.kind == "fatal" else "predicts a failure"
        n.write(f"{n.style(PREFIX, '1')} {n.style('warning', '1;33')} ({why}) at "
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
            if f.rewrite is not None and f.rewrite.runnable:       # `run:` only for a command line
                parts.append(f"{PREFIX}   run: {n.style(f.rewrite.command, '1;32')}\n")
            elif f.rewrite is not None and f.rewrite.form in ("edit", "flags"):
                shown = f.rewrite.instruction if f.rewrite.form == "edit" else "; ".join(f.rewrite.changes)
                parts.append(f"{PREFIX}   {f.rewrite.form if f.rewrite.form == 'edit' else 'change'}: {shown}\n")
        parts.append(f"{PREFIX}   (the full report follows when the input ends)\n")
        n.write("".join(parts))

    def so_far(self) -> Diagnosis:
        """What has been reported so far, while the input still flows: the early findings in the order
        they were reported, the warnings seen, a copy of the facts (the session goes on changing its
        own). Not arbitrated: finish() gives the diagnosis of record."""
        d = self.diagnoser
        facts = Facts()
        facts.merge(d.facts)
        return Diagnosis(list(self.reported), facts, list(self.warnings), None, self.lines, list(d.sources),
                         earlier=list(self._earlier_so_far))

    def settled(self) -> Diagnosis:
        """The diagnosis of record for the input so far, the session going on: what finish() would return
        if the input ended now, worked out on a copy of the diagnoser (and of each scanner, for a last
        line still without its newline). For an input that has gone quiet without ending: a server that
        failed and hangs, or one still loading."""
        d = self.diagnoser
        memo = {id(o): o for o in (self.catalog, d.index, *self.catalog.patterns)}    # read-only, shared
        memo[id(d.repeats.exact)], memo[id(d.repeats.numbers)] = {}, {}     # the copy is only finished
        clone = copy.deepcopy(d, memo)
        now = {}
        for source, scanner in self.scanners.items():
            twin = copy.copy(scanner)
            twin.sink = clone
            twin.close()
            now[source] = twin.lineno
        current = copy.copy(self.runs.run)
        current.diagnoser = clone
        return self._diagnosis([*self.runs.runs[:-1], current], now)

    # ---- the end -----------------------------------------------------------------------------------
    def finish(self) -> Diagnosis:
        for scanner in self.scanners.values():
            scanner.close()
        self._collect()
        now = self._now()
        for source, lines in now.items():
            self.runs.end_source(source, lines)
        return self._diagnosis(self.runs.runs, now)

    def _diagnosis(self, runs: list[Run], now: dict[str, int]) -> Diagnosis:
        """The last run's diagnosis of record, the earlier runs' (finished once) in its `earlier`."""
        from vllm_doctor.diagnosis.saved import finish, finish_runs

        def finish_one(diagnoser: Diagnoser, options, lines: int) -> Diagnosis:
            diagnosis = finish(diagnoser, options, lines)
            if self.source and self.source not in diagnosis.sources:
                diagnosis.sources.insert(0, self.source)
            return diagnosis

        return finish_runs(runs, finish_one, self.options, now, self._earlier,
                           (self.runs.dropped, self.runs.dropped_lines))
