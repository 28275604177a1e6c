"""What every Diagnoser of one catalog looks lines up with, built once per catalog (a crash loop's log
makes a Diagnoser per launch): the patterns by literal and their automaton, the scanner's literals, and
the two automata the repeat cache asks (diagnosis/repeats.py), those only when a line is first learned."""
from __future__ import annotations

import re
from functools import cached_property

from vllm_doctor.events.logfacts import LITERALS as FACT_LITERALS
from vllm_doctor.rules.catalog import Catalog, Pattern

# a fact literal that changes nothing on a repeat: the NCCL host a warning names is in the number key's
# verbatim prefix (the bootstrap line's address is not: it stays a fact line)
IDEMPOTENT_FACTS = frozenset({" NCCL WARN "})
# a pattern's own digits, once \d classes, {n,m} counts and back-references are taken out
_NOT_DIGITS = re.compile(r"\\[dD]|\{\d+(?:,\d*)?\}|\\\d")


class CatalogIndex:
    def __init__(self, catalog: Catalog) -> None:
        import ahocorasick_rs

        self.catalog = catalog
        by_literal: dict[str, list[Pattern]] = {}
        for pattern in catalog.patterns:
            by_literal.setdefault(pattern.literal, []).append(pattern)
        self.literals = list(by_literal)
        self.patterns = [by_literal[lit] for lit in self.literals]
        self.ac = ahocorasick_rs.AhoCorasick(self.literals) if self.literals else None
        self.answered_rules = {r.id for r in catalog.rules.values() if any(p.kind == "progress" for p in r.patterns)}

    @cached_property
    def scan_literals(self) -> list[str]:
        """Every substring that makes a line worth a look: rule literals, facts, tracebacks. A progress
        pattern's literal is not one (NCCL prints `Init COMPLETE` for every communicator of a healthy run):
        the lines after an unanswered wait are all looked at instead, for a while (needs_context)."""
        patterns = self.catalog.patterns
        progress_only = {p.literal for p in patterns if p.kind == "progress"} - {
            p.literal for p in patterns if p.kind != "progress"}
        return sorted((set(self.literals) - progress_only) | set(self.catalog.structural) | set(FACT_LITERALS))

    @cached_property
    def fact_ac(self):
        """The literals of the log's own facts and milestones: a line holding one is never a mere repeat."""
        import ahocorasick_rs

        return ahocorasick_rs.AhoCorasick(sorted(set(FACT_LITERALS) - IDEMPOTENT_FACTS))

    @cached_property
    def digit_ac(self):
        """Literals of patterns whose regex has a digit of its own (`Compute Capability < 8.0`): their lines
        must match with their own numbers, so they get no number key. None when there are none."""
        import ahocorasick_rs

        digits = sorted({p.literal for p in self.catalog.patterns
                         if p.literal and re.search(r"\d", _NOT_DIGITS.sub("", p.source))})
        return ahocorasick_rs.AhoCorasick(digits) if digits else None


_INDEXES: dict[int, CatalogIndex] = {}


def catalog_index(catalog: Catalog) -> CatalogIndex:
    index = _INDEXES.get(id(catalog))
    if index is None or index.catalog is not catalog:      # the index holds its catalog: the id stays its own
        index = _INDEXES[id(catalog)] = CatalogIndex(catalog)
    return index
