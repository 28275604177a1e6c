"""The nouns every stage after the rules shares: a rule's match, a finding, a diagnosis, a fix.

Nothing here runs a pipeline: the engine (diagnosis/engine.py) makes Matches and Findings, the remedies
make Fixes, the reports read them. Keeping the nouns apart from the engine is what lets arbitration,
remedies and reports import them without importing the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:    # annotations only: importing the nouns costs nothing at start-up
    from vllm_doctor.command.edits import Edit
    from vllm_doctor.events.tracebacks import Traceback
    from vllm_doctor.facts import Facts
    from vllm_doctor.rules.catalog import Pattern
    from vllm_doctor.sources.lines import Line


@dataclass
class Alternative:
    summary: str
    edits: list[Edit] = field(default_factory=list)
    cost: str = ""            # what this choice costs the user (shorter context, slower, ...)


@dataclass
class Fix:
    summary: str
    edits: list[Edit] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    arithmetic: list[str] = field(default_factory=list)   # lines a person can check by hand
    facts_used: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)        # caveats (unknown facts, assumptions)


@dataclass
class Rewrite:
    """How a fix reaches the user, in the shape they launched with (remedies/shape.py decides).

    form: command   - `command` is their own launch command with the edits (vllm serve, python -m, docker run)
          rebuilt   - `command` is `vllm serve` rebuilt from the arguments vLLM logged (no launch line)
          edit      - the launch lives in a file (compose, Kubernetes, a Python script): `instruction` says what
                      to edit where; `command` is the edited `command:`/`LLM(...)` text when it is known
          flags     - no launch line: `changes` only; rerun your own command with them
          outside   - the fix is outside the command (a driver, a package, a free GPU): rerun it unchanged
    """
    form: str
    command: str | None = None
    was: str | None = None
    changes: list[str] = field(default_factory=list)    # one per edit: "--tensor-parallel-size 3 -> 2"
    instruction: str = ""
    conflicts: list[str] = field(default_factory=list)  # edits of two findings that cannot both hold
    rules: list[str] = field(default_factory=list)      # the findings whose edits it carries (combined fix)

    @property
    def runnable(self) -> bool:
        return self.form in ("command", "rebuilt") and bool(self.command)


@dataclass
class Match:
    rule_id: str
    pattern: Pattern
    captures: dict[str, str]
    line: Line
    traceback: Traceback | None
    milestones: frozenset
    seq: int
    promoted: bool = False     # a precursor or stall the log's end made the failure (engine.finish)
    # A refine hook found the rule's words but not its cause's evidence, and says why: the finding keeps the
    # rule at low confidence, or (the hook answered "unrecognized") the reason goes with the unrecognized one.
    unsupported: str = ""
    matched: str = ""          # the text the pattern matched (in the line's message, or a repaired reading of it)

    @property
    def kind(self) -> str:
        if self.promoted:
            return "fatal"
        if self.pattern.kind == "fatal" and self.printed_as_warning:
            return "warning"      # engine.finish makes it the failure only when nothing else explains one
        return self.pattern.kind

    @property
    def printed(self) -> Line:
        """The line that says which process printed the match: its own, or, where a paste dropped Ray's
        `(Worker pid=…, ip=…)` prefix from an exception line, the start of the traceback it ends."""
        tb = self.traceback
        return tb.start if not self.line.ip and tb is not None and tb.start.ip else self.line

    @property
    def printed_as_warning(self) -> bool:
        """vLLM's own logger printed the line at WARNING level (`WARNING 06-13 11:42:20 file.py:11]`): it went
        on after it, so the line is a warning whatever a pattern reads in it (`Failed to import from vllm._C`
        on a host without CUDA). A glog `W` line (PyTorch's and NCCL's C++) keeps its pattern's kind."""
        return self.line.level == "WARNING" and self.line.fileinfo is not None


@dataclass
class RefineContext:
    match: Match
    traceback: Traceback | None
    facts: Facts
    milestones: frozenset                   # the start-up milestones printed before the match
    log_milestones: frozenset = frozenset()  # ... and all the log printed, after it too (other workers)


@dataclass
class Finding:
    rule: str
    title: str
    severity: str
    confidence: str
    evidence: list[Line]
    explanation: str
    facts: dict[str, Any] = field(default_factory=dict)
    fix: Fix | None = None
    alternatives: list[tuple[str, str | None]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    family: str = ""
    first_seq: int = 0
    supporting: list[Line] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    precursor: bool = False              # stands on a precursor line the failure followed: ranked first
    errors: list[str] = field(default_factory=list)   # what went wrong computing it (a remedy that raised)
    rewrite: Rewrite | None = None       # the fix in the user's launch shape (remedies/shape.py)
    alt_rewrites: list[Rewrite] = field(default_factory=list)   # one per alternative, same order
    more_like_it: int = 0                # lines matching the evidence's patterns beyond those shown (a flood)
    marks: dict[tuple[str, int], str] = field(default_factory=dict)   # (source, line) -> the text matched there

    @property
    def fix_command(self) -> str | None:
        """The fix's text to run or paste (the edited command, `command:` list or `LLM(...)` line); None when
        there is none: no launch line, or the fix is outside the command (see unchanged)."""
        return self.rewrite.command if self.rewrite is not None else None

    @property
    def unchanged(self) -> bool:
        """The fix is an action outside the command: rerun it as it was."""
        return self.rewrite is not None and self.rewrite.form == "outside"


@dataclass
class Diagnosis:
    findings: list[Finding]
    facts: Facts
    warnings: list[Match]                # predictive warnings seen (not findings by themselves)
    command: Any                         # the launch command model, or None
    lines: int
    sources: list[str]
    notices: list[str] = field(default_factory=list)
    # Several launches in the input (two files with different commands, a rotation under --follow, a
    # second banner in one file): this Diagnosis is the last run; `earlier` the ones before it, oldest first,
    # each diagnosed on its own so that no run's command is rewritten with another run's fix.
    earlier: list["Diagnosis"] = field(default_factory=list)
    run_label: str = ""                  # where this run is in the input ("b.log", "x.log:120-388"); "" for one run
    combined: Rewrite | None = None      # every finding's edits in one command, root cause first (remedies/combine.py)
    # `check` only: each check and whether it ran (checks.preflight.CheckRun: label, ran, why, essential)
    coverage: list[Any] = field(default_factory=list)
    # `check` only: the memory model's figures for this launch, per GPU (checks.memory_checks.memory_summary)
    memory: dict[str, Any] | None = None
    # a log of several nodes: where the root cause was printed first, who followed (events/nodes.NodeStory)
    nodes: Any = None
    # how the run ended, as the log shows it (diagnosis/outcome.py): "did not serve", "served",
    # "served, then stopped"; "" where no log was read (`check`)
    outcome: str = ""
    ignored: int = 0                     # findings --ignore left out of this report (diagnosis/ignore.py)

    @property
    def unchecked(self) -> list[Any]:
        """The essential checks that could not run: with no finding, the answer is "could not check"."""
        return [c for c in self.coverage if c.essential and not c.ran]

    def first_warnings(self) -> list[Match]:
        """One predictive warning per rule, at its first occurrence, in log order."""
        first: dict[str, Match] = {}
        for m in sorted(self.warnings, key=lambda m: m.seq):
            first.setdefault(m.rule_id, m)
        return list(first.values())

    @property
    def status(self) -> str:
        if not self.findings:
            return "unchecked" if self.unchecked else "ok"
        return "unrecognized" if self.findings[0].rule == "unrecognized" else "problem"
