"""What the app's workers tell the app: a diagnosis (interim or final), a live notice, a grown log."""
from __future__ import annotations

from textual.message import Message


class Diagnosed(Message):
    """A (possibly interim) diagnosis of the log so far; `final` once the source has ended."""

    def __init__(self, diagnosis, final: bool = True, error: str | None = None,
                 kind: str | None = None) -> None:
        """`kind`, from a live session: "reported", "settled" or "final" (live.LiveDiagnosis)."""
        super().__init__()
        self.diagnosis = diagnosis
        self.final = final
        self.error = error
        self.kind = kind


class LiveNotice(Message):
    """A notice of the live session (a failure or warning it just reported, a truncated log, ...)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class LogGrew(Message):
    """The log view's file has more lines (indexing progress or a growing file)."""
