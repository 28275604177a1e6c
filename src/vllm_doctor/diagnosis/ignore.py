"""`--ignore RULE`: findings of rules the user has decided about are not reported (like a linter's ignore).

The rest of the diagnosis stands as it was found: the remaining findings keep their order, the combined fix is
made again from them alone, and the report says how many were left out (never a silent all-clear).
"""
from __future__ import annotations

from vllm_doctor.findings import Diagnosis


def parse_ignore(values: list[str] | None, catalog) -> tuple[frozenset[str], str | None]:
    """The rule ids of `--ignore A,B --ignore C` (any case; `unrecognized` too), or an error naming the unknown
    one (did you mean, as `explain` says it: Catalog.rule_named)."""
    out = set()
    for value in values or []:
        for word in filter(None, (w.strip() for w in value.split(","))):
            rule, meant = ("unrecognized", None) if word.lower() == "unrecognized" else catalog.rule_named(word)
            if rule is None:
                hint = f"did you mean '{meant}'?" if meant else "`vllm-doctor rules` lists them"
                return frozenset(), f"--ignore: no rule '{word}'; {hint}"
            out.add(rule)
    return frozenset(out), None


def drop_ignored(diagnosis: Diagnosis, ignore: frozenset[str]) -> Diagnosis:
    """`diagnosis` without findings of the ignored rules (its earlier runs too); `ignored` counts them."""
    if not ignore:
        return diagnosis
    from vllm_doctor.remedies.combine import combine

    for d in [diagnosis, *diagnosis.earlier]:
        kept = [f for f in d.findings if f.rule not in ignore]
        if len(kept) == len(d.findings):
            continue
        d.ignored += len(d.findings) - len(kept)
        if not kept or kept[0] is not d.findings[0]:
            d.nodes = None                 # the story was the dropped root's
        d.findings = kept
        d.combined = combine(kept, d.command, d.facts) if kept else None
    return diagnosis
