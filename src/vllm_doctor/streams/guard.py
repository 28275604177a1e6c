"""The diagnosis on the side of a copy, fenced off: whatever goes wrong in it costs the diagnosis, never a
byte of the server's output.

The pipe, `run` and `--follow` copy bytes and feed a LiveSession; `SafeSession` wraps that session (the
TUI copies nothing and shows an error of its session in its own window: tui/app.py). The first exception
in `feed`/`poll`/`timeout`/`restart`/`finish` (a bug, MemoryError, a RecursionError on some pathological
line) stops the diagnosis with one line on stderr, `vllm-doctor: diagnosis stopped: internal error (…); output continues`, and from then on every
call is a no-op, so the copy loop goes on to the end of its input. What was reported before stays
reported; no final report follows (it would be built from part of the input: a false all-clear), and
the exit code is 1 when a failure had been reported before the stop, 2 otherwise (`run`: the child's).
"""
from __future__ import annotations

import sys
from typing import Any

STOPPED = "vllm-doctor: diagnosis stopped: {why}; {tail}\n"


class SafeSession:
    """A LiveSession whose failures end the diagnosis, not the caller's copy loop."""

    def __init__(self, session) -> None:
        self._session = session
        self.stopped: str | None = None       # why the diagnosis stopped, once it did
        self.found_before_stop = False        # a failure had been reported when it stopped

    def __getattr__(self, name: str) -> Any:  # notifier, settle, bytes, last_fatal_at, … as they are
        return getattr(self._session, name)

    def stop(self, why: str, tail: str = "output continues") -> None:
        if self.stopped is not None:
            return
        self.stopped = why
        self.found_before_stop = getattr(self._session, "last_fatal_at", None) is not None
        text = STOPPED.format(why=why, tail=tail)
        try:
            notifier = self._session.notifier
            if getattr(notifier, "enabled", True):
                notifier.write(text)
            else:                             # json/markdown keep live notices off stderr; no report follows
                sys.stderr.write(text)        # now, so this line is all stderr will carry
                sys.stderr.flush()
        except Exception:                     # the notice is best effort; the copy is what matters
            pass

    def _call(self, name: str, *args, **kwargs):
        if self.stopped is not None:
            return None
        try:
            return getattr(self._session, name)(*args, **kwargs)
        except Exception as exc:              # includes MemoryError and RecursionError
            self.stop(f"internal error ({type(exc).__name__}: {_short(exc)})")
            return None

    def feed(self, block: bytes, source: str | None = None) -> None:
        if self.stopped is not None:
            try:
                self._session.bytes += len(block)     # "was anything read" stays true after a stop
            except Exception:
                pass
            return
        before = getattr(self._session, "bytes", 0)
        self._call("feed", block, source)
        if self.stopped is not None and getattr(self._session, "bytes", 0) == before:
            self._session.bytes = before + len(block)     # the block it failed on was read all the same

    def poll(self, idle: bool = False) -> None:
        self._call("poll", idle)

    def timeout(self) -> float | None:
        return self._call("timeout")

    def restart(self, source: str | None = None, reason: str = "rotation") -> None:
        self._call("restart", source, reason)

    def finish(self):
        """The final diagnosis; after a stop, or when finishing fails, the exception is the caller's to turn
        into one line (streams.output.final_report does)."""
        if self.stopped is not None:
            raise DiagnosisStopped(self.stopped, self.found_before_stop)
        return self._session.finish()


class DiagnosisStopped(Exception):
    """The diagnosis stopped early; `found` tells whether a failure had been reported by then."""

    def __init__(self, why: str, found: bool) -> None:
        super().__init__(f"diagnosis stopped: {why}")
        self.why, self.found = why, found


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
