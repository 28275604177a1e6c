"""The pipe's copy loop: stdin to stdout byte for byte, each block fed to the live session on the side."""
from __future__ import annotations

import errno
import os
import select
import signal
import time

from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.sources.scan import BLOCK
from vllm_doctor.streams.output import write_all
from vllm_doctor.streams.signals import SignalTrap

DRAIN_S = 5.0


def widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (Linux; the unprivileged maximum by default) instead of 64 KiB: when
    the server writes faster than we scan, each read then brings up to 1 MiB, so per-read costs shrink and
    the scanner's parallel path applies. A read still returns as soon as anything is there."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError, ValueError):
        pass                                 # not a pipe, not Linux, or over the limit: keep the default


def pump(stdin: int, stdout: int, session: LiveSession, trap: SignalTrap) -> str | None:
    """Copy stdin to stdout and feed the session until EOF or a stop signal; an error line or None."""
    passthrough = stdout >= 0
    widen_pipe(stdin)
    stop_at: float | None = None
    watch = [stdin] + ([trap.fd] if trap.fd >= 0 else [])
    use_select = True
    while True:
        timeout = session.timeout()
        if stop_at is not None:
            left = max(0.0, stop_at - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        readable = [stdin]
        if use_select:
            try:
                readable, _, _ = select.select(watch, [], [], timeout)
            except (OSError, ValueError):
                use_select = False          # not selectable (rare): plain blocking reads
                readable = [stdin]
        if trap.fd in readable:
            for signum in trap.take():
                if signum == signal.SIGINT and stop_at is None:
                    stop_at = time.monotonic() + DRAIN_S
                    session.notifier.write("vllm-doctor: interrupted: reporting when the input ends "
                                           f"(at most {DRAIN_S:.0f} s; Ctrl-C again to report now)\n")
                else:
                    return None
        if stdin in readable:
            try:
                block = os.read(stdin, BLOCK)
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    continue
                return f"cannot read standard input: {exc.strerror or exc}"
            if not block:
                return None
            if passthrough:
                try:
                    write_all(stdout, block)
                except OSError as exc:
                    # EPIPE: the reader went away; anything else (disk full): stop copying, keep diagnosing
                    passthrough = False
                    if exc.errno != errno.EPIPE:
                        session.notifier.write(f"vllm-doctor: cannot write standard output "
                                               f"({exc.strerror or exc}); still diagnosing\n")
            session.feed(block)
            session.poll()
        elif not readable:
            session.poll(idle=True)
        if stop_at is not None and time.monotonic() >= stop_at:
            return None
