"""One command that fixes every finding: the edits of all findings merged in root-cause order.

Two edits of the same thing (one flag, one environment variable, one container option) that want different
values cannot both hold: the earlier finding's (the root cause's) is kept and the clash is reported, never
silently resolved.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_doctor.command import flags as F
from vllm_doctor.command.edits import DockerOption, Edit, RemoveFlag, SetEnv, SetFlag, SetModel
from vllm_doctor.command.layout import DOCKER_REPEATABLE, docker_canonical
from vllm_doctor.findings import Finding, Rewrite
from vllm_doctor.remedies.shape import describe, present

if TYPE_CHECKING:
    from vllm_doctor.command.model import Command
    from vllm_doctor.facts import Facts


def edit_key(e: Edit) -> tuple:
    """What an edit changes: two edits with one key touch the same flag / variable / option."""
    if isinstance(e, (SetFlag, RemoveFlag)):
        return ("flag", F.canonical(e.flag))
    if isinstance(e, SetEnv):
        return ("env", e.name)
    if isinstance(e, DockerOption):
        name = docker_canonical(e.name)
        return ("docker", name, e.value) if name in DOCKER_REPEATABLE else ("docker", name)
    if isinstance(e, SetModel):
        return ("model",)
    return (type(e).__name__,)


def merge(findings: list[Finding]) -> tuple[list[Edit], list[str], list[str]]:
    """(edits, the rules they come from, conflicts) for findings in root-cause order."""
    kept: dict[tuple, tuple[str, Edit]] = {}
    edits: list[Edit] = []
    rules: list[str] = []
    conflicts: list[str] = []
    for f in findings:
        if f.fix is None:
            continue
        if f.fix.edits:                 # a fix outside the command (unchanged) is not in what `run:` runs
            rules.append(f.rule)
        for e in f.fix.edits:
            key = edit_key(e)
            if key not in kept:
                kept[key] = (f.rule, e)
                edits.append(e)
            elif kept[key][1] != e:
                owner, first = kept[key]
                conflicts.append(f"{f.rule} wants {describe(e)} but {owner} wants {describe(first)}: "
                                 f"kept {owner}'s (the root cause); fix it first and rerun the doctor")
    return edits, rules, conflicts


def combine(findings: list[Finding], command: Command | None, facts: Facts) -> Rewrite | None:
    """The combined fix; None when no finding has a fix. With one fixing finding it is that finding's own."""
    fixing = [f for f in findings if f.fix is not None and f.rule != "unrecognized"]
    if not fixing:
        return None
    if len(fixing) == 1 and fixing[0].rewrite is not None:
        only = fixing[0].rewrite
        return Rewrite(only.form, only.command, only.was, list(only.changes), only.instruction, [], [fixing[0].rule])
    edits, rules, conflicts = merge(fixing)
    service = next((ln.service for f in fixing for ln in f.evidence if ln.service), None)
    rewrite = present(command, edits, facts, service)
    rewrite.rules, rewrite.conflicts = rules, conflicts
    return rewrite
