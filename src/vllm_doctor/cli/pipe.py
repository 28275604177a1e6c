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

`vllm-doctor -` is not the pipe: an explicit `-` names standard input as a saved log (`vllm-doctor - <
big.log`), read to its end with nothing copied to stdout, and reported as a file is (`diagnose_stdin`).
"""
from __future__ import annotations

import os
import stat
import sys

from vllm_doctor.cli.common import exit_code, fail
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.findings import Diagnosis
from vllm_doctor.streams.output import final_report, live_streams
from vllm_doctor.streams.pipe import pump
from vllm_doctor.streams.signals import SignalTrap


def run_pipe(catalog, args, options) -> int:
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
        if session.bytes == 0:
            # "no problem found" in nothing at all would be a false all-clear
            return fail("standard input is empty: nothing to diagnose")
        diagnosis, error = final_report(session, args, sys.stderr)
    if error:
        return fail(error)
    report_written(args)
    return exit_code(diagnosis)


def report_written(args) -> None:
    """With --report the terminal would otherwise show nothing at all: say where the report went."""
    path = getattr(args, "report", None)
    if path:
        print(f"vllm-doctor: report written to {path}", file=sys.stderr)


STDIN = "<stdin>"


def diagnose_stdin(catalog, options) -> Diagnosis:
    """`vllm-doctor -`: standard input as a saved log (compressed or UTF-16 too), split into runs as a file
    is (diagnosis/runs.py). Raises InputError."""
    from vllm_doctor.diagnosis.runs import RunSplitter
    from vllm_doctor.diagnosis.saved import InputError, finish, finish_runs, new_diagnoser, scan_stream

    stream, how = _open_stdin()
    runs = RunSplitter(lambda: new_diagnoser(catalog, options))
    with stream:
        try:
            scan_stream(stream, STDIN, runs)
        except InputError as exc:   # nothing at all would be a false all-clear; say it in stdin's words
            raise InputError("standard input is empty: nothing to diagnose" if "empty" in str(exc) else str(exc)) \
                from None
    diagnosis = finish_runs(runs.runs, finish, options, dropped=(runs.dropped, runs.dropped_lines))
    if how:
        diagnosis.notices.insert(0, f"standard input: {how}")
    return diagnosis


def _open_stdin():
    """(byte stream, how it was read) for standard input through sources.files.open_log, which sniffs the
    first bytes and then seeks back: a redirected file is opened as it is, a pipe or terminal is first
    copied to an unnamed temporary file."""
    import tempfile

    from vllm_doctor.diagnosis.saved import InputError
    from vllm_doctor.sources.files import LogFormatError, open_log

    try:
        fd = sys.stdin.fileno()
        seekable = stat.S_ISREG(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):
        raise InputError("standard input is closed") from None
    if seekable:
        source = os.dup(fd)
    else:
        if sys.stdin.isatty():
            print("vllm-doctor: reading the log from the terminal; end it with Ctrl-D", file=sys.stderr)
        with tempfile.TemporaryFile(prefix="vllm-doctor-stdin-") as spool:
            _copy(fd, spool.fileno())
            source = os.dup(spool.fileno())
    try:
        os.lseek(source, 0, os.SEEK_SET)      # open_log sniffs from where the descriptor stands
        return open_log(source)
    except LogFormatError as exc:   # its message starts with the "path" it was given: here a descriptor
        raise InputError("standard input" + str(exc)[len(str(source)):]) from None
    except OSError as exc:
        raise InputError(f"cannot read standard input: {exc.strerror or exc}") from None


def _copy(src: int, dst: int) -> None:
    from vllm_doctor.diagnosis.saved import InputError
    from vllm_doctor.sources.scan import BLOCK
    from vllm_doctor.streams.output import write_all

    while True:
        try:
            block = os.read(src, BLOCK)
        except InterruptedError:
            continue
        except OSError as exc:
            raise InputError(f"cannot read standard input: {exc.strerror or exc}") from None
        if not block:
            return
        try:
            write_all(dst, block)
        except OSError as exc:
            raise InputError(f"cannot keep standard input in a temporary file: {exc.strerror or exc}") from None
