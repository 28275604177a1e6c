"""The diagnoser: lines in, findings out.

Lines arrive from a scanner (sources/scan.py) that only passes on lines a rule or a fact extractor could
care about, plus every line of a traceback while one is open (`needs_context`). The diagnoser matches
rule patterns, reassembles tracebacks, collects the log's own facts, and at the end arbitrates the
root cause and asks each finding's remedy for a fix.
"""
from __future__ import annotations

from collections import deque

import regex

from vllm_doctor.diagnosis.evidence import MatchStore
from vllm_doctor.diagnosis.index import catalog_index
from vllm_doctor.diagnosis.outcome import (Outcome, all_clear_notices, decide, exit_noise_only, exit_only,
                                          fatal_lines, interrupted_at, vllm_ready)
from vllm_doctor.diagnosis.repeats import RepeatCache
from vllm_doctor.diagnosis.raised_in import raised_in_matches
from vllm_doctor.diagnosis.stuck import StuckRequests
from vllm_doctor.diagnosis.wraps import Wraps
from vllm_doctor.events.deaths import ABORTED, RAY_OOM_WORDS, death_signal
from vllm_doctor.events.logfacts import LogFacts
from vllm_doctor.events.nodes import NodeTracker
from vllm_doctor.events.requests import request_error, request_notice, request_tracebacks
from vllm_doctor.events.script import publish_script
from vllm_doctor.events.tracebacks import Traceback, TracebackAssembler, failing
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Diagnosis, Finding, Match, RefineContext
from vllm_doctor.numbers import as_typed
from vllm_doctor.remedies.placement import place_on_node
from vllm_doctor.rules.catalog import GENERIC_PRIORITY, Catalog, Rule
from vllm_doctor.rules.hooks import resolve_hook
from vllm_doctor.rules.search import LONG_LINE, SEARCH_TIMEOUT, bounded_search
from vllm_doctor.sources.lines import Line
from vllm_doctor.sources.tolerant import join_continuation, looks_damaged, readings

ARGPARSE_ERROR = regex.compile(r"^(?:usage: .*|[\w.\- ]+: error: (?P<msg>.+))$")
MAX_EVIDENCE = 6
ANSWER_LINES = 5000      # lines looked at for the answer to a wait (NCCL: Init COMPLETE within seconds)
FUZZY_LINES = 12          # the last error lines no rule matched, tried against retyped phrases
FOLLOWING_WINDOW = 50     # lines between a bare fatal line and the end of the traceback that follows it


def _frame_or_code(tb: Traceback | None, line: Line, message: str) -> bool:
    """A traceback's `File "..."` line or the source line under it: indented, never damaged text."""
    if tb is None or not tb.frames:
        return False
    frame = tb.frames[-1]
    return frame.line is line or frame.code == message.strip()


