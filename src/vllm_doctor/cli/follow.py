"""Follow mode: `vllm-doctor --follow FILE` diagnoses a log that a server is still writing.

The file is read from its start (the start-up is what matters), then polled every POLL_S seconds for
new bytes, the way `tail -F` does it:

* truncation (the file got shorter than what was read, `> server.log` or copytruncate): read again
  from its start, line numbers restart;
* rotation (the path now names another file, or vanished and came back): the old file is read to its
  end first, then the new one from its start;
* a path that does not exist yet is waited for (a server about to start).

After a truncation or rotation what follows is a new run (diagnosis/runs.py), diagnosed on its own: the
report shows it first, what the file held before as an earlier run ("server.log (before rotation)"), so
that the old launch's failure is never fixed in the new launch's command. A relaunch written into the
same file (a second banner after a failure) is a new run too.

Notices and the report are printed as in pipe mode, on stdout (or `--report FILE`). It stops on
Ctrl-C / SIGTERM, or — with `--idle-exit SECONDS` — once a failure has been reported and the file has
then been silent that long (a failure no rule names has no early notice: the file gone silent on it counts). Exit code: 1 when a failure was found (in the last run), 0 otherwise, 2 for
a usage error.

A FIFO (`mkfifo server.log`) is followed too: its lines are diagnosed as they arrive, and a writer that
closes it is no end (the next writer's output is followed like the first's); a signal stops it at once.

An internal error in the diagnosis stops it with one line (streams/guard.py) and no report; the exit
code is then 1 when a failure had been reported before the stop, 2 otherwise.
"""
from __future__ import annotations

import os
import sys

from vllm_doctor.cli.common import exit_code, fail
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.sources.tail import Tail
from vllm_doctor.streams.follow import POLL_S, follow
from vllm_doctor.streams.guard import SafeSession
from vllm_doctor.streams.output import final_report, live_streams
from vllm_doctor.streams.signals import SignalTrap


def run_follow(catalog, args, options) -> int:
    path = args.follow
    if os.path.isdir(path):
        return fail(f"cannot follow {path}: is a directory")
    idle_exit = args.idle_exit
    if idle_exit is not None and idle_exit < 0:
        return fail("--idle-exit must be a number of seconds >= 0")
    notifier = live_streams(args, sys.stdout)
    session = SafeSession(LiveSession(catalog, options, notifier, source=path,
                                      settle=getattr(args, "settle", None) or 0.5))
    tail = Tail(path)
    with SignalTrap() as trap:
        try:
            follow(tail, session, trap, idle_exit, getattr(args, "poll", None) or POLL_S)
        except IsADirectoryError:
            return fail(f"cannot follow {path}: is a directory")
        finally:
            tail.close()
        diagnosis, error = final_report(session, args, sys.stdout)
    if error:
        return fail(error)
    if diagnosis is None:               # the diagnosis stopped early (said on stderr)
        return 1 if session.found_before_stop else 2
    return exit_code(diagnosis)
