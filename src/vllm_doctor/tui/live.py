"""Live sources for the TUI (no Textual here): a pipe or a wrapped command spooled to a file.

The log view never holds the log in memory, so a stream is appended to a spool file that the view
indexes and follows like any growing log; the app re-diagnoses the spool as it grows. A pipe/run helper
that has its own read loop can use `StreamFeed.write()` instead of `start_reader()`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading


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
