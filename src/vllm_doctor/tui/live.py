"""Live sources for the TUI (no Textual here): a growing log, or a pipe or a wrapped command spooled to
a file, and the live diagnosis that reads it.

The log view never holds the log in memory, so a stream is appended to a spool file that the view
indexes and follows like any growing log. A pipe/run helper that has its own read loop can use
`StreamFeed.write()` instead of `start_reader()`.

`LiveDiagnosis` diagnoses such a file the way `vllm-doctor --follow` does: one `LiveSession` fed the
new bytes as they arrive, by the CLI's own follow loop (streams/follow.py: truncation, rotation, a file
not there yet). What it tells the app, through `on_update(diagnosis, kind)`:

* "reported": `session.so_far()`, at once when the session reports a failure or a predictive warning,
  and at most every REFRESH_S while only the facts (vLLM version, model, GPUs: the header) change;
* "settled": `session.settled()` once the input has been quiet QUIET_S after new bytes: the diagnosis
  of record so far (root cause first, an unrecognized error named), what `--no-live` says of the file
  as it is then;
* "diagnosing": `session.so_far()` while a traceback is still arriving (its frames are in, its exception
  line is not) or a failure waits for the rest of its evidence: settling then would name "a failure no
  rule explains" for the seconds until the exception line comes. A traceback cut off for good (its
  process died mid-print) is settled as it is once the input has been quiet OPEN_TRACEBACK_S;
* "final": `session.finish()` when a stream has ended (a followed log never ends: it settles).

The session's text notices (the ones the CLI prints) go to `on_notice`, one message each.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import Callable

from vllm_doctor.diagnosis.live import SETTLE_S, LiveSession
from vllm_doctor.sources.tail import READ_BUDGET, Tail
from vllm_doctor.streams.follow import POLL_S, follow

QUIET_S = 1.0          # input quiet this long after new bytes: the settled diagnosis is worked out
REFRESH_S = 1.0        # the facts-only refresh, at most this often
OPEN_TRACEBACK_S = 10.0   # quiet this long mid-traceback: settled as it is (the rest is not coming)


class StreamFeed:
    """Bytes in (from an fd or write()), appended to a spool file; `ended` once the stream closes."""

    def __init__(self, title: str = "<stdin>", spool_dir: str | None = None) -> None:
        fd, self.path = tempfile.mkstemp(prefix="vllm-doctor-", suffix=".log", dir=spool_dir)
        self._out = os.fdopen(fd, "wb")
        self.title = title
        self.ended = threading.Event()
        self.returncode: int | None = None
        self.bytes = 0
        self._lock = threading.Lock()
        self.process: subprocess.Popen | None = None

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._out.closed:
                return
            self._out.write(data)
            self._out.flush()
            self.bytes += len(data)

    def close(self, returncode: int | None = None) -> None:
        with self._lock:
            if not self._out.closed:
                self._out.close()
        if returncode is not None:
            self.returncode = returncode
        self.ended.set()

    def start_reader(self, fd: int) -> threading.Thread:
        def pump() -> None:
            try:
                while True:
                    try:
                        block = os.read(fd, 1 << 16)
                    except OSError:
                        break
                    if not block:
                        break
                    self.write(block)
            finally:
                code = None
                if self.process is not None:
                    try:
                        code = self.process.wait()
                    except Exception:
                        code = None
                self.close(code)

        thread = threading.Thread(target=pump, name="vllm-doctor-feed", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Called when the app quits: end the child we started (never anything else)."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                try:
                    proc.terminate()
                except OSError:
                    pass

    def cleanup(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def stdin_feed() -> StreamFeed:
    """Data from the stdin pipe; keys from the terminal: fd 0 becomes /dev/tty for Textual."""
    data_fd = os.dup(0)
    tty = os.open("/dev/tty", os.O_RDWR)       # raises OSError when there is no terminal
    os.dup2(tty, 0)
    os.close(tty)
    feed = StreamFeed("<stdin>")
    feed.start_reader(data_fd)
    return feed


def run_feed(argv: list[str]) -> StreamFeed:
    """Start `argv` with stdout and stderr into the feed (stdin closed, its own process group)."""
    feed = StreamFeed(" ".join(argv)[:60])
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd,
                                start_new_session=True)
    finally:
        os.close(write_fd)
    feed.process = proc
    feed.start_reader(read_fd)
    return feed


class Wakeup:
    """What ends the follow loop from another thread: it selects on `fd` and stops when `take()` is
    true (the same two members as streams.signals.SignalTrap)."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)

    def set(self) -> None:
        try:
            os.write(self._w, b"!")
        except OSError:                 # full (already set) or closed
            pass

    def take(self) -> bool:
        try:
            while os.read(self.fd, 256):
                pass
        except OSError:
            pass
        return True

    def close(self) -> None:
        for fd in (self.fd, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd = self._w = -1


class TextNotices:
    """The session's notices (streams.output.Notifier's two methods) as plain text to a callback."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink

    def write(self, text: str) -> None:
        if text:
            self.sink(text)

    def style(self, text: str, code: str) -> str:
        return text


class _StoppableTail(Tail):
    """A Tail that reads nothing once the app quits: the follow loop's read budget (hundreds of MiB
    while it catches up with a big log) is cut short, and its next look at the wake-up ends it."""

    def __init__(self, path: str, stopped: threading.Event) -> None:
        super().__init__(path)
        self.stopped = stopped

    def read(self, limit: int = READ_BUDGET) -> bytes:
        return b"" if self.stopped.is_set() else super().read(limit)


class LiveDiagnosis:
    """One LiveSession over a growing file (a followed log, or a stream's spool), run by `run()` in a
    thread of its own until `stop()` or, for a stream (`ended` given), the end of the stream."""

    def __init__(self, path: str, catalog, options, on_update: Callable, on_notice: Callable[[str], None],
                 *, ended: threading.Event | None = None, quiet: float = QUIET_S, settle: float = SETTLE_S,
                 poll_s: float = POLL_S, open_traceback: float = OPEN_TRACEBACK_S) -> None:
        self.path = path
        self.ended = ended
        self.quiet = quiet
        self.open_traceback = open_traceback
        self._waiting = False                   # "diagnosing" shown: see waiting()
        self.poll_s = poll_s
        self.on_update = on_update
        self._stopped = threading.Event()
        self._wake = Wakeup()
        self.session = LiveSession(catalog, options, TextNotices(on_notice), source=path, settle=settle,
                                   on_finding=self._reported, on_warning=self._reported)
        self._shown: tuple | None = None        # what the last so_far() update showed
        self._settled_at = 0                    # session.bytes when settled() last ran
        self._bytes = 0
        self._changed = time.monotonic()
        self._refreshed = 0.0

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def run(self) -> None:
        session = self.session
        tail = _StoppableTail(self.path, self._stopped)
        try:
            if self._stopped.is_set():
                return
            self._update()                      # "no problem found so far" while nothing came
            follow(tail, session, self._wake, None, self.poll_s, tick=self._tick)
            if self._stopped.is_set():
                return
            if tail.file is None:
                tail.open()
            while data := tail.read():         # what the stream wrote before it ended
                session.feed(data)
                session.poll()
            if not self._stopped.is_set():
                self.on_update(session.finish(), "final")
        finally:
            tail.close()
            self._wake.close()

    # ---- on the session's thread ---------------------------------------------------------------------
    def _reported(self, _what) -> None:
        self._update()

    def _signature(self) -> tuple:
        s = self.session
        return len(s.reported), len(s.warnings), len(s.diagnoser.facts.with_prefix(""))

    def _update(self) -> None:
        self._shown = self._signature()
        self._refreshed = time.monotonic()
        self.on_update(self.session.so_far(), "diagnosing" if self._waiting else "reported")

    def waiting(self) -> bool:
        """A traceback has its frames but not yet its exception line, or a failure waits for the rest
        of its evidence: what the session says now would be said too soon."""
        return bool(self.session.diagnoser.tracebacks.open or self.session.pending)

    def _wait_changed(self, waiting: bool) -> None:
        self._waiting = waiting
        self._update()                          # "diagnosing" while waiting, "reported" once it is over

    def _tick(self) -> None:
        if self._stopped.is_set():
            return
        s = self.session
        now = time.monotonic()
        if self.ended is not None and self.ended.is_set():
            self._wake.set()                    # the stream ended: the loop stops, finish() follows
            return
        waiting = self.waiting()
        if waiting != self._waiting:
            self._wait_changed(waiting)
        quiet = now - self._changed
        if s.bytes != self._bytes:
            self._bytes, self._changed = s.bytes, now
        elif quiet >= self.quiet and self._settled_at != s.bytes and not s.pending \
                and (not waiting or quiet >= self.open_traceback):
            self._settled_at = s.bytes
            self._shown = None                  # facts-only refreshes would hide it: none until a report
            self.on_update(s.settled(), "settled")
            return
        if self._shown is not None and now - self._refreshed >= REFRESH_S \
                and self._signature() != self._shown:
            self._update()
