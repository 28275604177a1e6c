"""What the pipe says while the input flows agrees with the report at its end (issue 30): every real and
built log of logs_corpus/, fed to a live session the way the pipe reads it. A failure notice names a rule
the final report names too: a healthy run gets none (a notice shown while the server was still starting and
retracted at the end is a false alarm the user has already seen), and a generic symptom after its specific
cause (`NCCL error: unhandled system error` after the shm WARN line, `No CUDA GPUs` after the old driver)
is no second failure with a second fix."""
from __future__ import annotations

import re
import tomllib

import pytest

from conftest import ROOT
from test_runs import Notes
from vllm_doctor.diagnosis.live import LiveSession
from vllm_doctor.diagnosis.saved import Options

CORPUS = ROOT / "logs_corpus"
NOTICE = re.compile(r"failure at \S+: .*\[([\w-]+)\]\n")


def _cases():
    for cases_file in sorted(CORPUS.rglob("cases.toml")):
        group = cases_file.parent.relative_to(CORPUS).as_posix()
        for case in tomllib.loads(cases_file.read_text())["case"]:
            yield pytest.param(cases_file.parent / case["file"], case, id=f"{group}/{case['id']}")


CASES = list(_cases())
HEALTHY = [c for c in CASES if c.values[1].get("label") == "healthy" and not c.values[1].get("known_miss")]


def _live(catalog, path):
    notes = Notes()
    session = LiveSession(catalog, Options(live=False), notes, source="<stdin>", settle=0.0)
    data = path.read_bytes()
    for i in range(0, len(data), 4096):          # a pipe's reads
        session.feed(data[i:i + 4096])
        session.poll()
    return NOTICE.findall(notes.text), session.finish()


def test_the_healthy_group_is_there():
    assert len(HEALTHY) >= 12


@pytest.mark.parametrize("path, case", HEALTHY)
def test_a_healthy_log_gets_no_early_failure_notice(catalog, path, case):
    early, diagnosis = _live(catalog, path)
    assert not diagnosis.findings and not early, early


@pytest.mark.parametrize("path, case", CASES)
def test_each_early_failure_is_one_the_final_report_names(catalog, path, case):
    early, diagnosis = _live(catalog, path)
    final = [f.rule for f in diagnosis.findings]
    assert set(early) <= set(final), (early, final)


def test_a_failure_wording_vllm_went_on_from_predicts_nothing(catalog):
    """`Failed to import from vllm._C`, at WARNING on a TPU host (printed there by design): shown as what
    it is, not as a prediction (a predictive pattern, NCCL's P2P warning, keeps "predicts a failure":
    tests/test_pipe.py)."""
    notes = Notes()
    session = LiveSession(catalog, Options(live=False), notes, source="<stdin>", settle=0.0)
    session.feed((CORPUS / "real/healthy/th06-tpu-vllm-C-warning-mute-request.log").read_bytes())
    assert not session.finish().findings
    assert "warning (vLLM printed it as a warning and went on)" in notes.text
    assert "predicts a failure" not in notes.text


def test_a_wait_its_answer_follows_is_no_warning(catalog):
    """NCCL's `Init START` (every NCCL_DEBUG=INFO run prints it; `Init COMPLETE` answers it): no notice while
    the log flows; a log that ends unanswered is the final report's stall (tests/test_corpus.py)."""
    notes = Notes()
    session = LiveSession(catalog, Options(live=False), notes, source="<stdin>", settle=0.0)
    data = (CORPUS / "nccl/n15-healthy-nccl-flood.log").read_bytes()
    start = data.index(b"Init START")
    session.feed(data[:data.index(b"\n", start) + 1])   # the wait, its answer not yet there
    session.poll()
    assert "nccl-timeout" not in notes.text
    session.feed(data[data.index(b"\n", start) + 1:])
    assert not session.finish().findings and "warning" not in notes.text
