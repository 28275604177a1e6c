"""Start-up cost: a small saved log, reported to a pipe, loads none of the heavy modules it does not use.

Rich renders only coloured output; NVML is probed only when a log was written here (or --live); numpy,
transformers and textual serve big logs, model configs and the TUI; the TOML parser runs only when the
catalog cache is cold."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

LOG = "logs_corpus/parallel/vicuna13b-tp3.log"        # the README's example: 36 lines, one finding
# ray (facts --ray) and prometheus_client (health) are optional extras: never on the log path
HEAVY = ("rich", "numpy", "pynvml", "transformers", "textual", "tomllib", "ray", "prometheus_client")
PROBE = """\
import contextlib, io, json, sys
import vllm_doctor.cli.main as main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main.main(sys.argv[1:])
print(json.dumps({"rc": rc, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def loaded(*args: str, cache, env: dict | None = None) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update(VLLM_DOCTOR_CACHE_DIR=str(cache), **(env or {}))
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, env=full_env, cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.fixture
def warm(tmp_path):
    """A cache directory the catalog was already built into (the second run of a user's day)."""
    cache = tmp_path / "cache"
    first = loaded("--no-live", LOG, cache=cache)
    assert "tomllib" in first["modules"], "the cold run did not parse the rules: is the cache elsewhere?"
    return cache


def _heavy(result: dict) -> list[str]:
    return [name for name in HEAVY if name in result["modules"]]


@pytest.mark.parametrize("args", [
    ("--no-live",),
    (),                                   # a log from elsewhere: this machine's GPUs are never asked
    ("--format", "json"),
    ("--format", "markdown"),
    ("--no-live", "--anonymize"),
])
def test_a_small_log_loads_nothing_heavy(warm, args):
    result = loaded(*args, LOG, cache=warm)
    assert result["rc"] == 1 and "tp-heads-indivisible" in result["out"]
    assert _heavy(result) == []


def test_a_log_written_here_still_asks_nvml(warm, tmp_path):
    """The lazy probe must not lose the machine's facts when they belong: --live asks NVML (installed
    or not: a missing pynvml is a fact too)."""
    result = loaded("--live", "--format", "json", LOG, cache=warm)
    facts = json.loads(result["out"])["facts"]
    assert any(key.startswith("gpu.") and fact["source"] == "nvml" for key, fact in facts.items()), facts.keys()


def test_colour_and_verbose_tables_do_use_rich(warm):
    """What rich is still for (so the check above is not vacuous)."""
    assert "rich" in loaded("--no-live", "-v", LOG, cache=warm)["modules"]          # the facts table
    coloured = loaded("--no-live", LOG, cache=warm, env={"FORCE_COLOR": "1"})
    assert "rich" in coloured["modules"] and "\x1b[" in coloured["out"]
