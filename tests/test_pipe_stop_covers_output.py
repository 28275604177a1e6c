"""A stop signal in pipe mode: the report covers every byte that reached stdout, wherever it lands.

The copy runs in a thread of its own and writes a block through before handing it to the diagnosis; a
stop signal between the two once produced a report on less than the user saw (a false all-clear on a
failure already on their screen). Here the signal is sent at seeded random points of a healthy and a
failing stream, the moment stdout has echoed the bytes before that point (the race's window), and the
diagnosis must have read exactly what reached stdout and say what a diagnosis of those bytes says.
"""
from __future__ import annotations

import os
import random
import signal
import threading

import pytest

from test_pipe_support import HEALTHY, TP_FAILURE, Collector, spawn
from test_runs import Notes
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.diagnosis.saved import Options
from vllm_doctor.streams.guard import SafeSession
from vllm_doctor.streams.pipe import pump

POINTS = 50
WAIT_S = 30.0                     # generous: the tests hold on a loaded 2-core machine
# 40 healthy launches, then a real failure (the case that once ended in exit 0), and a healthy stream
FAILING = (HEALTHY * 40 + TP_FAILURE).encode()
HEALTHY_STREAM = (HEALTHY * 40).encode()


class PipeTrap:
    """The SignalTrap's shape: a descriptor that turns readable when a signal came, `take()` the signals."""

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()

    def send(self, signum: int) -> None:
        os.write(self._w, bytes([signum]))

    def take(self) -> list[int]:
        return list(os.read(self.fd, 256))

    def close(self) -> None:
        for fd in (self.fd, self._w):
            os.close(fd)


def _outcome(catalog, data: bytes) -> tuple[list[str], bool]:
    """What a diagnosis of exactly `data` says: its rules, run by run, and whether anything is wrong."""
    session = LiveSession(catalog, Options(live=False), Notes(), source="<stdin>", settle=0.0)
    session.feed(data)
    d = session.finish()
    runs = (*d.earlier, d)
    return [f.rule for r in runs for f in r.findings], any(r.findings for r in runs)


def _stop_at(catalog, data: bytes, cut: int, rng: random.Random) -> tuple[bytes, SafeSession, str | None]:
    """Pump `data` through an in-process pipe; send SIGTERM once stdout echoed data[:cut] (the rest keeps
    coming, as from a server that is still writing). Returns (what reached stdout, the session, error)."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    trap = PipeTrap()
    out = Collector(os.fdopen(stdout_r, "rb", buffering=0))
    session = SafeSession(LiveSession(catalog, Options(live=False), Notes(), source="<stdin>", settle=0.0))

    def server() -> None:
        at = 0
        try:
            while at < cut:                            # pipe-sized pieces, as a real writer's
                n = min(cut - at, rng.choice((1, 17, 400, 4096, 65536)))
                os.write(stdin_w, data[at:at + n])
                at += n
            out.wait_for_bytes(cut, timeout=WAIT_S)
            trap.send(signal.SIGTERM)
            while at < len(data):                      # still writing after the signal
                at += os.write(stdin_w, data[at:at + 4096])
        except OSError:                                # the doctor's copy stopped reading: fine
            pass
        finally:
            os.close(stdin_w)

    writer = threading.Thread(target=server, daemon=True)
    writer.start()
    try:
        error = pump(stdin_r, stdout_w, session, trap)
    finally:
        os.close(stdout_w)
    writer.join(WAIT_S)
    out.join()
    os.close(stdin_r)
    trap.close()
    return bytes(out.data), session, error


@pytest.mark.parametrize("name,data", [("healthy", HEALTHY_STREAM), ("failing", FAILING)], ids=["healthy", "failing"])
def test_a_stop_signal_anywhere_reports_on_all_that_reached_stdout(catalog, name, data):
    rng = random.Random(f"stop-{name}")
    for _ in range(POINTS):
        cut = rng.randrange(0, len(data) + 1)
        seen, session, error = _stop_at(catalog, data, cut, rng)
        assert data.startswith(seen) and len(seen) >= cut
        if not seen:
            assert error == "stopped before any input arrived: nothing to diagnose"
            continue
        assert error is None and session.stopped is None, (cut, session.stopped)
        assert session.bytes == len(seen), f"cut {cut}: read {session.bytes} of {len(seen)} bytes on stdout"
        d = session.finish()
        runs = (*d.earlier, d)
        got = ([f.rule for r in runs for f in r.findings], any(r.findings for r in runs))
        assert got == _outcome(catalog, seen), f"cut {cut}"
        if name == "failing" and seen == data:
            assert "tp-heads-indivisible" in got[0]


def test_sigterm_after_a_failure_was_echoed_reports_it():
    """The real signal, a real process: the failure is on the user's screen, so it is in the report."""
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    out = Collector(proc.stdout)
    try:
        proc.stdin.write(FAILING)
        proc.stdin.flush()                              # the pipe stays open: the server hangs
        assert out.wait_for_bytes(len(FAILING), timeout=WAIT_S)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
    err.join()
    assert "error[tp-heads-indivisible]" in err.text(), err.text()
    assert rc == 1
