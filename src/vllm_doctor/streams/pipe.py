"""The pipe's copy loop: stdin to stdout byte for byte, each block fed to the live session on the side."""
from __future__ import annotations

import errno
import os
import queue
import select
import signal
import time

from vllm_doctor.sources.scan import BLOCK
from vllm_doctor.streams.guard import SafeSession
from vllm_doctor.streams.output import read_blocks, write_all
from vllm_doctor.streams.signals import SignalTrap

DRAIN_S = 5.0
REPORT_DRAIN_S = 5.0  # after a stop signal: the most spent reading what already reached stdout
HAND_OFF = 8       # blocks read but not yet scanned, at most (each at most BLOCK bytes)
STALL_S = 3.0      # a diagnosis that keeps the hand-off full this long is given up: the copy never waits more


def widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (Linux; the unprivileged maximum by default) instead of 64 KiB: when
    the server writes faster than we scan, each read then brings up to 1 MiB, so per-read costs shrink and
    the scanner's parallel path applies. A read still returns as soon as anything is there."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError, ValueError):
        pass                                 # not a pipe, not Linux, or over the limit: keep the default


def copy_only(stdin: int, stdout: int) -> None:
    """Stdin to stdout byte for byte, to the end, diagnosing nothing: what the pipe still owes the server
    when it cannot diagnose (a broken rule catalog). A reader that went away stops the writing, not the
    reading, so the server writing into the pipe is never blocked."""
    writing = True
    try:
        for block in read_blocks(stdin, BLOCK):
            if writing:
                try:
                    write_all(stdout, block)
                except OSError:
                    writing = False
    except OSError:                      # stdin itself broke: nothing more to pass on
        return


