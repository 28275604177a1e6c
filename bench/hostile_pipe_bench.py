"""A crafted line never slows the server behind the pipe: `cat LOG | vllm-doctor` and `vllm-doctor run --
cat LOG`, where LOG is one crafted line followed by 200k lines of a generated log, against the same
200k lines alone, interleaved over --rounds rounds (medians of wall seconds; ratio crafted/plain).

Crafted lines (each a variant of a real one): a 5,000-digit pid in vLLM's `(APIServer pid=N)` prefix,
a 5,000-digit rank in `[rankN]:`, a dangling `Traceback (most recent call last):` header, and a 100k-
character line made of a rule example and its own characters (the shape that once backtracked for > 10 s).

    python bench/hostile_pipe_bench.py [--lines 200000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log
from compare import Command, interleave, ratio, stderr_progress, warm

DOCTOR = [sys.executable, "-m", "vllm_doctor", "--no-live"]
CRAFTED = {
    "huge-pid": b"(APIServer pid=" + b"7" * 5000 + b") INFO 12-01 00:31:17 [api_utils.py:286] non-default args: {}\n",
    "huge-rank": b"[rank" + b"9" * 5000 + b"]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] Watchdog caught\n",
    "dangling-tb": b"Traceback (most recent call last):\n",
    # cli-unknown-arg's real example, then 100k characters of what its pattern repeats over
    "redos-line": b"api_server.py: error: unrecognized arguments: " + b"--x " * 25_000 + b"\n",
}


def body(lines: int) -> bytes:
    path = gen_log.cached(gen_log.parse_size("60M"))
    with open(path, "rb") as f:
        out = []
        for _ in range(lines):
            line = f.readline()
            if not line:
                break
            out.append(line)
    return b"".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hostile-pipe-")
    plain = body(args.lines)
    paths = {"plain": os.path.join(tmp, "plain.log")}
    with open(paths["plain"], "wb") as f:
        f.write(plain)
    for name, line in CRAFTED.items():
        paths[name] = os.path.join(tmp, f"{name}.log")
        with open(paths[name], "wb") as f:
            f.write(line + plain)
    warm(*paths.values())
    print(f"{len(plain) / 1e6:.1f} MB, {args.lines} lines after the crafted one; medians of {args.rounds} rounds")
    print(f"{'input':12s} {'pipe s':>8s} {'vs plain':>9s} {'run s':>8s} {'vs plain':>9s}")
    for mode in ("pipe", "run"):
        commands = []
        for name, path in paths.items():
            if mode == "pipe":
                commands.append(Command(f"{name}", DOCTOR, feed=["cat", path], stdout="devnull"))
            else:
                commands.append(Command(f"{name}", [*DOCTOR[:3], "run", "--no-live", "--", "cat", path],
                                        stdout="devnull"))
        got = interleave(commands, args.rounds, stderr_progress)
        if mode == "pipe":
            pipe = got
        else:
            run = got
    for name in paths:
        print(f"{name:12s} {pipe[name].wall:8.2f} {ratio(pipe[name].wall, pipe['plain'].wall):>9s} "
              f"{run[name].wall:8.2f} {ratio(run[name].wall, run['plain'].wall):>9s}")


if __name__ == "__main__":
    main()
