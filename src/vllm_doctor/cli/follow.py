"""Follow mode: `vllm-doctor --follow FILE` diagnoses a log that a server is still writing.

The file is read from its start (the start-up is what matters), then polled every POLL_S seconds for
new bytes, the way `tail -F` does it:

* truncation (the file got shorter than what was read, `> server.log` or copytruncate): read again
  from its start, line numbers restart;
* rotation (the path now names another file, or vanished and came back): the old file is read to its
  end first, then the new one from its start;
* a path that does not exist yet is waited for (a server about to start).

Notices and the report are printed as in pipe mode, on stdout (or `--report FILE`). It stops on
Ctrl-C / SIGTERM, or — with `--idle-exit SECONDS` — once a failure has been reported and the file has
then been silent that long. Exit code: 1 when a failure was found, 0 otherwise, 2 for a usage error.
"""
from __future__ import annotations

import os
import select
import sys
import time

from vllm_doctor.diagnosis.live import LiveSession, SignalTrap, final_report, live_streams
from vllm_doctor.sources.scan import BLOCK

POLL_S = 0.2
READ_BUDGET = 64 * BLOCK        # per poll, so that signals and notices are never starved


class Tail:
    """One followed path: the open file, its identity, how far it was read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file = None
        self.ident: tuple[int, int] | None = None
        self.pos = 0
        self.generation = 0

    def open(self) -> bool:
        try:
            f = open(self.path, "rb")
        except OSError:
            return False
        try:
            st = os.fstat(f.fileno())
        except OSError:
            f.close()
            return False
        if os.path.isdir(self.path):
            f.close()
            raise IsADirectoryError(self.path)
        self.close()
        self.file, self.ident, self.pos = f, (st.st_dev, st.st_ino), 0
        self.generation += 1
        return True

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None

    def read(self, limit: int = READ_BUDGET) -> bytes:
        if self.file is None:
            return b""
        try:
            data = self.file.read(min(BLOCK, limit))
        except OSError:
            return b""
        self.pos += len(data)
        return data or b""

    def truncated(self) -> bool:
        try:
            return self.file is not None and os.fstat(self.file.fileno()).st_size < self.pos
        except OSError:
            return False

    def replaced(self) -> bool:
        """The path names another file now (rotation), or nothing (deleted, about to be recreated)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident


def run_follow(catalog, args, options) -> int:
    from vllm_doctor.cli.main import exit_code, fail

    path = args.follow
    if os.path.isdir(path):
        return fail(f"cannot follow {path}: is a directory")
    idle_exit = args.idle_exit
    if idle_exit is not None and idle_exit < 0:
        return fail("--idle-exit must be a number of seconds >= 0")
    notifier = live_streams(args, sys.stdout)
    session = LiveSession(catalog, options, notifier, source=path, settle=getattr(args, "settle", None) or 0.5)
    tail = Tail(path)
    with SignalTrap() as trap:
        try:
            follow(tail, session, trap, idle_exit, getattr(args, "poll", None) or POLL_S)
        except IsADirectoryError:
            return fail(f"cannot follow {path}: is a directory")
        finally:
            tail.close()
        diagnosis, error = final_report(session, args, sys.stdout)
    return fail(error) if error else exit_code(diagnosis)


def follow(tail: Tail, session: LiveSession, trap: SignalTrap, idle_exit: float | None,
           poll_s: float = POLL_S) -> None:
    waiting_note = False
    last_data = time.monotonic()
    while True:
        got = 0
        if tail.file is None:
            if tail.open():
                if tail.generation > 1:
                    session.restart()
                last_data = time.monotonic()
            elif not waiting_note:
                waiting_note = True
                session.notifier.write(f"vllm-doctor: waiting for {tail.path} to appear\n")
        else:
            if tail.truncated():
                session.notifier.write(f"vllm-doctor: {tail.path} was truncated; reading it from the start\n")
                tail.file.seek(0)
                tail.pos = 0
                session.restart()
            budget = READ_BUDGET
            while budget > 0:
                data = tail.read(budget)
                if not data:
                    break
                budget -= len(data)
                got += len(data)
                session.feed(data)
                session.poll()
            if not got and tail.replaced():
                # Rotation: what the old file still held was read above; switch to the new one.
                tail.close()
                if tail.open():
                    session.notifier.write(f"vllm-doctor: {tail.path} was rotated; following the new file\n")
                    session.restart()
                    continue
        now = time.monotonic()
        if got:
            last_data = now
        else:
            session.poll(idle=now - last_data >= session.settle)
        if idle_exit is not None and session.last_fatal_at is not None \
                and now - max(last_data, session.last_fatal_at) >= idle_exit:
            return
        if got >= READ_BUDGET:
            wait = 0.0
        else:
            wait = poll_s
            t = session.timeout()
            if t is not None:
                wait = min(wait, t)
        if trap.fd >= 0:
            try:
                readable, _, _ = select.select([trap.fd], [], [], wait)
            except (OSError, ValueError):
                readable = []
            if readable and trap.take():
                return
        else:
            time.sleep(wait)
