"""Answer time on a small log vs the interpreter's own start-up.

Byte-compiles the package first (`python -m compileall -q`), then runs, interleaved over --rounds rounds:
  python -c pass
  vllm-doctor --no-live LOG                  (LOG: the README example, logs_corpus/parallel/vicuna13b-tp3.log)
  vllm-doctor --no-live --format json LOG
with PYTHONDONTWRITEBYTECODE removed from their environment, so they use (and write) bytecode as a
normal install does. Prints the medians of wall s, CPU s and peak RSS, and the budget 3 x pass + 0.1 s.

    python bench/startup_bench.py [--rounds 15] [--log PATH]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import Command, interleave, stderr_progress

ROOT = Path(__file__).resolve().parent.parent
README_LOG = ROOT / "logs_corpus" / "parallel" / "vicuna13b-tp3.log"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("PYTHONPYCACHEPREFIX", None)        # bytecode beside the sources, where an install keeps it
    return env


def entry_point() -> list[str]:
    """The installed `vllm-doctor` script beside this interpreter (a version-manager shim on PATH
    would add its own start-up); `python -m vllm_doctor` if there is none."""
    beside = Path(sys.executable).parent / "vllm-doctor"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("vllm-doctor")
    return [found] if found else [sys.executable, "-m", "vllm_doctor"]


def compile_package(env: dict[str, str]) -> str:
    import vllm_doctor

    package = os.path.dirname(os.path.abspath(vllm_doctor.__file__))
    subprocess.run([sys.executable, "-m", "compileall", "-q", package], env=env, check=False)
    return package


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--log", default=str(README_LOG))
    args = ap.parse_args(argv)
    env = child_env()
    package = compile_package(env)
    doctor = entry_point()
    cmds = [
        Command("python -c pass", [sys.executable, "-c", "pass"], env, stdout="discard"),
        Command("vllm-doctor --no-live LOG", doctor + ["--no-live", args.log], env, stdout="discard"),
        Command("vllm-doctor --no-live --format json LOG", doctor + ["--no-live", "--format", "json", args.log], env,
                stdout="discard"),
    ]
    got = interleave(cmds, args.rounds, stderr_progress)
    print(f"package byte-compiled: {package}; doctor run as {' '.join(doctor)}")
    log = Path(args.log).resolve()
    shown = log.relative_to(ROOT) if log.is_relative_to(ROOT) else log
    print(f"log: {shown}; {args.rounds} interleaved rounds, medians")
    print(f"{'command':40s} {'wall s':>8s} {'CPU s':>7s} {'peak RSS MiB':>13s} {'exit':>5s}")
    for name, s in got.items():
        print(f"{name:40s} {s.wall:8.3f} {s.cpu:7.3f} {s.rss_mib:13.1f} {s.last.rc:5d}")
    budget = 3 * got["python -c pass"].wall + 0.1
    print(f"budget: 3 x pass + 0.1 s = {budget:.3f} s")
    for name, s in list(got.items())[1:]:
        print(f"  {name}: {s.wall:.3f} s, {'within' if s.wall <= budget else 'OVER'} budget "
              f"({s.wall - budget:+.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
