"""`health --watch` over real 0.32 bodies served in turn: a line per reading, a finding said when it appears and
when it clears, JSON lines with --format json, and the exit code of the last reading."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from test_health import Served, body, server  # noqa: F401 (the fixture)

pytest.importorskip("prometheus_client")

SEQUENCE = ["steady-1", "steady-2", "queued-1", "queued-2", "draining-1", "draining-2", "steady-2"]


def watch(url: str, *args: str):
    return subprocess.run([sys.executable, "-m", "vllm_doctor", "health", url, "--watch", "--interval", "0", *args],
                          capture_output=True, timeout=120, cwd=ROOT, text=True)


def bodies(names):
    return Served([body(f"v0.32.0-cpu-{n}.metrics") for n in names])


def test_watch_says_a_finding_when_it_appears_and_when_it_clears(server):
    out = watch(server(bodies(SEQUENCE)), "--count", str(len(SEQUENCE) + 1))
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr          # the last reading is healthy again
    assert lines[0].split()[:3] == ["time", "running", "waiting"]
    rows = [ln for ln in lines[1:] if not ln.startswith(("  +", "  -"))]
    assert len(rows) == len(SEQUENCE)                            # one per reading after the first
    # each reading against the one before it: the queue is held from queued-2 to draining-2
    assert [r.split()[-1] for r in rows] == ["ok", "ok", "server-scheduler-bound", "server-scheduler-bound",
                                             "server-scheduler-bound", "ok", "ok"]
    said = [ln.strip() for ln in lines if ln.startswith(("  +", "  -"))]
    assert said[0].startswith("+ warning[server-scheduler-bound]") and "--max-num-seqs 14" in said[0]
    assert said[1:] == ["- server-scheduler-bound: cleared"]      # said once while it lasts, once when it clears


def test_watch_json_lines_and_the_last_readings_exit_code(server):
    out = watch(server(bodies(["steady-2", "queued-1", "queued-2"])), "--count", "3", "--format", "json")
    records = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert out.returncode == 1 and len(records) == 2
    assert records[-1]["findings"][0]["rule"] == "server-scheduler-bound" and records[0]["findings"] == []
    assert records[-1]["state"].startswith("2 running, 42 waiting")


def test_watch_usage_errors_in_one_line(server):
    url = server(bodies(["idle"]))
    for args in (["--count", "-1"], ["--format", "markdown"]):
        out = watch(url, *args)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, args
    bare = subprocess.run([sys.executable, "-m", "vllm_doctor", "health", url, "--count", "2"],
                          capture_output=True, timeout=120, cwd=ROOT, text=True)
    assert bare.returncode == 2 and "--watch" in bare.stderr
