"""Pipe mode: every input byte passes to stdout unchanged; the diagnosis goes to stderr (or --report).

    vllm serve MODEL -tp 4 2>&1 | vllm-doctor > server.log

* stdout gets exactly the input bytes, in order, each block written as soon as it is read (binary data,
  invalid UTF-8, CRLF and lines of any length included); nothing is ever added to stdout.
* Failures are reported on stderr as soon as their evidence is complete, predictive warnings once each;
  the full report (root cause first) follows at end of input.
* The reader of stdout going away (EPIPE) stops the copy, not the diagnosis: the input is still read
  to its end (the server is not killed by a broken pipe) and the report still comes.
* Ctrl-C: the server in the same pipeline gets it too and usually prints its last words; the doctor
  keeps copying until end of input for up to DRAIN_S seconds, then reports. A second Ctrl-C, SIGTERM
  or SIGHUP reports at once. A server that never stops is stopped by the user, the same way.
* Exit code: 1 when a failure was found, 0 otherwise (also after Ctrl-C), 2 for an input error.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time

from vllm_doctor.diagnosis.live import LiveSession, SignalTrap, final_report, live_streams, write_all
from vllm_doctor.sources.scan import BLOCK

DRAIN_S = 5.0


def run_pipe(catalog, args, options) -> int:
    from vllm_doctor.cli.main import exit_code, fail

    try:
        stdin = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return fail("standard input is closed")
    try:
        stdout = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout = -1
    notifier = live_streams(args, sys.stderr)
    session = LiveSession(catalog, options, notifier, source="<stdin>",
                          settle=getattr(args, "settle", None) or 0.5)
    with SignalTrap() as trap:
        error = pump(stdin, stdout, session, trap)
        if error:
            return fail(error)
        diagnosis, error = final_report(session, args, sys.stderr)
    return fail(error) if error else exit_code(diagnosis)


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
