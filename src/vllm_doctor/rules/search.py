"""Every search of a log line by a rule regex, bounded twice over.

In time: SEARCH_TIMEOUT CPU seconds of the searching thread (regex_time.py: other processes, and other
threads of this one, do not use it up). In
text: a line longer than LONG_LINE is searched in windows of WINDOW characters each side of its literal's
first hits (at most WINDOWS of them), so a 1 MB line costs what a 4 KiB one does. The lint
(rules/lint.py) keeps the shipped patterns linear; the timeout is for what it cannot see (the regex
module's own syntax)."""
from __future__ import annotations

from typing import Iterable

import regex

from vllm_doctor.regex_time import BUDGET, timed

SEARCH_TIMEOUT = BUDGET
LONG_LINE = 4096
WINDOW = 2048
WINDOWS = 4


def bounded_search(compiled: regex.Pattern, text: str, method: str = "search"):
    """`compiled.search(text)` (or another method: "match", "findall") within SEARCH_TIMEOUT; a search
    that runs out of time finds nothing (None, or [] for findall)."""
    try:
        return timed(compiled, method, text, budget=SEARCH_TIMEOUT)
    except TimeoutError:
        return [] if method == "findall" else None


def search_line(compiled: regex.Pattern, text: str, literal: str, ignorecase: bool, anchored_end: bool,
                hits: Iterable[int] = ()):
    """A rule pattern's match in a log line, within the bounds; raises TimeoutError when out of time.
    `hits`: the literal's start offsets in `text` (only a long line needs them; the first is found here
    when none are given). `anchored_end`: the pattern needs `$`, which holds at a window's end too, so
    a match that ends there is checked against the line's real end."""
    if len(text) <= LONG_LINE:
        return timed(compiled, "search", text, budget=SEARCH_TIMEOUT)
    covered, tried = -1, 0
    for hit in sorted(hits) or _first_hit(text, literal, ignorecase):
        if hit < covered:
            continue
        start, end = max(0, hit - WINDOW), min(len(text), hit + len(literal) + WINDOW)
        m = timed(compiled, "search", text, start, end, budget=SEARCH_TIMEOUT)
        if m and not (anchored_end and m.end() == end < len(text)):
            return m
        covered, tried = end - len(literal), tried + 1
        if tried == WINDOWS:
            break
    return None


def _first_hit(text: str, literal: str, ignorecase: bool) -> list[int]:
    at = (text.lower().find(literal.lower()) if ignorecase else text.find(literal)) if literal else 0
    return [max(at, 0)]
