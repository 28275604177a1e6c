"""Writing to the user's streams while a server's output flows: whole writes to a descriptor, early
notices that never interleave with half a line, and the final report written in one go.

Used by the pipe, `--follow` and `run`; nothing here diagnoses (a session's `finish()` does that).
"""
from __future__ import annotations

import errno
import io
import os
import select
import sys
from typing import Callable, Iterator

from vllm_doctor.findings import Diagnosis
from vllm_doctor.reports.emit import emit


def read_blocks(fd: int, size: int) -> Iterator[bytes]:
    """`fd`'s bytes in reads of at most `size`, to its end: an interrupted read is retried, a non-blocking
    descriptor is waited on; any other read error propagates (OSError)."""
    while True:
        try:
            block = os.read(fd, size)
        except InterruptedError:
            continue
        except BlockingIOError:              # EAGAIN: a descriptor someone left non-blocking
            select.select([fd], [], [])
            continue
        if not block:
            return
        yield block


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write less than asked); EPIPE and other errors propagate."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


class Notifier:
    """Writes whole messages to one stream's descriptor; a closed reader silences it, nothing more."""

    def __init__(self, stream=None, enabled: bool = True, color: bool | None = None,
                 mask: Callable[[str], str] | None = None) -> None:
        self.stream = stream
        self.mask = mask                   # --anonymize: a notice quotes the log and the command
        self.enabled = enabled and stream is not None
        self.fd: int | None = None
        if self.enabled:
            try:
                self.fd = stream.fileno()
            except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
                self.fd = None
        if color is None:
            color = (not os.environ.get("NO_COLOR")) and bool(getattr(stream, "isatty", lambda: False)())
        self.color = bool(color)
        self.at_line_start = True

    def style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def write(self, text: str) -> None:
        if not self.enabled or not text:
            return
        if self.mask is not None:
            text = self.mask(text)
        if not self.at_line_start:
            text = "\n" + text
        try:
            if self.fd is not None:
                try:
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
                write_all(self.fd, text.encode("utf-8", "replace"))
            else:
                self.stream.write(text)
                self.stream.flush()
        except (OSError, ValueError):      # EPIPE (the reader went away), a closed stream: stop talking
            self.enabled = False
            return
        self.at_line_start = text.endswith("\n")

    def passthrough(self, data: bytes) -> None:
        """Record that bytes not ending in a newline went to this same stream (the child's stderr)."""
        if data:
            self.at_line_start = data.endswith(b"\n")


def final_report(session, args, stream, lead: str = "") -> tuple[Diagnosis | None, str | None]:
    """End of input in every live mode: the diagnosis, root cause first, written in one go to `stream`
    (or --report). Returns (diagnosis, None) or (None, a one-line error)."""
    from vllm_doctor.streams.guard import DiagnosisStopped

    try:
        diagnosis = session.finish()
    except DiagnosisStopped:
        return None, None                       # already said on stderr; the caller picks the exit code
    except Exception as exc:  # a snapshot error and the like: one line, never a traceback
        return None, f"{type(exc).__name__}: {exc}"
    from vllm_doctor.diagnosis.ignore import drop_ignored

    drop_ignored(diagnosis, getattr(args, "ignored_rules", frozenset()))
    text = render_report(diagnosis, args, stream)
    if lead and not getattr(args, "report", None):
        text = lead + text
    error = write_report(text, args, stream)
    return (None, error) if error else (diagnosis, None)


def render_report(diagnosis: Diagnosis, args, like_stream) -> str:
    """The final report as one string (written in one go: never half a report)."""
    class Buffer(io.StringIO):
        def isatty(self) -> bool:               # colour as the real destination would get it
            try:
                return bool(like_stream.isatty())
            except (AttributeError, ValueError, OSError):
                return False

    buffer = Buffer()
    emit(diagnosis, args, buffer)
    return buffer.getvalue()


def write_report(text: str, args, default_stream) -> str | None:
    """Write the final report to --report FILE or the default stream; returns an error line or None."""
    path = getattr(args, "report", None)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            return f"cannot write {path}: {exc.strerror or exc}"
        return None
    try:
        default_stream.flush()
    except (OSError, ValueError):
        pass
    try:
        write_all(default_stream.fileno(), text.encode("utf-8", "replace"))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation) as exc:
        if getattr(exc, "errno", None) == errno.EPIPE:
            return None
        try:
            default_stream.write(text)
            default_stream.flush()
        except (OSError, ValueError):
            pass
    return None


def live_streams(args, default_stream):
    """(report stream, notifier): live notices go with a text report, or to stderr when it is free."""
    report_to_file = bool(getattr(args, "report", None))
    mask = notice_mask(args)
    color = False if (args.no_color or mask) else None
    if args.format == "text":
        stream = sys.stderr if report_to_file else default_stream
        return Notifier(stream, color=color, mask=mask)
    if report_to_file or default_stream is not sys.stderr:
        return Notifier(sys.stderr, color=color, mask=mask)
    return Notifier(None, enabled=False)     # stderr carries one JSON/markdown document: keep it clean


def notice_mask(args) -> Callable[[str], str] | None:
    """With --anonymize, what masks this run's notices: the same masker as its final report (emit)."""
    if not getattr(args, "anonymize", False):
        return None
    from vllm_doctor.reports.anonymize import for_args

    return for_args(args)
