"""The diagnoser's matches in bounded memory: per rule and pattern, the first and last few, one from each
process that printed it, and how many there were.

A crash loop or a flood of one warning matches the same pattern a million times; what a finding needs of
them is the first lines (its evidence and captures), the last ones (the phase the log ends in), where they
came from (nodes, ranks, pids: remedies ask) and the count ("and 999,990 more like it"). A repeat of a
line already known (diagnosis/repeats.py) arrives as bytes and is parsed only if it is still kept when
the log ends.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

from vllm_doctor.findings import Match
from vllm_doctor.rules.catalog import Pattern
from vllm_doctor.sources.lines import parse_line

FIRST = 8          # the first matches of a pattern, kept whole (evidence, captures, precursor order)
LAST = 8           # ... and the last ones (a stall's last wait, the phase the log ended in)
ORIGINS = 64       # one match from each of this many processes (node ip, pid, rank)


def _materialize(repeat: tuple) -> Match | None:
    """A repeat kept as (bytes, lineno, source, seq, known match) made a Match (None: only its numbers
    differ from the known line's, and with these the pattern does not match)."""
    raw, lineno, source, seq, like = repeat
    line = parse_line(raw, source, lineno)
    m = like.pattern.regex.search(line.message)
    if m is None:
        return None
    captures = {k: v for k, v in m.groupdict().items() if v is not None}
    return Match(like.pattern.rule_id, like.pattern, captures, line, None, like.milestones, seq)


class Bucket:
    """One (rule, pattern)'s matches."""

    __slots__ = ("pattern", "first", "last", "origins", "count", "filled")

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.first: list[Match] = []
        self.last: deque = deque(maxlen=LAST)
        self.origins: dict[tuple, Match] = {}
        self.count = 0
        self.filled = False        # the first FIRST are in: a repeat only counts and joins the last

    def add(self, match: Match) -> None:
        self.count += 1
        if len(self.first) < FIRST:
            self.first.append(match)
            self.filled = len(self.first) == FIRST
        else:
            self.last.append(match)
        line = match.line
        origin = (line.ip, line.pid, line.rank, line.service)
        if origin not in self.origins and len(self.origins) < ORIGINS:
            self.origins[origin] = match

    def repeat(self, repeat: tuple) -> None:
        """A later copy of a known line, as (bytes, lineno, source, seq, known match): parsed only if it
        is among the first (now) or still among the last when the log ends."""
        if len(self.first) < FIRST:
            match = _materialize(repeat)
            if match is not None:
                self.add(match)
            return
        self.count += 1
        self.last.append(repeat)

    def kept(self) -> list[Match]:
        last = [_materialize(item) if isinstance(item, tuple) else item for item in self.last]
        self.last = deque((m for m in last if m is not None), maxlen=LAST)
        seen: set[int] = set()
        out: list[Match] = []
        for m in (*self.first, *self.origins.values(), *self.last):
            if id(m) not in seen:
                seen.add(id(m))
                out.append(m)
        return out

    def remove(self, match: Match) -> None:
        self.count -= 1
        self.first = [m for m in self.first if m is not match]
        self.filled = len(self.first) == FIRST
        self.last = deque((m for m in self.last if m is not match), maxlen=LAST)
        for key, m in list(self.origins.items()):
            if m is match:
                del self.origins[key]


class MatchStore:
    """Every match the diagnoser made, in bounded memory; iterates over the kept ones in log order."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], Bucket] = {}
        self.fresh: list[Match] | None = None     # matches since the last take_fresh(), when tracked (live)
        self.tracebacks: set[int] = set()         # id() of every traceback a match was made in

    def bucket(self, pattern: Pattern) -> Bucket:
        key = (pattern.rule_id, pattern.name)
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = Bucket(pattern)
        return found

    def add(self, match: Match) -> None:
        self.bucket(match.pattern).add(match)
        if match.traceback is not None:
            self.tracebacks.add(id(match.traceback))
        if self.fresh is not None:
            self.fresh.append(match)

    def track(self) -> None:
        """Keep the matches made from now on for take_fresh() (a live session reports them as they come)."""
        if self.fresh is None:
            self.fresh = []

    def take_fresh(self) -> list[Match]:
        fresh, self.fresh = self.fresh or [], [] if self.fresh is not None else None
        return fresh

    def remove(self, match: Match) -> None:
        self.bucket(match.pattern).remove(match)

    def count_kind(self, rule_id: str, kind: str) -> int:
        """How many matches of `rule_id`'s patterns of this kind (stall waits, progress answers) were made."""
        return sum(b.count for (rid, _), b in self._buckets.items() if rid == rule_id and b.pattern.kind == kind)

    def count_like(self, patterns: Iterable[Pattern]) -> int:
        """How many lines matched these patterns (a finding's evidence and all the lines like it)."""
        return sum(self._buckets[(p.rule_id, p.name)].count for p in {id(p): p for p in patterns}.values()
                   if (p.rule_id, p.name) in self._buckets)

    def of_rules(self, rule_ids: Iterable[str]) -> list[Match]:
        wanted = set(rule_ids)
        kept = [m for (rid, _), b in self._buckets.items() if rid in wanted for m in b.kept()]
        return sorted(kept, key=lambda m: m.seq)

    def __iter__(self) -> Iterator[Match]:
        kept = [m for b in self._buckets.values() for m in b.kept()]
        return iter(sorted(kept, key=lambda m: m.seq))

    def __len__(self) -> int:
        """How many matches were made, kept or not."""
        return sum(b.count for b in self._buckets.values())
