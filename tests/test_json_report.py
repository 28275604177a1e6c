"""The JSON report, schema_version 2: notes and errors per finding, warnings and notices at the top,
every schema-1 field kept; and schema-1 documents still readable (reports.json_report.read_report)."""
import json
import sys

import pytest

from conftest import ROOT, run_cli

NOTES_LOG = ROOT / "logs_corpus/real032/r01-tp4-qwen05b-14heads.log"   # tp-heads-indivisible, 4 remedy notes
HANG_LOG = ROOT / "logs_corpus/nccl/n12-watchdog-timeout.log"         # shm-broadcast waits, then the watchdog
V1_REPORT = ROOT / "tests/data/report-v1-r01.json"   # what schema 1 printed for NOTES_LOG (before schema 2)


def _report(*args) -> dict:
    proc = run_cli("--no-live", "--format", "json", *map(str, args))
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return json.loads(proc.stdout)


def _hanging_log(tmp_path):
    """The n12 log as it stood while the workers hung: the two shm-broadcast waits, before the watchdog's
    timeout."""
    lines = HANG_LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "Watchdog caught" in ln)
    assert sum("No available shared memory broadcast block" in ln for ln in lines[:cut]) == 2
    log = tmp_path / "n12-still-hanging.log"
    log.write_text("".join(lines[:cut]), encoding="utf-8")
    return log


def test_notes_are_a_list_and_no_longer_folded_into_the_explanation():
    report = _report(NOTES_LOG)
    assert report["schema_version"] == 2
    top = report["findings"][0]
    assert top["rule"] == "tp-heads-indivisible" and top["severity"] == "error" and top["fix"]["command"]
    assert isinstance(top["notes"], list) and len(top["notes"]) >= 2
    assert all(isinstance(n, str) and n for n in top["notes"])
    assert any(n.startswith("GPU count unknown") for n in top["notes"])
    assert "Note:" not in top["explanation"]
    assert not any(n in top["explanation"] for n in top["notes"])
    assert top["errors"] == []


# vLLM's Ray-utils warning (the rule's own example text), printed by two engine processes before a healthy start
RAY_TP_WARNING = ("(EngineCore_DP0 pid=34) WARNING 03-30 14:11:45 [ray_utils.py:352] Tensor parallel size (16) exceeds "
                  "available GPUs (8). This may result in Ray placement group allocation failures. Consider reducing "
                  "tensor_parallel_size to 8 or less, or ensure your Ray cluster has 16 GPUs available.\n")


def _warned_log(tmp_path):
    log = tmp_path / "warned.log"
    log.write_text("INFO 03-30 14:11:40 [api_server.py:1034] vLLM API server version 0.11.1\n" + RAY_TP_WARNING
                   + RAY_TP_WARNING.replace("pid=34", "pid=35") + "INFO:     Application startup complete.\n")
    return log


def test_predictive_warning_once_per_rule_at_its_first_line(tmp_path, catalog):
    report = _report(_warned_log(tmp_path))
    assert report["status"] == "ok" and report["findings"] == []
    rule = catalog.rules["parallel-exceeds-gpus"]
    assert report["warnings"] == [{
        "rule": "parallel-exceeds-gpus", "title": rule.title, "severity": rule.severity,
        "evidence": {"source": str(tmp_path / "warned.log"), "line": 2, "text": RAY_TP_WARNING.rstrip("\n")},
    }]


def test_a_log_cut_while_hanging_is_stalled_and_the_timeout_wins_once_printed(tmp_path):
    report = _report(_hanging_log(tmp_path))
    top = report["findings"][0]
    assert report["status"] == "problem" and top["rule"] == "startup-stalled" and report["warnings"] == []
    assert top["evidence"][0]["line"] == 7 and "No available shared memory broadcast block" in top["evidence"][0]["text"]
    # once the watchdog's timeout is printed it is the finding, and the waits are part of the same hang
    full = _report(HANG_LOG)
    assert full["findings"][0]["rule"] == "nccl-timeout" and full["warnings"] == []


def test_text_report_shows_each_warning_once_with_its_rule(tmp_path):
    out = run_cli("--no-live", str(_warned_log(tmp_path))).stdout.decode()
    seen = [ln for ln in out.splitlines() if "warning seen:" in ln]
    assert len(seen) == 1 and seen[0].rstrip().endswith("[parallel-exceeds-gpus]")


def test_notices_name_a_model_dir_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-model"
    report = _report("--model", missing, NOTES_LOG)
    assert isinstance(report["notices"], list) and all(isinstance(n, str) for n in report["notices"])
    assert any(str(missing) in n for n in report["notices"]), report["notices"]


