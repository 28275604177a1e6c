import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DEV = ROOT / "tests" / "data" / "corpus-dev"   # copies of the team's real vLLM 0.32 logs
REFERENCE = ROOT / "docs" / "reference"               # copies of the team's reference notes


@pytest.fixture(scope="session")
def catalog():
    from vllm_doctor.rules.catalog import load_catalog

    return load_catalog(ROOT / "rules")


def run_cli(*args, input=None, env=None, timeout=60):
    """Run the installed CLI the way a user does (a fresh interpreter), return CompletedProcess."""
    full_env = dict(os.environ, NO_COLOR="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], input=input, capture_output=True,
                          env=full_env, timeout=timeout, cwd=ROOT)
