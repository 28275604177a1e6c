"""The follow loop: poll a Tail, feed the live session, notice truncation and rotation (each starts a new
run of the session: the new file's launch is diagnosed on its own), stop on a signal or after `idle_exit`
seconds of silence once a failure was reported.

`trap` is anything with `fd` (readable when the loop should look at it, or -1) and `take()` (true: stop):
a streams.signals.SignalTrap in the CLI, a plain wake-up pipe in the TUI. A stream (a FIFO: `tail.stream`)
is selected on with the trap, so that its lines are read as they come and a signal is seen at once; a
regular file is polled every `poll_s` seconds. `tick`, when given, is called
once a round, after the round's reads and polls (the TUI refreshes its screen from there)."""
from __future__ import annotations

import select
import time
from typing import Callable

from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.sources.tail import READ_BUDGET, Tail
from vllm_doctor.streams.signals import SignalTrap

POLL_S = 0.2


def ends_unexplained(session: LiveSession) -> bool:
    """The log, gone quiet, ends in a failure no rule names (no early notice was possible): what the
    report would say now is `unrecognized`. Worked out once per silent stretch, on a copy (settled)."""
    try:
        # a hang while serving is unrecognized too, but its wait lines repeat while it lasts: not an end
        return any(f.rule == "unrecognized" and "hang" not in f.facts for f in session.settled().findings)
    except Exception:              # the diagnosis broke: the guard reports it at the end; keep following
        return False


def follow(tail: Tail, session: LiveSession, trap: SignalTrap, idle_exit: float | None,
           poll_s: float = POLL_S, tick: Callable[[], None] | None = None) -> None:
    waiting_note = False
    last_data = time.monotonic()
    quiet_checked = False      # this silent stretch was looked at for an unexplained failure already
    while True:
        got = 0
        if tail.file is None:
            if tail.open():
                if tail.generation > 1:        # it vanished and came back: a rotation
                    session.restart(reason="rotation")
                last_data = time.monotonic()
            elif not waiting_note:
                waiting_note = True
                session.notifier.write(f"vllm-doctor: waiting for {tail.path} to appear\n")
        else:
            if tail.truncated():
                session.notifier.write(f"vllm-doctor: {tail.path} was truncated; reading it from the start\n")
                tail.file.seek(0)
                tail.pos = 0
                session.restart(reason="truncation")
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
                    session.restart(reason="rotation")
                    continue
        now = time.monotonic()
        if got:
            last_data = now
            quiet_checked = False
        else:
            session.poll(idle=now - last_data >= session.settle)
        if tick is not None:
            tick()
        if idle_exit is not None and now - last_data >= idle_exit:
            if session.last_fatal_at is not None and now - session.last_fatal_at >= idle_exit:
                return
            if not quiet_checked:
                quiet_checked = True
                if ends_unexplained(session):
                    return
        if got >= READ_BUDGET:
            wait = 0.0
        else:
            wait = poll_s
            t = session.timeout()
            if t is not None:
                wait = min(wait, t)
        watch = [fd for fd in (trap.fd, tail.fileno() if tail.stream else -1) if fd >= 0]
        if watch:
            try:
                readable, _, _ = select.select(watch, [], [], wait)
            except (OSError, ValueError):
                readable = []
            if trap.fd >= 0 and trap.fd in readable and trap.take():
                return
        else:
            time.sleep(wait)
