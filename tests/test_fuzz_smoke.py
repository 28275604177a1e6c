"""The mutation fuzzer (bench/fuzz.py) on a few seeded inputs, so that its checks run with the suite: every
family of damage through file, `-` and pipe modes, no traceback, no lost byte, strict JSON, exit 0/1/2.
The full run is `python bench/fuzz.py --count 2000 --seed 1` (minutes)."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_a_seeded_fuzz_run_finds_nothing():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz.py"), "--count", "24", "--seed", "2026",
                           "--timeout", "60"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    summary = proc.stdout
    assert "24 inputs, 72 runs" in summary, summary + proc.stderr[-2000:]
    for kind in ("tracebacks", "lost-byte cases", "bad exit codes", "non-strict JSON", "hangs",
                 "exceptions swallowed into one line"):
        assert f"\n{kind}: 0\n" in summary + "\n", summary
    assert proc.returncode == 0, summary