class Diagnoser:
    def __init__(self, catalog: Catalog, facts: Facts | None = None) -> None:
        self.catalog = catalog
        self.facts = facts if facts is not None else Facts()
        self.logfacts = LogFacts(self.facts)
        self.tracebacks = TracebackAssembler()
        self.store = MatchStore()      # every match, in bounded memory (diagnosis/evidence.py)
        self.repeats = RepeatCache(self)   # lines whose outcome is known (diagnosis/repeats.py)
        self._stop_lines: dict[int, Line] = {}     # logfacts.stops' lines, by sequence number, for the report
        self.outcome = Outcome()                   # how the run ended (diagnosis/outcome.py), set by finish
        self._warned_promoted: set[str] = set()   # rules whose warning-level lines became the failure
        self._phases = 0               # milestones reached so far: a new one empties the repeat cache
        self.error_lines: list[Line] = []
        self._error_seqs: list[int] = []
        self._unexplained: deque = deque(maxlen=FUZZY_LINES)   # error-looking lines no pattern matched
        self._bare_errors = 0       # ERROR/CRITICAL lines outside any traceback that no pattern matched, all of them
        self.request_lines: deque = deque(maxlen=FUZZY_LINES)   # a request handler's errors (events/requests.py)
        self.lines = 0
        self.sources: list[str] = []
        self._seq = 0
        self._ready = 0        # sequence number of the last "server ready" line (set by finish)
        self._tb_seen = 0      # finished tracebacks already looked at as joined exception lines
        self._unanswered = 0   # waits of rules that print an answer (Init START) still without one
        self._answer_by = 0    # ... looked for in every line up to this sequence number
        self.index = catalog_index(catalog)       # shared by every Diagnoser of the catalog, read-only
        self.skipped: dict[str, int] = {}         # rule id -> lines its regex ran out of time on
        self.nodes = NodeTracker()                # which node printed each line (multi-node logs)
        self.wraps = Wraps()                      # a rule's line cut at a terminal's width (wraps.py)
        self.stuck = StuckRequests()              # stats lines of requests that make no progress (stuck.py)

    @property
    def scan_literals(self) -> list[str]:
        return self.index.scan_literals

    @property
    def needs_context(self) -> bool:
        return (self.tracebacks.busy or self.logfacts.busy or self.nodes.busy
                or (self._unanswered > 0 and self._seq < self._answer_by) or self.wraps.pending)

    def add_source(self, name: str) -> None:
        """A log about to be read: named in the report even when no line of it is ever looked at."""
        if name and name not in self.sources:
            self.sources.append(name)

    def feed(self, line: Line, key: tuple[bytes, bytes] | None = None) -> list[Match]:
        """`key`: the line's bytes and number key (sources/scan.py) when the scanner can skip its later
        copies; the line is remembered if it changed nothing but matches."""
        quiet = key is not None and not self.needs_context
        self._seq += 1
        if line.source and (not self.sources or self.sources[-1] != line.source):
            self.add_source(line.source)
        tb = self.tracebacks.feed(line)
        if tb is not None:
            if tb.exc_line is line:
                tb.end_seq = self._seq
            if tb.start is line:
                tb.start_seq = self._seq
        message = line.message
        self.nodes.feed(line, self._seq)
        self.logfacts.feed(line.raw, message, line.ip, self._seq, self.nodes.last_node)
        if "Avg prompt throughput:" in message:
            self.stuck.feed(line, self._seq)
        if self.logfacts.stops and self.logfacts.stops[-1] == self._seq:
            self._stop_lines[self._seq] = line
        if ": error: " in message and bounded_search(ARGPARSE_ERROR, message, "match"):
            self.error_lines.append(line)
            self._error_seqs.append(self._seq)
        new: list[Match] = []
        first, joined = self.wraps.readings(line)       # a rule's line cut at a terminal's width (wraps.py)
        any(self._match(first, text, tb) for text in joined)
        if self.index.ac is not None and message:
            new = self._match(line, message, tb)
            self.wraps.note(line, tb is None and not new, self.index.ac)
            if not new and looks_damaged(message) and not _frame_or_code(tb, line, message):
                for reading in readings(message):
                    new = self._match(line, reading, tb)
                    if new:
                        break
        if not new and message and (line.level in ("ERROR", "CRITICAL") or "rror" in message or "xception" in message
                                    or ABORTED in message or RAY_OOM_WORDS in message or " fatal " in message
                                    or death_signal(message)):
            if request_error(line, tb.exc_type if tb is not None else None, tb):
                self.request_lines.append(line)
            else:
                self._unexplained.append((line, tb, self._seq))
                self._bare_errors += tb is None and line.level in ("ERROR", "CRITICAL")
        self._joined_exceptions()
        repeats = self.repeats
        repeats.source = line.source
        if len(self.logfacts.milestones) != self._phases:
            self._phases = len(self.logfacts.milestones)
            repeats.clear()
        elif quiet and tb is None and not self.needs_context:
            repeats.learn(key, line, new)
        return new

    def _match(self, line: Line, text: str, tb: Traceback | None) -> list[Match]:
        """Every pattern that matches `text` (the line's message or a repaired reading of it)."""
        new: list[Match] = []
        found = self.index.ac.find_matches_as_indexes(text, overlapping=True)
        if len(text) <= LONG_LINE:            # the hits' offsets only place the windows of a long line
            hits: dict[int, list[int]] = dict.fromkeys((i for i, _, _ in found), ())
        else:
            hits = {}
            for i, start, _ in found:
                hits.setdefault(i, []).append(start)
        for index in sorted(hits):
            for pattern in self.index.patterns[index]:
                m = pattern.search(text, hits[index], self.skipped)
                if m:
                    captures = {k: v for k, v in m.groupdict().items() if v is not None}
                    match = Match(pattern.rule_id, pattern, captures, line, tb,
                                  frozenset(self.logfacts.milestones), self._seq, matched=m.group(0))
                    self.store.add(match)
                    new.append(match)
                    if pattern.rule_id in self.index.answered_rules:
                        if pattern.kind == "stall":
                            self._unanswered += 1
                            self._answer_by = self._seq + ANSWER_LINES
                        elif pattern.kind == "progress":
                            self._unanswered = max(0, self._unanswered - 1)
        return new

    def _joined_exceptions(self) -> None:
        """An exception message wrapped over several lines is matched once more as one line, when its
        traceback closes (the rules know messages as vLLM prints them, on one line)."""
        finished = self.tracebacks.finished
        while self._tb_seen < len(finished):
            tb = finished[self._tb_seen]
            self._tb_seen += 1
            if tb.exc_type and tb.exc_line is not None and "\n" in tb.message:
                parts = tb.message.split("\n")
                # wrapped at a word boundary (joined with a blank) or inside a word (a fixed-width cut)
                texts = [f"{tb.exc_type}: {join_continuation(parts)}", f"{tb.exc_type}: {''.join(parts)}"]
                known = {m.rule_id for m in self.store if m.traceback is tb}
                found = next((got for text in texts for reading in (text, *readings(text))
                              if (got := self._match(tb.exc_line, reading, tb))), [])
                for match in found:
                    match.seq = tb.end_seq or match.seq
                    if match.rule_id in known:
                        self.store.remove(match)

    def finish(self, command=None) -> Diagnosis:
        """`command`: the launch command model (launch.resolve_command), whose flags remedies edit."""
        from vllm_doctor.diagnosis.arbitration import arbitrate, explained_waits, unrecognized_finding

        self.tracebacks.close()
        self._joined_exceptions()
        self.logfacts.finish()
        self.logfacts.publish_hosts()
        publish_script(self.tracebacks.finished, self.facts)
        for match in raised_in_matches(self.catalog, self.tracebacks.finished, self.store.tracebacks):
            self.store.add(match)
        groups: dict[str, list[Match]] = {}
        declined: list[str] = []      # why a rule whose words matched named no cause (Match.unsupported)
        for match in self.store:
            rule_id = self._refine(match)
            if rule_id in self.catalog.rules:
                groups.setdefault(rule_id, []).append(match)
            elif match.unsupported and match.unsupported not in declined:
                declined.append(match.unsupported)
        self._warned_promoted = set()
        # A served run that was then stopped: what its stop printed is no failure (diagnosis/outcome.py).
        outcome = self.outcome = decide(self.logfacts.first_seen,
                                        self.logfacts.stops + interrupted_at(self.tracebacks.finished))
        groups = {rid: kept for rid, ms in groups.items() if (kept := [m for m in ms if not outcome.is_shutdown(m.seq)])}
        # The server came up after these lines: whatever they said, vLLM recovered from it.
        every = self._failure_seqs(groups)
        ready = self._ready = vllm_ready(self.logfacts.first_seen, self.logfacts.last_seen, every)
        failures = [seq for seq in every if seq > ready]
        precursors = self._promote_precursors(groups, ready, failures)
        fatal = {rid: ms for rid, ms in groups.items() if any(m.kind == "fatal" and m.seq > ready for m in ms)}
        if not fatal and failures:
            fatal = self._promote_warned(groups, ready, failures)
        if not fatal and not failures:
            fatal = explained_waits(self._promote_stalls(groups, ready)) or self._promote_warned(groups, ready, failures)
        warnings = [m for rid, ms in groups.items() if rid not in fatal for m in ms if m.kind == "warning"]
        findings = [self._build(self.catalog.rules[rid], ms, command) for rid, ms in fatal.items()]
        for finding in findings:
            finding.precursor = finding.rule in precursors
            if finding.rule in self._warned_promoted:
                finding.confidence = "low"
                finding.notes.append("vLLM printed this as a warning and went on; it is named as the cause "
                                     "because no other line of the log explains the failure")
        findings = arbitrate(findings)
        if not findings:
            findings = self._retyped(command, max(ready, outcome.stopped))
        if not findings:
            findings = self._hung_while_serving(groups, ready)
        if not findings and not exit_noise_only(self.tracebacks.finished, self._bare_errors + len(self.error_lines)):
            requests = request_tracebacks(self.tracebacks.finished)
            after = [tb for tb in self.tracebacks.finished if (tb.end_seq or self._seq) > ready
                     and not outcome.is_shutdown(tb.end_seq or tb.start_seq, tb.exc_type) and id(tb) not in requests]
            errors = [ln for ln in self.error_lines if ready == 0] + fatal_lines(
                outcome, self._unexplained, ready, self.nodes.peers_gone)
            finding = unrecognized_finding(after, errors, self.catalog, declined)
            if finding:
                findings = [finding]
        diagnosis = Diagnosis(findings, self.facts, warnings, command, self.lines, self.sources,
                              notices=self.skipped_notices() + ([] if findings else all_clear_notices(
                                  outcome, self.tracebacks.finished, self._stop_lines, self.logfacts.milestones)
                                  or request_notice(list(self.request_lines))))
        diagnosis.outcome = outcome.label
        if findings:
            diagnosis.nodes = self.nodes.where_it_started(findings[0], self.store, ready, self.facts.by_node)
            place_on_node(findings[0], diagnosis.nodes, self.nodes.has_ips)
        from vllm_doctor.remedies.combine import combine

        diagnosis.combined = combine(findings, command, self.facts)
        return diagnosis

    def skipped_notices(self) -> list[str]:
        """One notice per rule whose regex ran out of time on some lines (they counted as no match)."""
        return [f"rule {rule_id}: {n:,} line{'s' if n > 1 else ''} not matched: its regex ran past "
                f"{SEARCH_TIMEOUT * 1000:g} ms on {'them' if n > 1 else 'it'} (a pattern that backtracks)"
                for rule_id, n in sorted(self.skipped.items())]

    def _retyped(self, command, ready: int) -> list[Finding]:
        """Nothing explains the failure: try the error lines no pattern matched for a rule's phrase
        retyped or re-cased (rules/fuzzy.py), latest first."""
        from vllm_doctor.rules.fuzzy import fuzzy_match

        for line, tb, seq in reversed(self._unexplained):
            if seq <= ready:
                break
            hit = fuzzy_match(self.catalog, line.message, self.skipped)
            if hit is None:
                continue
            pattern, captures = hit
            match = Match(pattern.rule_id, pattern, captures, line, tb, frozenset(self.logfacts.milestones), seq)
            if match.kind != "fatal":   # printed as a WARNING: vLLM went on after it (warning-is-no-cause) ...
                if not pattern.warning_alone:
                    continue
                match.promoted = True   # ... unless its line alone names the cause (_promote_warned's rule)
            rule_id = self._refine(match)
            if rule_id not in self.catalog.rules:
                continue
            finding = self._build(self.catalog.rules[rule_id], [match], command)
            finding.confidence = "low"
            finding.notes.append("read from a retyped or damaged wording of the message (not the exact text vLLM "
                                 "prints): check the evidence line")
            return [finding]
        return []

    def _failure_seqs(self, groups: dict[str, list[Match]]) -> list[int]:
        """Where the log shows something failing: a fatal line, a traceback (even one cut before its exception),
        an argparse error; none of a stop's own."""
        outcome = self.outcome
        seqs = [m.seq for ms in groups.values() for m in ms if m.kind == "fatal"]
        seqs += [tb.end_seq or tb.start_seq for tb in self.tracebacks.finished if failing(tb) and not exit_only(tb)
                 and not outcome.is_shutdown(tb.end_seq or tb.start_seq, tb.exc_type)]
        seqs += [seq for seq in self._error_seqs if not outcome.is_shutdown(seq)]
        return seqs

    def _promote_precursors(self, groups: dict[str, list[Match]], ready: int, failures: list[int]) -> set[str]:
        """Precursor lines become the failure when a failure follows them or the server never came up, unless
        what follows is a failure that names its own cause (Ray's OOM killer on host memory)."""
        promoted: set[str] = set()
        # Ray's OOM killer names its own cause (the node's host memory): no precursor before it explains it
        host_oom = [seq for line, _, seq in self._unexplained if RAY_OOM_WORDS in line.message]
        for rule_id, matches in groups.items():
            early = [m for m in matches if m.pattern.kind == "precursor" and m.seq > ready]
            if early and any(seq > early[0].seq for seq in host_oom):
                continue
            if early and (ready == 0 or any(seq > early[0].seq for seq in failures)):
                for m in early:
                    m.promoted = True
                promoted.add(rule_id)
        return promoted

    def _promote_warned(self, groups: dict[str, list[Match]], ready: int, failures: list[int]) -> dict[str, list[Match]]:
        """A failure line vLLM printed as a WARNING (Match.printed_as_warning) is the cause only when no failure
        with a rule of its own is there: a failure without a rule follows it, or, for a pattern whose line
        alone names a cause (`warning_alone`), the log ends short of ready with nothing else wrong (a
        fragment). It then explains the run, at low confidence."""
        promoted: dict[str, list[Match]] = {}
        for rule_id, matches in groups.items():
            warned = [m for m in matches if m.pattern.kind == "fatal" and m.printed_as_warning and m.seq > ready]
            alone = [m for m in warned if m.pattern.warning_alone]
            if warned and ((failures and max(failures) > warned[0].seq) or (not failures and not ready and alone)):
                for m in warned:
                    m.promoted = True
                promoted[rule_id] = matches
        self._warned_promoted = set(promoted)
        return promoted

    def _promote_stalls(self, groups: dict[str, list[Match]], ready: int) -> dict[str, list[Match]]:
        """A log that ends waiting, the server never ready and nothing failing. A wait with an answer
        (NCCL's `Init START` / `Init COMPLETE`) stalls when some wait has no answer and no start-up
        milestone came after it; vLLM's own waits (engine core, shm broadcast, placement group) have none,
        so a start-up that waited and then stopped short of ready (the engine never reported ready after the
        wait) is stalled in the last phase it reached."""
        if self.outcome.served:
            return {}       # a wait after the server served is a hang while serving (_hung_while_serving)
        stalled: dict[str, list[Match]] = {}
        last_milestone = max(self.logfacts.last_seen.values(), default=0)
        for rule_id, matches in groups.items():
            waits = [m for m in matches if m.pattern.kind == "stall"]
            if not waits:
                continue
            answers = [m for m in matches if m.pattern.kind == "progress"]
            if answers or self.catalog.rules[rule_id].answerable:
                # counted, not the kept sample: a big job prints thousands of waits and answers
                answered = self.store.count_kind(rule_id, "progress") >= self.store.count_kind(rule_id, "stall")
                if answered or last_milestone > waits[-1].seq:
                    continue
            if self.logfacts.last_seen.get("engine_ready", 0) > waits[-1].seq:
                continue        # the engine finished starting after the wait: what it waited for came
            for wait in waits:              # every wait is evidence; the last one names the phase
                wait.promoted = True
            waits[-1].milestones = frozenset(self.logfacts.milestones)   # the phase the log ends in
            stalled[rule_id] = matches
        return stalled

    def _hung_while_serving(self, groups: dict[str, list[Match]], ready: int) -> list[Finding]:
        """The server was up (ready, or its stats/access lines show it serving), then the log ends in waits
        of vLLM's own (shm broadcast) with no serving line after the last one and nothing failing: a hang
        while serving. Not a start-up stall, and no rule names its cause: said as such, never an all-clear."""
        from vllm_doctor.diagnosis.arbitration import hung_finding

        # the engine's own progress (ready, a stats line); else the first request the HTTP server answered
        served = max(ready, self.logfacts.last_seen.get("serving", 0)) or self.logfacts.first_seen.get("http_served", 0)
        if not served or self.error_lines and max(self._error_seqs, default=0) > served:
            return []
        waits = [m for ms in groups.values() for m in ms if m.pattern.kind == "stall" and m.seq > served
                 and not m.pattern.startup_only and not self.outcome.is_shutdown(m.seq)]
        if any(m.kind == "fatal" and m.seq > served for ms in groups.values() for m in ms):
            return []
        if not waits:       # no wait line: requests running at 0 tokens/s to the end (diagnosis/stuck.py)
            stuck = self.stuck.hung() if self.outcome.stopped <= self.stuck.last_seq else []   # no stop after
            return [hung_finding(stuck, self.stuck.count)] if stuck else []
        return [hung_finding([m.line for m in sorted(waits, key=lambda m: m.seq)],
                             self.store.count_like(m.pattern for m in waits))]

    def _following_traceback(self, match: Match) -> Traceback | None:
        """A line outside any traceback that a Python error follows closely (NCCL's `WARN Cuda failure
        'out of memory'`, then `NCCL error: unhandled cuda error` with its frames): that traceback's
        frames say where the failure happened."""
        after = [tb for tb in self.tracebacks.finished
                 if tb.end_seq and 0 < tb.end_seq - match.seq <= FOLLOWING_WINDOW]
        return min(after, key=lambda tb: tb.end_seq) if after else None

    def _refine(self, match: Match) -> str:
        rule = self.catalog.rules.get(match.rule_id)
        if rule is None or not rule.refine:
            return match.rule_id
        try:
            hook = resolve_hook("refine", rule.refine)
            tb = match.traceback or self._following_traceback(match)
            new = hook(RefineContext(match, tb, self.facts, match.milestones, frozenset(self.logfacts.milestones)))
        except Exception:  # a broken hook must never cost the diagnosis
            return match.rule_id
        if new:
            match.rule_id = new
        return match.rule_id

    def _build(self, rule: Rule, matches: list[Match], command) -> Finding:
        from vllm_doctor.remedies.apply import run_remedy

        fatal = [m for m in matches if m.kind == "fatal" and m.seq > self._ready]
        captures: dict[str, str] = {}
        for m in fatal + [m for m in matches if m.kind != "fatal"]:
            for key, value in m.captures.items():
                captures.setdefault(key, value)
        evidence: list[Line] = []
        seen: set[str] = set()
        for m in fatal:
            if m.line.message not in seen and len(evidence) < MAX_EVIDENCE:
                seen.add(m.line.message)
                evidence.append(m.line)
        supporting = [m.line for m in matches if m.kind != "fatal"][:MAX_EVIDENCE]
        in_exception = any(m.traceback is not None and m.traceback.exc_line is m.line for m in fatal)
        confidence = "high" if (in_exception or any(m.line.level in ("ERROR", "CRITICAL") for m in fatal)
                                or rule.priority >= 80) else "medium"
        if rule.priority < GENERIC_PRIORITY:
            confidence = "medium" if confidence == "high" else "low"
        # every failing line fits the rule's words but lacks its cause's evidence: a guess, said as one
        unsupported = bool(fatal) and all(m.unsupported for m in fatal)
        if unsupported:
            confidence = "low"
        finding = Finding(rule.id, rule.title, rule.severity, confidence, evidence, "",
                          facts=as_typed(captures), priority=rule.priority, family=rule.family,
                          first_seq=(fatal or matches)[0].seq,
                          supporting=supporting,
                          more_like_it=max(0, self.store.count_like(m.pattern for m in fatal) - len(evidence)),
                          marks={(m.line.source, m.line.lineno): m.matched for m in reversed(fatal) if m.matched})
        if unsupported:
            finding.notes.extend(dict.fromkeys(m.unsupported for m in fatal))
        run_remedy(finding, rule, captures, matches, self.facts, command)
        return finding
