"""Root-cause arbitration: which finding explains the failure, and what to say when none does.

A specific cause beats a generic one (rule priority: an `NCCL WARN … No space left on device` beats
`NCCL error: unhandled system error`); among equals the earliest failure wins, because what vLLM
prints after the first fatal error is usually its consequence. Wrapper errors ("Engine core
initialization failed") never become findings.
"""
from __future__ import annotations

import re

from vllm_doctor.diagnosis.outcome import STOP_EXCEPTIONS, exit_only, short_name
from vllm_doctor.findings import Finding
from vllm_doctor.events.deaths import SIGNAL_MEANING, death_signal
from vllm_doctor.events.tracebacks import Traceback, failing, traceback_body
from vllm_doctor.rules.catalog import GENERIC_PRIORITY, Catalog
from vllm_doctor.sources.lines import Line

# a rule drawn under a title (torchrun's ChildFailedError message opens with `=====…`): not what it says
BORDER = re.compile(r"\s*([=*#~_-])\1{5,}\s*")

UNRECOGNIZED_TITLE = "A failure no rule explains"


PRECURSOR_BONUS = 25
PRECURSOR_CAP = 89


def _rank(finding: Finding, findings: list[Finding]) -> int:
    if not finding.precursor or any(not f.precursor and f.first_seq < finding.first_seq for f in findings):
        return finding.priority
    if any(not f.precursor and f.family == finding.family and f.priority > finding.priority for f in findings):
        # a stronger cause of the precursor's own family failed too: the precursor is its symptom, not its
        # explanation (`No platform detected` beside CUDA's error 803: the driver is why no GPU was found)
        return finding.priority
    return min(finding.priority + PRECURSOR_BONUS, PRECURSOR_CAP)


def arbitrate(findings: list[Finding]) -> list[Finding]:
    """Root cause first. A weaker finding of the root's own family is the same failure seen through a
    more generic symptom (`NCCL error: unhandled system error` after the shm WARN line): its lines
    become supporting evidence of the root instead of a second finding with a second fix. So does a
    generic symptom of any family (`unhandled cuda error` after NCCL's `Cuda failure 'out of memory'`).
    A precursor that a failure followed ("Error in inspecting model architecture" before "architectures
    [...] are not supported") explains that failure: it ranks PRECURSOR_BONUS above its rule's priority,
    short of the plain configuration errors (a wrong --tensor-parallel-size, an unknown flag: 90), which
    stand on their own whatever came before; and not at all when another failure came before it. A precursor
    the root's own failure came after, outranking it, explained nothing (vLLM went on past it): no finding."""
    ordered = sorted(findings, key=lambda f: (-_rank(f, findings), f.first_seq))
    if not ordered:
        return ordered
    root, rest = ordered[0], []
    for finding in ordered[1:]:
        if finding.precursor and not root.precursor and finding.first_seq < root.first_seq:
            continue        # the failure it came before has a rule of its own that outranks it: vLLM went on
        if absorbs(root, finding):
            root.supporting.extend(finding.evidence)
        else:
            rest.append(finding)
    return [root, *rest]


GENERIC_WAIT = "startup-stalled"
PLACEMENT_WAIT = "placement-group-wait"      # startup-stalled's pattern for vLLM's placement-group wait


def explained_waits(stalled: dict) -> dict:
    """Precedence `wait-with-its-reason`: a start-up that ends waiting where another rule's stall says why the
    wait never ends (Ray's autoscaler or a pasted `ray status` on the placement group vLLM waits for) is that
    rule's failure; the plain start-up stall is the same wait, and its lines become that finding's support."""
    if GENERIC_WAIT not in stalled or len(stalled) < 2 or any(
            m.pattern.name != PLACEMENT_WAIT for m in stalled[GENERIC_WAIT] if m.promoted):
        return stalled           # another wait (an shm broadcast, a handshake) is not the placement group's
    waits = stalled.pop(GENERIC_WAIT)
    for wait in waits:
        wait.promoted = False        # supporting lines now, not a failure of their own
    reason = min(stalled, key=lambda rid: stalled[rid][0].seq)
    stalled[reason] = stalled[reason] + waits
    return stalled


def absorbs(root: Finding, finding: Finding) -> bool:
    """`finding`, ranked below `root`, is root's failure seen through a weaker symptom: the same family, or a
    generic symptom of any family (the precedences specific-over-generic and same-family-absorbs)."""
    return bool(finding.family and finding.family == root.family) or finding.priority < GENERIC_PRIORITY


def absorbed_by(finding: Finding, earlier: list[Finding]) -> Finding | None:
    """The finding already reported that `finding`, seen later, is a symptom of (the live session: the pipe
    says a failure once, not once per symptom); None when it is news (a stronger cause of the same family,
    the old driver after `No CUDA GPUs`, is news)."""
    return next((r for r in earlier if finding.priority <= r.priority and absorbs(r, finding)), None)


