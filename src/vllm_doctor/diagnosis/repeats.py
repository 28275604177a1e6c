"""Lines whose outcome the diagnoser already knows: a repeat is counted, not parsed again.

A flood (one NCCL warning a million times, a retry loop, a crash loop's start-ups) is the same few lines
over and over, differing in timestamps and counters. The first copy of a line goes the whole way (parse,
tracebacks, facts, patterns); if that changed nothing but which patterns matched, its bytes (and the same
bytes with the digits zeroed, sources/scan.number_key) remember the patterns, and later copies only add
to those patterns' counts in the evidence store (diagnosis/evidence.py).

A line is not remembered when it did more: a fact or a milestone (start-up phase) it revealed, a
traceback it opened or continued, a wait or an answer (stall/progress patterns count against each other),
an argparse error, an unexplained error line, a damaged line read several ways. Zeroed digits are not used
for a line holding the literal of a pattern that reads digits as text (`Compute Capability < 8.0`). The
cache is emptied when the log reaches a new milestone (a match records the phase it was printed in).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_doctor.sources.tolerant import looks_damaged

if TYPE_CHECKING:
    from vllm_doctor.findings import Match
    from vllm_doctor.sources.lines import Line

MAX_KEYS = 4096             # distinct lines remembered; a log of all-different lines empties it now and then
COUNTED = ("stall", "progress")


class Entry:
    """A known line: the matches it makes, as (bucket, representative match) pairs. `seen` is what the
    scanner calls for each later copy (once per line of a flood: one call, no more)."""

    __slots__ = ("diagnoser", "hits")

    def __init__(self, diagnoser, hits: list) -> None:
        self.diagnoser, self.hits = diagnoser, hits

    def seen(self, raw: bytes, lineno: int, source: str) -> None:
        """A repeat of the line: one more line read, one more match of each of its patterns."""
        d = self.diagnoser
        seq = d._seq = d._seq + 1
        for bucket, like in self.hits:
            if bucket.filled:                 # the usual case, inlined: count it, keep it among the last
                bucket.count += 1
                bucket.last.append((raw, lineno, source, seq, like))
            else:
                bucket.repeat((raw, lineno, source, seq, like))


class RepeatCache:
    def __init__(self, diagnoser) -> None:
        """`diagnoser`: the engine.Diagnoser whose lines these are (its catalog, store and line count)."""
        self.diagnoser = diagnoser
        self.exact: dict[bytes, Entry] = {}
        self.numbers: dict[bytes, Entry] = {}
        self.source: str | None = None     # the source of the line fed last (a repeat comes from the same one)

    def clear(self) -> None:
        self.exact.clear()
        self.numbers.clear()

    def learn(self, key: tuple[bytes, bytes], line: "Line", new: list["Match"]) -> None:
        """Remember `line` (its bytes and number key) after a feed that changed nothing but matches."""
        message = line.message
        if any(m.pattern.kind in COUNTED for m in new) or line.raw.startswith("$ ") or looks_damaged(message):
            return
        if ": error: " in message or (not new and (line.level in ("ERROR", "CRITICAL") or "rror" in message
                                                   or "xception" in message)):
            return
        index = self.diagnoser.index
        if index.fact_ac.find_matches_as_indexes(message):
            return
        if len(self.exact) >= MAX_KEYS:
            self.clear()
        store = self.diagnoser.store
        entry = Entry(self.diagnoser, [(store.bucket(m.pattern), m) for m in new])
        raw, numbers = key
        self.exact[raw] = entry
        if index.digit_ac is None or not index.digit_ac.find_matches_as_indexes(message):
            self.numbers[numbers] = entry
