"""The diagnoser: lines in, findings out.

Lines arrive from a scanner (sources/scan.py) that only passes on lines a rule or a fact extractor could
care about, plus every line of a traceback while one is open (`needs_context`). The diagnoser matches
rule patterns, reassembles tracebacks, collects the log's own facts, and at the end arbitrates the
root cause and asks each finding's remedy for a fix.
"""
from __future__ import annotations

import regex

from vllm_doctor.events.logfacts import LITERALS as FACT_LITERALS, LogFacts
from vllm_doctor.events.tracebacks import Traceback, TracebackAssembler
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Diagnosis, Finding, Match, RefineContext
from vllm_doctor.numbers import as_typed
from vllm_doctor.rules.catalog import GENERIC_PRIORITY, Catalog, Pattern, Rule, resolve_hook
from vllm_doctor.sources.lines import Line

ARGPARSE_ERROR = regex.compile(r"^(?:usage: .*|[\w.\- ]+: error: (?P<msg>.+))$")
MAX_EVIDENCE = 6
FOLLOWING_WINDOW = 50     # lines between a bare fatal line and the end of the traceback that follows it


class Diagnoser:
    def __init__(self, catalog: Catalog, facts: Facts | None = None) -> None:
        import ahocorasick_rs

        self.catalog = catalog
        self.facts = facts if facts is not None else Facts()
        self.logfacts = LogFacts(self.facts)
        self.tracebacks = TracebackAssembler()
        self.matches: list[Match] = []
        self.error_lines: list[Line] = []
        self.lines = 0
        self.sources: list[str] = []
        self._seq = 0
        self._ready = 0        # sequence number of the last "server ready" line (set by finish)
        by_literal: dict[str, list[Pattern]] = {}
        for pattern in catalog.patterns:
            by_literal.setdefault(pattern.literal, []).append(pattern)
        self._literals = list(by_literal)
        self._patterns = [by_literal[lit] for lit in self._literals]
        self._ac = ahocorasick_rs.AhoCorasick(self._literals) if self._literals else None

    @property
    def scan_literals(self) -> list[str]:
        """Every substring that makes a line worth a look: rule literals, facts, tracebacks."""
        return sorted(set(self._literals) | set(self.catalog.structural) | set(FACT_LITERALS))

    @property
    def needs_context(self) -> bool:
        return self.tracebacks.busy or self.logfacts.busy

    def add_source(self, name: str) -> None:
        """A log about to be read: named in the report even when no line of it is ever looked at."""
        if name and name not in self.sources:
            self.sources.append(name)

    def feed(self, line: Line) -> list[Match]:
        self._seq += 1
        if line.source and (not self.sources or self.sources[-1] != line.source):
            self.add_source(line.source)
        tb = self.tracebacks.feed(line)
        if tb is not None and tb.exc_line is line:
            tb.end_seq = self._seq
        message = line.message
        self.logfacts.feed(line.raw, message, line.ip, self._seq)
        if ": error: " in message and ARGPARSE_ERROR.match(message):
            self.error_lines.append(line)
        new: list[Match] = []
        if self._ac is None or not message:
            return new
        hits = {i for i, _, _ in self._ac.find_matches_as_indexes(message, overlapping=True)}
        for index in sorted(hits):
            for pattern in self._patterns[index]:
                m = pattern.regex.search(message)
                if m:
                    captures = {k: v for k, v in m.groupdict().items() if v is not None}
                    match = Match(pattern.rule_id, pattern, captures, line, tb,
                                  frozenset(self.logfacts.milestones), self._seq)
                    self.matches.append(match)
                    new.append(match)
        return new

    def finish(self, command=None) -> Diagnosis:
        """`command`: the launch command model (launch.resolve_command), whose flags remedies edit."""
        from vllm_doctor.diagnosis.arbitration import arbitrate, unrecognized_finding

        self.tracebacks.close()
        self.logfacts.finish()
        self.publish_hosts()
        groups: dict[str, list[Match]] = {}
        for match in self.matches:
            rule_id = self._refine(match)
            if rule_id in self.catalog.rules:
                groups.setdefault(rule_id, []).append(match)
        # The server came up after these lines: whatever they said, vLLM recovered from it.
        ready = self._ready = self.logfacts.last_seen.get("server_ready", 0)
        fatal = {rid: ms for rid, ms in groups.items() if any(m.kind == "fatal" and m.seq > ready for m in ms)}
        warnings = [m for rid, ms in groups.items() if rid not in fatal for m in ms if m.kind == "warning"]
        findings = [self._build(self.catalog.rules[rid], ms, command) for rid, ms in fatal.items()]
        findings = arbitrate(findings)
        if not findings:
            after = [tb for tb in self.tracebacks.finished if (tb.end_seq or self._seq) > ready]
            finding = unrecognized_finding(after, [ln for ln in self.error_lines if ready == 0], self.catalog)
            if finding:
                findings = [finding]
        return Diagnosis(findings, self.facts, warnings, command, self.lines, self.sources)

    def publish_hosts(self) -> None:
        """The hosts and addresses the log names, as facts (facts.origin asks them before enrichment)."""
        if self.logfacts.node_ips:
            self.facts.set("log.node_ips", sorted(self.logfacts.node_ips), "log")
        if self.logfacts.hostnames:
            self.facts.set("log.hostnames", sorted(self.logfacts.hostnames), "log")

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
            new = hook(RefineContext(match, tb, self.facts, match.milestones))
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
        finding = Finding(rule.id, rule.title, rule.severity, confidence, evidence, "",
                          facts=as_typed(captures), priority=rule.priority, family=rule.family,
                          first_seq=fatal[0].seq,
                          supporting=supporting)
        run_remedy(finding, rule, captures, matches, self.facts, command)
        return finding
