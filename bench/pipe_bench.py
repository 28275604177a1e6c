"""Pipe mode: throughput vs `cat`, delay from a fatal line to the printed finding, peak memory.

1. `cat LOG | vllm-doctor --no-live > /dev/null` vs `cat LOG | cat > /dev/null` on the logs gen_log.py
   generates (cached in the temp dir) at each --sizes, interleaved over --rounds rounds: medians of the
   wall time, the doctor's MB/s and CPU s, its peak RSS (/proc VmHWM). Targets: >= 500 MB/s on 1 GiB,
   and memory flat (the same peak RSS at every size).
2. Delay: a writer process paces healthy log lines into the doctor at each --rates lines/s (in 1 ms
   batches), writes a fatal traceback (tensor-parallel heads, as in corpus-dev/07), stamps the time
   (CLOCK_MONOTONIC, shared by all processes) and keeps writing; the delay is from that stamp to the
   moment `failure at` appears on the doctor's stderr. --trials runs per rate; median and p99.

    python bench/pipe_bench.py [--sizes 10M,1G] [--rounds 5] [--rates 1000,50000,200000] [--trials 7]
    ('' for --sizes or --rates skips that part)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log
from compare import Command, interleave, ratio, stderr_progress, warm

DOCTOR = [sys.executable, "-m", "vllm_doctor", "--no-live"]

WRITER = r'''
import os, sys, time
rate, before, after = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
fatal = open(sys.argv[4], "rb").read()
pool = [l.encode() + b"\n" for l in open(sys.argv[5]).read().splitlines()]
warn = b"(EngineCore_DP0 pid=4242) INFO 12-01 00:40:00 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds.\n"
out = sys.stdout.fileno()
def write(b):
    v = memoryview(b)
    while v:
        v = v[os.write(out, v):]
write(warn)                                  # the doctor answers it: then it is up and reading
sys.stdin.readline()
i, n = 0, len(pool)
def pace(seconds):
    global i
    start = time.monotonic(); sent = 0
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            return
        due = int((now - start) * rate) - sent
        if due > 0:
            chunk = b"".join(pool[(i + k) % n] for k in range(due))
            i += due; sent += due
            write(chunk)
        time.sleep(0.001)
pace(before)
write(fatal)
sys.stderr.write(f"{time.monotonic()}\n"); sys.stderr.flush()
pace(after)
'''

FATAL = """Traceback (most recent call last):
  File "/opt/venv/bin/vllm", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 2838, in create_engine_config
    config = VllmConfig(
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Total number of attention heads (40) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""


def throughput(specs: list[str], rounds: int) -> None:
    """`cat LOG | doctor` vs `cat LOG | cat`, interleaved, at each size."""
    print(f"throughput ({rounds} interleaved rounds per size, medians)")
    print(f"{'size':>8s} {'cat|cat s':>10s} {'cat|doctor s':>13s} {'doctor MB/s':>12s} {'vs cat':>7s} "
          f"{'doctor CPU s':>13s} {'peak RSS MiB':>13s}")
    rss = []
    for spec in specs:
        path = gen_log.cached(gen_log.parse_size(spec))
        size = os.path.getsize(path)
        cat = Command("cat|cat", ["cat"], feed=["cat", path], stdout="devnull")
        doc = Command("cat|doctor", DOCTOR, feed=["cat", path], stdout="devnull")
        warm(path)
        got = interleave([cat, doc], rounds, stderr_progress)
        c, d = got[cat.name], got[doc.name]
        rss.append(d.rss_mib)
        print(f"{spec:>8s} {c.wall:10.2f} {d.wall:13.2f} {d.mb_s(size):12.1f} {ratio(d.wall, c.wall):>7s} "
              f"{d.cpu:13.2f} {d.rss_mib:13.1f}", flush=True)
    if rss:
        print(f"target: >= 500 MB/s on 1 GiB; memory flat: peak RSS {rss[0]:.1f} MiB at {specs[0]}, "
              f"{rss[-1]:.1f} MiB at {specs[-1]}")


def one_delay(rate: float, fatal_path: str, pool_path: str, before: float = 1.0, after: float = 1.5) -> float | None:
    doc = subprocess.Popen(DOCTOR, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(rate), str(before), str(after), fatal_path, pool_path],
                              stdin=subprocess.PIPE, stdout=doc.stdin, stderr=subprocess.PIPE)
    doc.stdin.close()
    seen: dict[str, float] = {}
    buf = bytearray()

    def read_stderr() -> None:
        fd = doc.stderr.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf.extend(chunk)
            now = time.monotonic()
            if b"predicts a failure" in buf and "warning" not in seen:
                seen["warning"] = now
            if b"failure at" in buf and "failure" not in seen:
                seen["failure"] = now

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while "warning" not in seen and time.monotonic() < deadline:
        time.sleep(0.005)
    writer.stdin.write(b"go\n")
    writer.stdin.close()
    stamp = float(writer.stderr.readline() or 0)
    writer.wait()
    doc.wait(timeout=60)
    reader.join(5)
    if not stamp or "failure" not in seen:
        return None
    return seen["failure"] - stamp


def delays(rates: list[float], trials: int) -> None:
    import random
    import tempfile

    work = tempfile.mkdtemp(prefix="vllm-doctor-pipe-")
    fatal_path = os.path.join(work, "fatal.txt")
    with open(fatal_path, "w") as f:
        f.write(FATAL)
    pool_path = os.path.join(work, "pool.txt")
    with open(pool_path, "w") as f:
        f.write("\n".join(gen_log.line_pool(random.Random(3), 5000)) + "\n")
    print(f"delay from the fatal line written to the finding printed ({trials} trials per rate)")
    print(f"{'lines/s':>9s} {'median ms':>10s} {'p99 ms':>8s} {'min ms':>8s} {'missed':>7s}")
    for rate in rates:
        got = [one_delay(rate, fatal_path, pool_path) for _ in range(trials)]
        ms = sorted(d * 1000 for d in got if d is not None)
        missed = trials - len(ms)
        if ms:
            p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
            print(f"{rate:9.0f} {statistics.median(ms):10.1f} {p99:8.1f} {ms[0]:8.1f} {missed:7d}", flush=True)
        else:
            print(f"{rate:9.0f} {'-':>10s} {'-':>8s} {'-':>8s} {missed:7d}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10M,1G")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rates", default="1000,50000,200000")
    ap.add_argument("--trials", type=int, default=7)
    args = ap.parse_args(argv)
    specs = [s for s in args.sizes.split(",") if s]
    if specs:
        throughput(specs, args.rounds)
        print()
    rates = [float(r) for r in args.rates.split(",") if r]
    if rates:
        delays(rates, args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
