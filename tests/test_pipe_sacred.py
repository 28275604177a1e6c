"""The pipe is sacred: whatever goes wrong in the diagnosis (an exception, a diagnosis stuck on a line),
every byte of the server's output still flows, and the doctor says in one line that it stopped."""
from __future__ import annotations

import os
import random
import subprocess
import threading
import time

import pytest

from test_pipe_support import DOCTOR, ENV, TP_FAILURE, no_traceback
from test_runs import Notes, NoTrap
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.diagnosis.saved import Options
from vllm_doctor.streams import pipe as pipe_mod
from vllm_doctor.streams.guard import SafeSession


def _payload(size: int, seed: int) -> bytes:
    """A real failing start-up, then random bytes and real lines until `size` (binary data included)."""
    rng = random.Random(seed)
    parts, n = [TP_FAILURE.encode()], len(TP_FAILURE)
    while n < size:
        part = rng.randbytes(rng.randint(1, 4096)) if rng.random() < 0.5 else TP_FAILURE.encode()
        parts.append(part)
        n += len(part)
    return b"".join(parts)[:size]


def _pump(session, data: bytes, stuck: threading.Event | None = None):
    """Run streams.pipe.pump over real pipes; returns (bytes out, seconds the writer took, pump result)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    got: list[bytes] = []
    wrote = {}

    def write() -> None:
        start = time.monotonic()
        view = memoryview(data)
        while view:
            view = view[os.write(in_w, view[:65536]):]
        os.close(in_w)
        wrote["s"] = time.monotonic() - start
        if stuck is not None:
            stuck.set()                       # the writer got everything out while the diagnosis was stuck

    def read() -> None:
        while True:
            block = os.read(out_r, 1 << 20)
            if not block:
                break
            got.append(block)

    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=read, daemon=True)]
    for t in threads:
        t.start()
    result = pipe_mod.pump(in_r, out_w, session, NoTrap())
    os.close(out_w)
    for t in threads:
        t.join(30)
    os.close(in_r)
    os.close(out_r)
    return b"".join(got), wrote.get("s"), result


class Exploding(LiveSession):
    """A session whose third feed raises, as a bug on some pathological line would."""

    calls = 0

    def feed(self, block, source=None):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("planted failure")
        return super().feed(block, source)


def test_an_internal_error_stops_the_diagnosis_never_the_copy(catalog):
    notes = Notes()
    session = SafeSession(Exploding(catalog, Options(live=False), notes, source="<stdin>", settle=0.05))
    data = _payload(6 << 20, seed=7)
    out, _, result = _pump(session, data)
    assert out == data                                   # every byte, in order
    assert result is None
    assert "vllm-doctor: diagnosis stopped: internal error (RuntimeError: planted failure); output continues" \
        in notes.text
    assert session.stopped and session.bytes == len(data)    # never "standard input is empty"


class Stuck(LiveSession):
    """A session whose second feed blocks until released (a line the diagnosis cannot get past)."""

    def __init__(self, *a, release: threading.Event, **kw):
        super().__init__(*a, **kw)
        self.release, self.calls = release, 0

    def feed(self, block, source=None):
        self.calls += 1
        if self.calls == 2:
            self.release.wait(60)
        return super().feed(block, source)


def test_a_stuck_diagnosis_never_holds_the_server_up(catalog, monkeypatch):
    monkeypatch.setattr(pipe_mod, "STALL_S", 0.3)
    notes = Notes()
    release = threading.Event()
    session = SafeSession(Stuck(catalog, Options(live=False), notes, source="<stdin>", settle=0.05,
                                release=release))
    data = _payload(40 << 20, seed=8)          # far more than the hand-off queue and the pipe buffers hold
    out, wrote_s, _ = _pump(session, data, stuck=release)
    assert out == data
    # the writer finished while the diagnosis was still stuck (release is set by the writer only)
    assert wrote_s is not None and wrote_s < 30
    assert session.stopped == "it fell more than 0.3 s behind the output"
    assert "diagnosis stopped: it fell more than 0.3 s behind the output; output continues" in notes.text


@pytest.mark.parametrize("crafted", [
    # the first line of tests/test_pipe_support.TP_FAILURE's log with its pid blown up to 5,000 digits
    b"(APIServer pid=" + b"7" * 5000 + b") INFO 12-01 00:31:17 [api_utils.py:286] non-default args: {}\n",
    # vLLM's `[rank0]:` prefix (corpus-dev NCCL logs) with a 5,000-digit rank
    b"[rank" + b"9" * 5000 + b"]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught\n",
    # a dangling traceback header, then nothing of a traceback
    b"Traceback (most recent call last):\n",
], ids=["huge-pid", "huge-rank", "dangling-traceback"])
def test_a_crafted_line_then_a_long_log_passes_through_whole(crafted):
    body = "".join(f"INFO 09-06 15:02:{i % 60:02d} metrics.py:351] Avg prompt throughput: {i}.0 tokens/s\n"
                   for i in range(200_000)).encode()
    data = crafted + body + TP_FAILURE.encode()
    proc = subprocess.run(DOCTOR, input=data, capture_output=True, env=ENV, timeout=120)
    assert proc.stdout == data
    assert no_traceback(proc.stderr.decode("utf-8", "replace"))
    assert proc.returncode == 1 and b"tp-heads-indivisible" in proc.stderr


def test_the_stop_line_reaches_stderr_when_live_notices_are_off(catalog, capsys):
    # --format json/markdown: live notices are off so that stderr carries one document; after a stop no
    # document follows, and the one line saying why is all the user gets
    from vllm_doctor.streams.output import Notifier

    session = SafeSession(Exploding(catalog, Options(live=False), Notifier(None, enabled=False),
                                    source="<stdin>", settle=0.05))
    data = _payload(4 << 20, seed=9)
    out, _, _ = _pump(session, data)
    assert out == data
    assert "diagnosis stopped: internal error (RuntimeError: planted failure)" in capsys.readouterr().err
