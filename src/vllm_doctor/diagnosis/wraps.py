"""A log line a terminal or a pager cut at its width and continued on the next physical line: `docker compose logs`
(the service prefix on the first part only), a console copied from a fixed-width window. A line that holds a rule's
words and matches no pattern of it is tried once more joined with the next line, when that line starts no record of
its own: cut inside a word (`NumelOut=19591168` / `0, Timeout(ms)=…`) the parts join as they are, cut at a blank
with one. Tracebacks' exception lines have their own join (engine._joined_exceptions)."""
from __future__ import annotations

from vllm_doctor.sources.lines import Line
from vllm_doctor.sources.tolerant import join_continuation

WRAP_MIN = 80          # a line shorter than this was not cut at a terminal's width


class Wraps:
    def __init__(self) -> None:
        self.first: Line | None = None      # the line that may continue on the next one

    @property
    def pending(self) -> bool:
        return self.first is not None

    def readings(self, line: Line) -> tuple[Line | None, list[str]]:
        """The line before `line` and the joined texts to try for it, if `line` continues it (then forgotten)."""
        first, self.first = self.first, None
        if first is None or not continues(line):
            return None, []
        parts = [first.message, line.message]
        return first, ["".join(p.strip() for p in parts), join_continuation(parts)]

    def note(self, line: Line, unmatched: bool, literals) -> None:
        """Remember a long line outside a traceback that holds a rule's words (`literals`: the catalog's automaton)
        but matched nothing: its end may be on the next line."""
        if unmatched and len(line.message.rstrip()) >= WRAP_MIN and literals.find_matches_as_indexes(line.message):
            self.first = line


def continues(line: Line) -> bool:
    """A physical line that is the rest of the one before: no logger header, level, process or rank prefix."""
    text = line.message.strip()
    return (bool(text) and line.level is None and line.pid is None and line.rank is None
            and not text.startswith(("Traceback", "File \"", "INFO", "WARNING", "ERROR", "DEBUG")))
