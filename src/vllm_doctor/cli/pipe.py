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
  or SIGHUP stops the copy and reports at once, on every byte that already reached stdout (the copy hands
  each block over after writing it: those still on their way are read first, for up to REPORT_DRAIN_S
  seconds; past that it says how many bytes it did not read and gives no report on part of the output).
* Exit code: 1 when a failure was found, 0 otherwise (also after Ctrl-C), 2 for an input error.
* The diagnosis never costs a byte of output: an internal error in it, or a diagnosis that holds the copy
  up for more than STALL_S seconds, stops it with one line on stderr ("diagnosis stopped: …; output
  continues") and the copy goes on to the end of input; no report follows (it would rest on part of the
  input), and the exit code is 1 when a failure had been reported before the stop, 2 otherwise.

`vllm-doctor -` is not the pipe: an explicit `-` names standard input as a saved log (`vllm-doctor - <
big.log`), read to its end with nothing copied to stdout, and reported as a file is (cli/stdin.py).
"""
from __future__ import annotations

import sys

from vllm_doctor.cli.common import exit_code, fail, report_written
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.streams.guard import SafeSession
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
    session = SafeSession(LiveSession(catalog, options, notifier, source="<stdin>",
                                      settle=getattr(args, "settle", None) or 0.5))
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
    if diagnosis is None:               # the diagnosis stopped early (said on stderr)
        return 1 if session.found_before_stop else 2
    report_written(args)
    return exit_code(diagnosis)
