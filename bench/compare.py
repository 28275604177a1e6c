"""Side-by-side runs of several commands, interleaved, reported as medians.

A shared, noisy machine makes one run of A then one run of B meaningless: the load changes between
them. So every comparison runs all its commands in each round, rotating the order (round 1: A B C,
round 2: B C A, ...), and reports the median of each figure over the rounds; ratios are taken from the
medians. Per command and round: wall seconds (perf_counter, the whole pipeline), CPU seconds (user+sys
of the measured process from os.wait4, its threads included) and peak RSS (VmHWM sampled from /proc).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CHUNK = 1 << 20


class PeakRSS:
    """VmHWM of a running process, sampled from /proc (ru_maxrss of a forked child also counts the
    parent's memory at fork time, which would hide the child's own figure)."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        self.pid, self.every, self.kib = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.kib = max(self.kib, int(line.split()[1]))
            except (OSError, ValueError):
                pass
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Command:
    """One thing to measure. `feed` is a command whose stdout becomes argv's stdin (`feed | argv`);
    the figures are argv's own, wall time is the whole pipeline's. `stdout`: "capture" (kept, for a
    count or a report), "discard" (read from a pipe and dropped, counting lines) or "devnull"."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    feed: Sequence[str] | None = None
    stdout: str = "capture"


@dataclass
class Sample:
    wall: float
    cpu: float
    rss_kib: int
    rc: int
    out: bytes = b""
    out_bytes: int = 0
    out_lines: int = 0
    feed_cpu: float = 0.0


@dataclass
class Summary:
    """Medians over the rounds; `last` is the final round's sample (its output, exit code)."""

    name: str
    wall: float
    cpu: float
    rss_mib: float
    last: Sample
    samples: list[Sample] = field(default_factory=list)

    def mb_s(self, nbytes: int) -> float:
        return nbytes / 1e6 / self.wall if self.wall else float("inf")


def _cpu(rusage) -> float:
    return rusage.ru_utime + rusage.ru_stime


def _reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Exit code and CPU seconds of one child (wait4 gives the rusage of that child alone)."""
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, _cpu(rusage)


def _drain(stream, keep: bool) -> tuple[bytes, int, int]:
    kept, nbytes, nlines = bytearray(), 0, 0
    fd = stream.fileno()
    while chunk := os.read(fd, CHUNK):
        nbytes += len(chunk)
        nlines += chunk.count(b"\n")
        if keep:
            kept += chunk
    stream.close()
    return bytes(kept), nbytes, nlines


def run_once(cmd: Command) -> Sample:
    """Run `cmd` once and measure it."""
    sink = subprocess.DEVNULL if cmd.stdout == "devnull" else subprocess.PIPE
    env = dict(cmd.env) if cmd.env is not None else None
    start = time.perf_counter()
    feeder = subprocess.Popen(cmd.feed, stdout=subprocess.PIPE, env=env) if cmd.feed else None
    proc = subprocess.Popen(cmd.argv, stdin=feeder.stdout if feeder else subprocess.DEVNULL,
                            stdout=sink, stderr=subprocess.DEVNULL, env=env)
    if feeder:
        feeder.stdout.close()                 # only the consumer holds the pipe: cat sees EPIPE if it quits
    peak = PeakRSS(proc.pid)
    out, nbytes, nlines = _drain(proc.stdout, cmd.stdout == "capture") if proc.stdout else (b"", 0, 0)
    rc, cpu = _reap(proc)
    peak.stop()
    feed_cpu = _reap(feeder)[1] if feeder else 0.0
    wall = time.perf_counter() - start
    return Sample(wall, cpu, peak.kib, rc, out, nbytes, nlines, feed_cpu)


def warm(*paths: str) -> None:
    """Read files once so every command finds them in the page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(CHUNK * 8):
                pass


def interleave(commands: Sequence[Command], rounds: int,
               progress: Callable[[str], None] | None = None) -> dict[str, Summary]:
    """Run all `commands` in each of `rounds` rounds, the order rotated by one each round; medians."""
    samples: dict[str, list[Sample]] = {c.name: [] for c in commands}
    n = len(commands)
    for r in range(rounds):
        for i in range(n):
            cmd = commands[(r + i) % n]
            samples[cmd.name].append(run_once(cmd))
        if progress:
            progress(f"round {r + 1}/{rounds}")
    return {name: summarize(name, got) for name, got in samples.items()}


def summarize(name: str, samples: list[Sample]) -> Summary:
    return Summary(name, statistics.median(s.wall for s in samples), statistics.median(s.cpu for s in samples),
                   statistics.median(s.rss_kib for s in samples) / 1024, samples[-1], samples)


def stderr_progress(text: str) -> None:
    import sys

    sys.stdout.flush()                        # the figures so far first, when both go to one file
    print(f"  .. {text}", file=sys.stderr, flush=True)


def ratio(a: float, b: float) -> str:
    """a / b as `N.NNx` (b == 0: `-`)."""
    return f"{a / b:.2f}x" if b else "-"
