"""Closed, full or broken standard streams: one line and a documented exit code, never a traceback, and a
finding is never turned into exit 0 by a reader that went away."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_pipe_support import ENV, ROOT

LOG = ROOT / "logs_corpus/real032/r04-tp5-40heads-8kv-assert.log"      # a real failing start-up: exit 1
DOCTOR = f"{sys.executable} -m vllm_doctor"
FULL = os.path.exists("/dev/full")


def sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=ENV, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("script, rc, says", [
    (f"{DOCTOR} {LOG} >&-; echo rc=$?", 1, ""),                                 # stdout closed
    (f"({DOCTOR} {LOG} >&- 2>&-); echo rc=$?", 1, ""),                         # both closed
    (f"{DOCTOR} explain no-gpu >&-; echo rc=$?", 0, ""),
    (f"{DOCTOR} <&-; echo rc=$?", 2, "standard input is closed"),
    (f"{DOCTOR} - <&-; echo rc=$?", 2, "standard input is closed"),
    (f"{DOCTOR} {LOG} | head -c 10 >/dev/null; echo rc=${{PIPESTATUS[0]}}", 1, ""),   # the reader left
    (f"{DOCTOR} --format json {LOG} | head -c 10 >/dev/null; echo rc=${{PIPESTATUS[0]}}", 1, ""),
    (f"{DOCTOR} rules | head -c 10 >/dev/null; echo rc=${{PIPESTATUS[0]}}", 0, ""),
], ids=["stdout-closed", "both-closed", "explain-closed", "stdin-closed", "dash-stdin-closed", "head",
        "head-json", "rules-head"])
def test_closed_and_broken_streams(script, rc, says):
    proc = sh(script)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "Exception ignored" not in out, out
    assert f"rc={rc}" in out, out
    assert says in proc.stderr


@pytest.mark.skipif(not FULL, reason="no /dev/full here")
@pytest.mark.parametrize("command", [f"{LOG}", f"--format json {LOG}", f"--format markdown {LOG}", "rules",
                                     "rules --format json",
                                     "check vllm serve ./m -tp 3", "explain no-gpu"])
def test_a_full_disk_is_one_line_and_exit_2(command):
    proc = sh(f"{DOCTOR} {command} >/dev/full; echo rc=$? >&2")
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert "rc=2" in proc.stderr
    assert "vllm-doctor: error: cannot write" in proc.stderr and "No space left on device" in proc.stderr
