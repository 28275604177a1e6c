"""Run a finding's remedy and turn its structured Fix into commands, env and an explanation."""
from __future__ import annotations

import re
from typing import Any

from vllm_doctor.command.edits import SetEnv
from vllm_doctor.rules.hooks import resolve_hook
from vllm_doctor.findings import Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.remedies.shape import present


class _Keep(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_UNFILLED_ASIDE = re.compile(r" ?\([^()]*\{\w+\}[^()]*\)")


def explain(template: str, values: dict[str, Any], facts=None) -> str:
    """The rule's explanation with this case's numbers. A placeholder the match did not capture is
    looked up among the launch arguments and log facts; an aside whose number is still unknown,
    like "(util x total = {requested_gib} GiB)", is left out rather than shown with braces."""
    values = dict(values)
    if facts is not None:
        for key in re.findall(r"\{(\w+)\}", template):
            if key not in values:
                found = facts.get(f"args.{key}")
                found = facts.get(f"log.{key}") if found is None else found
                if found is not None:
                    values[key] = found
    try:
        text = template.format_map(_Keep(values))
    except (ValueError, IndexError, AttributeError):
        return template
    return _UNFILLED_ASIDE.sub("", text)


def context_for(rule, matches: list, facts, command, captures: dict) -> RemedyContext:
    """The context a remedy of `rule` gets for the finding's matches and captures (the engine's: fatal
    matches first); tests/remedies/conftest.py's remedy_context fixture records these."""
    return RemedyContext(rule, dict(captures), list(matches), facts, command)


def run_remedy(finding, rule, captures: dict, matches: list, facts, command) -> None:
    values = dict(finding.facts)
    finding.explanation = explain(rule.explanation, values, facts)
    if not rule.remedy:
        return
    try:
        remedy = resolve_hook("remedy", rule.remedy)
        fix = remedy(context_for(rule, matches, facts, command, captures))
    except Exception as exc:  # a remedy that raises means "no fix", never a crashed report
        finding.errors.append(f"no fix computed ({type(exc).__name__}: {exc})")
        return
    if not isinstance(fix, Fix):
        return
    finding.fix = fix
    finding.facts.update(fix.facts_used)
    if fix.arithmetic:      # ranks often print the same fact: each line once
        finding.explanation += "\n\n" + "\n".join(dict.fromkeys(fix.arithmetic))
    finding.notes += fix.notes
    finding.env = {e.name: e.value for e in fix.edits if isinstance(e, SetEnv)}
    service = next((m.line.service for m in matches if m.line.service), None)
    # in the user's shape; a fix outside the command (install a package, free a GPU) is "outside", never the
    # failing command handed back as "the command that works"
    finding.rewrite = present(command, fix.edits, facts, service)
    finding.alt_rewrites = [present(command, alt.edits, facts, service) for alt in fix.alternatives]
    finding.alternatives = [(alt.summary + (f" (cost: {alt.cost})" if alt.cost else ""), rw.command)
                            for alt, rw in zip(fix.alternatives, finding.alt_rewrites)]