def _innermost_cause(tracebacks: list[Traceback], catalog: Catalog) -> Traceback | None:
    """The last failing traceback, skipping wrappers: if the final exception only says "see above",
    walk its chain and then earlier tracebacks for the real one."""
    # with an exception, no warning; not a process closing its messaging at exit (outcome.EXIT_ONLY_EXCEPTIONS)
    raised = [tb for tb in tracebacks if tb.exc_type and failing(tb) and not exit_only(tb)]
    for tb in raised:
        tb.wrapper = catalog.is_wrapper(f"{tb.exc_type}: {tb.message.split(chr(10), 1)[0]}")
    for tb in reversed(raised):
        node: Traceback | None = tb
        while node is not None:
            if node.exc_type and not node.wrapper:
                return node
            node = node.cause
    # only wrappers ("Engine core initialization failed. See root cause above"): the engine died and the
    # log does not show why. Still a failure, never an all-clear.
    died = [tb for tb in raised if not short_name(tb.exc_type).startswith(STOP_EXCEPTIONS)]
    if not died:          # a process closing its messaging is no cause, but the only sign of an exit is one
        died = [tb for tb in tracebacks if tb.exc_type and failing(tb) and exit_only(tb)]
    return died[-1] if died else None


def unrecognized_finding(tracebacks: list[Traceback], error_lines: list[Line], catalog: Catalog,
                         declined: list[str] = ()) -> Finding | None:
    """`declined`: why rules whose words matched named no cause (Match.unsupported), said after the failure."""
    tb = _innermost_cause(tracebacks, catalog)
    evidence: list[Line] = []
    text = ""
    if tb is not None:
        evidence = [tb.exc_line or tb.start]
        first = next((ln for ln in tb.message.split("\n") if ln.strip() and not BORDER.fullmatch(ln)), "")
        text = f"{tb.exc_type}: {first}" if first else tb.exc_type
        if tb.frames:
            last = tb.frames[-1]
            text += f" (raised in {last.func or '?'} at {last.file.rsplit('/', 1)[-1]}:{last.lineno})"
    elif said := [ln for ln in error_lines if not traceback_body(ln.message)]:     # its body says nothing
        first = _burst_start(said)
        evidence = [first] + ([said[-1]] if first is not said[-1] else [])
        text = first.message.strip()
        signum = death_signal(text)
        if signum in SIGNAL_MEANING:         # a shell's `Killed`: say what kills that way
            text += f" (signal {signum}, {SIGNAL_MEANING[signum]})"
    else:
        cut_off = [t for t in tracebacks if not t.exc_type]
        cut = [t.start for t in cut_off] or error_lines[-1:]
        if not cut:
            return None
        evidence = [cut[-1]]
        # IPython's header names the exception before its frames
        text = "a traceback that the log cuts off before its exception"
        if cut_off and cut_off[-1].ipython:
            text += f" message ({cut_off[-1].start.message.split()[0]}, as IPython's header names it)"
    return Finding(
        rule="unrecognized", title=UNRECOGNIZED_TITLE, severity="error", confidence="low",
        evidence=evidence,
        explanation=(f"vLLM failed with {text}. " + "".join(f"{why} " for why in declined)
                     + "No rule in the catalog explains this failure, so the doctor shows the failing exception "
                     "rather than guess a cause."),
        facts={"exception": text})


def _burst_start(error_lines: list[Line]) -> Line:
    """The first line of the burst the last error line ends: one process logging several ERROR lines in a row in
    the same second logs the failure first and its consequences after (LMCache: `Failed to read from file …`, then
    `The number of retrieved tokens is less than expected`). Lines without a time stay apart."""
    last = error_lines[-1]
    for prev in reversed(error_lines[:-1]):
        if not (last.stamp and prev.stamp == last.stamp and prev.source == last.source
                and prev.proc_key == last.proc_key and prev.lineno == last.lineno - 1):
            break
        last = prev
    return last


def hung_finding(lines: list[Line], count: int) -> Finding:
    """The engine stopped answering after the server had served: `lines` are its wait lines (or its stats lines
    with requests running and nothing generated), in order."""
    last = lines[-1]
    text = last.message.strip().split(". ", 1)[0]
    return Finding(
        rule="unrecognized", title="The server stopped making progress while serving", severity="error",
        confidence="low", evidence=[lines[0]] + ([last] if last is not lines[0] else []),
        explanation=(f"The server had been serving, then its engine waited with no answer ({text}; {count:,} "
                     "such line" + ("s" if count != 1 else "") + ") and the log shows no progress after. That is a "
                     "hang while serving, not a start-up failure: a worker is stuck (a kernel, a collective, a dead "
                     "peer). No rule names the cause: a stack dump of the engine and worker processes "
                     "(`py-spy dump --pid PID`) shows where they wait."),
        facts={"hang": "while serving", "waits": count})