class Copier:
    """The copy itself, in a thread of its own: read stdin, write the bytes through to stdout at once,
    then hand them to the diagnosis. Reads, writes and the automata all leave the GIL, so copying and
    scanning run side by side; a bounded hand-off keeps memory flat when the scan falls behind (the copy
    then waits: the bytes reach stdout no later than the diagnosis sees them, never out of order). A
    diagnosis stuck for STALL_S on one hand-off is abandoned (`behind`): from then on the copy only
    copies, so the server writing into the pipe is never held up by the doctor."""

    def __init__(self, stdin: int, stdout: int) -> None:
        import threading

        self.stdin, self.stdout = stdin, stdout
        self.blocks: "queue.Queue" = queue.Queue(maxsize=HAND_OFF)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        # held while writing stdout or waking the main loop: once stop() has it, the thread neither writes
        # nor wakes (its wake pipe is closed then, and the descriptor number may already be another file's)
        self._lock = threading.RLock()
        self._stopped = False
        self._unhanded = 0           # bytes written to stdout, not yet in `blocks` (nor dropped when behind)
        self.behind = False          # the diagnosis fell STALL_S behind: blocks are no longer handed off
        self._thread = threading.Thread(target=self._run, name="vllm-doctor-copy", daemon=True)
        self._thread.start()

    def _put(self, item) -> None:
        if isinstance(item, bytes):
            if self.behind:
                return
            try:
                self.blocks.put(item, timeout=STALL_S)
            except queue.Full:
                self.behind = True
        else:                        # end of input, an error, a note: always delivered
            self.blocks.put(item)
        with self._lock:
            if self._stopped:
                return
            try:
                os.write(self.wake_w, b"x")
            except OSError:                  # full: the main loop is behind and will look anyway
                pass

    def _run(self) -> None:
        passthrough = self.stdout >= 0
        blocks = read_blocks(self.stdin, BLOCK)
        while True:
            try:
                block = next(blocks, None)
            except OSError as exc:
                self._put(("error", f"cannot read standard input: {exc.strerror or exc}"))
                return
            if block is None:
                self._put(None)
                return
            with self._lock:
                if self._stopped:
                    return
                if passthrough:
                    try:
                        write_all(self.stdout, block)
                    except OSError as exc:
                        # EPIPE: the reader went away; anything else (disk full): stop copying, keep diagnosing
                        passthrough = False
                        if exc.errno != errno.EPIPE:
                            self._put(("note", f"vllm-doctor: cannot write standard output "
                                               f"({exc.strerror or exc}); still diagnosing\n"))
                self._unhanded += len(block)  # counted before the lock goes: halt() then waits for it
            try:
                self._put(block)
            finally:
                with self._lock:
                    self._unhanded -= len(block)

    def halt(self) -> None:
        """No more copying; what was copied already can still be taken with `handed`."""
        with self._lock:
            self._stopped = True

    def handed(self, deadline: float):
        """After halt(): every item the copy wrote through and has not handed over yet, until `deadline`.
        A block is counted before the copy lets go of the lock it wrote under, and put before it is
        uncounted, so "no block counted and the queue empty" means every byte on stdout was handed over."""
        while True:
            try:
                yield self.blocks.get_nowait()
                continue
            except queue.Empty:
                pass
            with self._lock:
                settled = self._unhanded == 0
            if settled and self.blocks.empty():
                return
            if time.monotonic() >= deadline:
                return
            try:
                yield self.blocks.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                pass

    def left_over(self) -> int:
        """Bytes in blocks written through but never handed over (after halt() and `handed`)."""
        left = 0
        while True:
            try:
                item = self.blocks.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, bytes):
                left += len(item)
        with self._lock:
            return left + self._unhanded

    def stop(self) -> None:
        """No more copying (the doctor reports now); a read in flight is abandoned with the thread."""
        with self._lock:
            self._stopped = True
            for fd in (self.wake_r, self.wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass


def pump(stdin: int, stdout: int, session: SafeSession, trap: SignalTrap) -> str | None:
    """Copy stdin to stdout and feed the session until EOF or a stop signal; an error line or None."""
    widen_pipe(stdin)
    copier = Copier(stdin, stdout)
    stop_at: float | None = None
    watch = [copier.wake_r] + ([trap.fd] if trap.fd >= 0 else [])
    try:
        while True:
            timeout = session.timeout()
            if stop_at is not None:
                left = max(0.0, stop_at - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            try:
                readable, _, _ = select.select(watch, [], [], timeout)
            except InterruptedError:
                continue
            if trap.fd in readable:
                for signum in trap.take():
                    if signum == signal.SIGINT and stop_at is None:
                        stop_at = time.monotonic() + DRAIN_S
                        session.notifier.write("vllm-doctor: interrupted: reporting when the input ends "
                                               f"(at most {DRAIN_S:.0f} s; Ctrl-C again to report now)\n")
                    else:
                        return _report_now(copier, session)
            if copier.wake_r in readable:
                try:
                    os.read(copier.wake_r, 4096)
                except OSError:
                    pass
                fed = False
                while True:
                    try:
                        item = copier.blocks.get_nowait()
                    except queue.Empty:
                        break
                    if copier.behind:
                        session.stop(f"it fell more than {STALL_S:g} s behind the output")
                    if item is None:
                        if fed:
                            session.poll()
                        return None
                    if isinstance(item, tuple):
                        if item[0] == "error":
                            return item[1]
                        session.notifier.write(item[1])
                        continue
                    session.feed(item)
                    fed = True
                if fed:
                    session.poll()
            elif not readable:
                session.poll(idle=True)
            if stop_at is not None and time.monotonic() >= stop_at:
                return _report_now(copier, session)
    finally:
        copier.stop()


def _report_now(copier: Copier, session: SafeSession) -> str | None:
    """A stop signal (or the Ctrl-C grace ran out): stop copying, then feed every block that already
    reached stdout, so the report covers all the user saw. Bounded by REPORT_DRAIN_S: a diagnosis that
    cannot catch up in time stops short and says how much it did not read (no report on part of it)."""
    copier.halt()
    fed = False
    for item in copier.handed(time.monotonic() + REPORT_DRAIN_S):
        if isinstance(item, bytes):
            session.feed(item)
            fed = True
        elif isinstance(item, tuple) and item[0] == "note":
            session.notifier.write(item[1])
    left = copier.left_over()
    if copier.behind:                    # blocks were dropped before the signal: the report would be partial
        session.stop(f"it fell more than {STALL_S:g} s behind the output", tail="no report follows")
    elif left:
        session.stop(f"stopped before reading the last {left:,} bytes of what passed through "
                     f"(it could not catch up in {REPORT_DRAIN_S:g} s)", tail="no report follows")
    elif fed:
        session.poll()
    elif session.bytes == 0:
        return "stopped before any input arrived: nothing to diagnose"
    return None