def _main_with_broken_remedy(monkeypatch, capsys, *argv) -> str:
    """vllm_doctor.cli.main.main in this process, tp-heads-indivisible's remedy raising."""
    from vllm_doctor.cli.main import main
    from vllm_doctor.remedies import parallel

    def broken(ctx):
        raise ZeroDivisionError("simulated remedy bug")

    assert parallel.fix_tensor_parallel                       # the remedy rules/tp-heads-indivisible.toml names
    monkeypatch.setattr(parallel, "fix_tensor_parallel", broken)
    monkeypatch.setenv("NO_COLOR", "1")
    capsys.readouterr()
    assert main(["--no-live", *argv, str(NOTES_LOG)]) == 1
    return capsys.readouterr().out


def test_a_remedy_that_raises_is_an_error_not_a_note(monkeypatch, capsys):
    report = json.loads(_main_with_broken_remedy(monkeypatch, capsys, "--format", "json"))
    top = report["findings"][0]
    assert top["rule"] == "tp-heads-indivisible" and top["fix"] is None
    assert top["errors"] == ["no fix computed (ZeroDivisionError: simulated remedy bug)"]
    assert not any("no fix computed" in n for n in top["notes"])
    assert "no fix computed" not in top["explanation"]


@pytest.mark.parametrize("fmt, marker", [("text", "error: no fix computed"), ("markdown", "**Error:** no fix computed")])
def test_text_and_markdown_show_errors_marked(monkeypatch, capsys, fmt, marker):
    out = _main_with_broken_remedy(monkeypatch, capsys, "--format", fmt)
    assert marker in out and "simulated remedy bug" in out


@pytest.mark.parametrize("fmt, marker", [("text", "note: GPU count unknown"), ("markdown", "**Note:** GPU count unknown")])
def test_text_and_markdown_show_notes(fmt, marker):
    """Notes are details: -vv in the text report (the short one leaves them out); markdown always has them."""
    args = ("-vv",) if fmt == "text" else ()
    assert marker in run_cli("--no-live", "--format", fmt, *args, str(NOTES_LOG)).stdout.decode()
    if fmt == "text":
        assert marker not in run_cli("--no-live", str(NOTES_LOG)).stdout.decode()


# ---- schema 1 stays readable ----------------------------------------------------------------------------
def test_read_report_takes_a_schema_1_document():
    from vllm_doctor.reports.json_report import read_report

    v1 = json.loads(V1_REPORT.read_text(encoding="utf-8"))
    assert v1["schema_version"] == 1 and "notes" not in v1["findings"][0] and "warnings" not in v1
    got = read_report(V1_REPORT.read_text(encoding="utf-8"))
    assert got["schema_version"] == 1 and got["status"] == "problem"
    assert got["warnings"] == [] and got["notices"] == [] and got["facts"] == v1["facts"]
    top, old = got["findings"][0], v1["findings"][0]
    for key in ("rule", "title", "severity", "confidence", "evidence", "facts"):
        assert top[key] == old[key]
    assert top["fix"] == {**old["fix"], "unchanged": False}     # v1 had no `unchanged`: a command was given
    assert "Note:" not in top["explanation"] and old["explanation"].startswith(top["explanation"])
    assert top["notes"][0].startswith("GPU count unknown") and len(top["notes"]) == 4
    assert top["errors"] == []


def test_read_report_maps_a_schema_1_remedy_failure_to_errors():
    from vllm_doctor.reports.json_report import read_report

    doc = {"schema_version": 1, "status": "problem", "facts": {}, "findings": [{
        "rule": "no-gpu", "title": "t", "severity": "error", "confidence": "high", "evidence": [], "facts": {},
        "fix": None, "explanation": "Why.\n\nNote: a caveat\nNote: no fix computed (KeyError: 'x')"}]}
    f = read_report(doc)["findings"][0]
    assert (f["explanation"], f["notes"], f["errors"]) == ("Why.", ["a caveat"], ["no fix computed (KeyError: 'x')"])


def test_read_report_returns_a_schema_2_document_unchanged(tmp_path):
    from vllm_doctor.reports.json_report import read_report

    for log in (NOTES_LOG, _hanging_log(tmp_path)):
        report = _report(log)
        assert read_report(json.dumps(report)) == report


@pytest.mark.parametrize("doc, message", [
    ('{"schema_version": 3, "status": "ok", "findings": []}', "schema_version 3"),
    ('{"kind": "vllm-doctor-facts", "schema_version": 1, "facts": {}}', "not a vllm-doctor report"),
    ("no json", "not JSON"),
])
def test_read_report_refuses_what_it_cannot_read(doc, message):
    from vllm_doctor.reports.json_report import ReportError, read_report

    with pytest.raises(ReportError, match=message):
        read_report(doc)


def test_bench_counts_findings_in_either_schema(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    sys.modules.pop("scan_bench", None)
    import scan_bench

    assert scan_bench.count_findings(V1_REPORT.read_bytes()) == "1"
    v2 = run_cli("--no-live", "--format", "json", str(_warned_log(tmp_path))).stdout
    assert b'"rule":' in v2 and scan_bench.count_findings(v2) == "0"     # a warning is not a finding
