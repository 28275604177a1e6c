"""A healthy run is never a finding in the pipe either: every real healthy log of logs_corpus/, fed to a
live session the way the pipe reads it, gets no early failure notice (issue 30). The final report of the
same logs is tests/test_corpus.py's; a notice shown while the server was still starting and retracted at
the end would be a false alarm the user has already seen."""
from __future__ import annotations

import tomllib

import pytest

from conftest import ROOT
from test_runs import Notes
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.diagnosis.saved import Options

CORPUS = ROOT / "logs_corpus"


def _healthy():
    for cases_file in sorted(CORPUS.rglob("cases.toml")):
        group = cases_file.parent.relative_to(CORPUS).as_posix()
        for case in tomllib.loads(cases_file.read_text())["case"]:
            if case.get("label") == "healthy" and not case.get("known_miss"):
                yield pytest.param(cases_file.parent / case["file"], id=f"{group}/{case['id']}")


HEALTHY = list(_healthy())


def test_the_healthy_group_is_there():
    assert len(HEALTHY) >= 12


@pytest.mark.parametrize("path", HEALTHY)
def test_a_healthy_log_gets_no_early_failure_notice(catalog, path):
    notes = Notes()
    session = LiveSession(catalog, Options(live=False), notes, source="<stdin>", settle=0.0)
    data = path.read_bytes()
    for i in range(0, len(data), 4096):          # a pipe's reads
        session.feed(data[i:i + 4096])
        session.poll()
    diagnosis = session.finish()
    assert not diagnosis.findings
    assert " failure at " not in notes.text, notes.text
