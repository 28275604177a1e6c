"""The whole pipeline over every case of logs_corpus/: the right rule, evidence and a valid fix.

Expectations beside the line: a case labelled with a rule names its decisive log line in cases.toml,
`root = "<exact substring of that line>"` (the logs stay byte-for-byte as they are). The top finding must
cite that line, and every log line holding the substring must be one it cites (verbatim repeats of a
cited line aside). `root_not_cited = "why"` marks a known gap: the root check then xfails (and fails
once the finding does cite the line, so the marker gets dropped).

Real-thread cases (logs_corpus/real/) may also say `visible = false` (the paste lacks the decisive line:
the thread's cause or `unrecognized` is right), `also = [...]` (rules the log alone cannot tell apart) and
`known_miss = "why"` (a strict xfail: the cause is only in the thread).

Expected fix text: logs_corpus/<family>/expected/<id>.fix holds the top finding's rule, fix summary,
command, env and alternatives (paths under the checkout shown as <repo>), compared exactly. After an
intended change, re-bless them from the current output instead of comparing:
    UPDATE_CORPUS=1 python3 -m pytest -q tests/test_corpus.py
(each rewritten file is reported as a "re-blessed" warning; review the diff before committing).
"""
import difflib
import json
import os
import shlex
import tomllib
import warnings
from pathlib import Path

import pytest

from conftest import CORPUS_DEV, ROOT, run_cli, run_main
from vllm_doctor.sources.files import open_log
from vllm_doctor.sources.lines import clean_text, parse_line

CORPUS = ROOT / "logs_corpus"
UPDATE_CORPUS = os.environ.get("UPDATE_CORPUS", "") not in ("", "0")


def _cases():
    for cases_file in sorted(CORPUS.rglob("cases.toml")):
        name = cases_file.parent.relative_to(CORPUS).as_posix()
        for case in tomllib.loads(cases_file.read_text())["case"]:
            # a real log whose cause only its thread knows (`known_miss = "why"`): listed, and strict, so
            # the marker goes once the doctor gets it right
            marks = [pytest.mark.xfail(reason=case["known_miss"], strict=True)] if case.get("known_miss") else []
            yield pytest.param(cases_file.parent, case, id=f"{name}/{case['id']}", marks=marks)


CASES = list(_cases())


def _args(folder: Path, case: dict) -> list[str]:
    args = ["--format", "json", "--no-live"]
    if case.get("model"):
        args += ["--model", str(ROOT / "tests/fixtures/models" / case["model"])]
    if case.get("snapshot"):
        args += ["--facts", str(folder / case["snapshot"])]
    if case.get("cmd"):
        args += ["--cmd", case["cmd"]]
    return args + [str(_log(folder, case))]


def _log(folder: Path, case: dict) -> Path:
    return folder / (case.get("file") or f"{case['id']}.log")


def _is_rule(label: str) -> bool:
    return label != "healthy" and not label.startswith("other:")


@pytest.mark.parametrize("folder, case", CASES)
def test_case(folder, case):
    proc = run_main(*_args(folder, case))
    assert proc.returncode in (0, 1), proc.stderr.decode()
    report = json.loads(proc.stdout)
    expected, got = _expected_fix(folder, case), _fix_text(folder, case, report)
    if UPDATE_CORPUS:
        _rebless(expected, got)
    _check_report(case, proc, report)
    if not UPDATE_CORPUS:
        _compare_fix(expected, got)
    if _is_rule(case["label"]) and case.get("visible", True) and report["findings"][0]["rule"] == case["label"]:
        _check_root(_log(folder, case), case, report["findings"][0])


def _expected_fix(folder: Path, case: dict) -> Path:
    return folder / "expected" / f"{case['id']}.fix"


def _fix_text(folder: Path, case: dict, report: dict) -> str:
    """The top finding's fix in a stable plain-text layout; a missing finding or fix says so."""
    name = f"{folder.relative_to(CORPUS).as_posix()}/{case['id']}"
    out = [f"# {name} ({_log(folder, case).name}): the top finding's fix, compared exactly by tests/test_corpus.py.",
           "# Re-bless after an intended change: UPDATE_CORPUS=1 python3 -m pytest -q tests/test_corpus.py"]
    top = report["findings"][0] if report["findings"] else None
    fix = (top or {}).get("fix")
    out.append(f"rule: {top['rule'] if top else '(no finding)'}")
    if not fix:
        out.append("fix: (none)")
    else:
        out += _labelled("summary", fix.get("summary"))
        out.append(f"form: {fix.get('form')}")
        out += ["command:", *(["    (unchanged: rerun the command as it was)"] if fix.get("unchanged")
                              else _indented(fix.get("command")))]
        if fix.get("form") in ("edit", "flags"):
            out += [f"changes: {'; '.join(fix.get('changes') or [])}", *_labelled("instruction", fix.get("instruction"))]
        env = fix.get("env") or {}
        out += ["env:", *(f"    {key}={value}" for key, value in env.items())] if env else ["env: (none)"]
        alternatives = fix.get("alternatives") or []
        if not alternatives:
            out.append("alternatives: (none)")
        for i, alt in enumerate(alternatives, 1):
            out += _labelled(f"alternative {i}", alt.get("summary"))
            out += _indented(alt.get("command"))
    return _mask("\n".join(out) + "\n")


def _labelled(label: str, text: str | None) -> list[str]:
    first, *rest = (text or "(none)").split("\n")
    return [f"{label}: {first}", *(f"    {line}" for line in rest)]


def _indented(text: str | None) -> list[str]:
    return [f"    {line}" for line in (text or "(none)").split("\n")]


def _mask(text: str) -> str:
    """No absolute paths of this checkout (the log's folder, fixtures) in the expected text."""
    for root in sorted({str(ROOT), str(ROOT.resolve())}, key=len, reverse=True):
        text = text.replace(root, "<repo>")
    return text


def _rebless(expected: Path, got: str) -> None:
    if expected.exists() and expected.read_text() == got:
        return
    expected.parent.mkdir(exist_ok=True)
    expected.write_text(got)
    warnings.warn(f"re-blessed {expected.relative_to(ROOT)}", UserWarning, stacklevel=2)


def _compare_fix(expected: Path, got: str) -> None:
    rel = expected.relative_to(ROOT)
    assert expected.exists(), f"{rel} is missing: UPDATE_CORPUS=1 python3 -m pytest -q tests/test_corpus.py writes it"
    want = expected.read_text()
    if want != got:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(rel), "current output"))
        pytest.fail(f"the fix differs from {rel} (re-bless with UPDATE_CORPUS=1 if intended):\n{diff}", pytrace=False)


def test_no_stale_expected_fix_files():
    """Every expected/<id>.fix belongs to a case; re-blessing removes the ones that no longer do."""
    known = {_expected_fix(*param.values) for param in CASES}
    stale = sorted(path for path in CORPUS.rglob("expected/*.fix") if path not in known)
    if UPDATE_CORPUS:
        for path in stale:
            path.unlink()
            warnings.warn(f"re-blessed: removed {path.relative_to(ROOT)} (no such case)", UserWarning, stacklevel=1)
        return
    assert not stale, f"expected fixes without a case: {[str(path.relative_to(ROOT)) for path in stale]}"


def _check_report(case: dict, proc, report: dict) -> None:
    findings = report["findings"]
    expect = case.get("expect", {})
    if "exit" in expect:          # an "other:" failure must still not read as an all-clear
        assert proc.returncode == expect["exit"], [f["rule"] for f in findings]
    if "outcome" in expect:       # how the run ended (diagnosis/outcome.py)
        assert report.get("outcome") == expect["outcome"], report.get("outcome")
    for text in expect.get("notice_contains", []):
        assert any(text in n for n in report["notices"]), (text, report["notices"])
    if case["label"] == "healthy":
        assert findings == [] and report["status"] == "ok" and proc.returncode == 0
        return
    if case["label"].startswith("other:"):
        # a failure outside the catalog: reported as unrecognized (or nothing), never a confident cause
        assert not findings or findings[0]["rule"] == "unrecognized", [f["rule"] for f in findings]
        return
    if case.get("visible", True) is False:
        # a fragment without its decisive line: the thread's cause, or no confident cause at all
        assert not findings or findings[0]["rule"] in (case["label"], "unrecognized"), [f["rule"] for f in findings]
        return
    assert proc.returncode == 1
    top = findings[0]
    assert not top.get("errors"), top["errors"]      # a remedy that raised is a bug, not a missing fix
    # `also`: rules the log alone cannot tell from the label (the case says why)
    assert top["rule"] in (case["label"], *case.get("also", [])), [f["rule"] for f in findings]
    if top["rule"] != case["label"]:
        return
    assert top["evidence"], "a finding shows the line it stands on"
    expect = case.get("expect", {})
    fix = top["fix"] or {}
    command = fix.get("command") or ""
    if "unchanged" in expect:   # the fix is an action outside the command: no command handed back
        assert fix.get("unchanged") is expect["unchanged"] and (command == "") is expect["unchanged"], fix
    for text in expect.get("fix_contains", []):
        assert text in command or text in fix.get("summary", ""), (text, command)
    for text in expect.get("fix_not_contains", []):
        assert text not in command, (text, command)
    if "fix_form" in expect:      # how the fix reaches the user: command | rebuilt | edit | flags | outside
        assert fix.get("form") == expect["fix_form"], (fix.get("form"), fix.get("instruction"))
    for text in expect.get("instruction_contains", []):
        assert text in (fix.get("instruction") or ""), (text, fix.get("instruction"))
    for text in expect.get("evidence_contains", []):
        assert any(text in e["text"] for e in top["evidence"]), text
    for key, value in expect.get("facts", {}).items():
        got = top["facts"].get(key, report["facts"].get(key, {}).get("value") if isinstance(
            report["facts"].get(key), dict) else None)
        assert got == value, (key, got, value)
    if expect.get("first_node"):
        # a multi-node log: the node where the root cause was printed first, not the last rank to notice
        assert (report.get("nodes") or {}).get("failed_first") == expect["first_node"], report.get("nodes")
    if expect.get("phase"):
        assert top["rule"].endswith(expect["phase"]) or top["facts"].get("phase") == expect["phase"]
    facts = case.get("facts", {})
    if case["label"] == "tp-heads-indivisible" and command:
        _check_tp(command, facts)


def _log_lines(log: Path) -> list[str]:
    """The log's lines as the doctor reads them (sources.lines.clean_text: colour codes, however written, and
    carriage returns resolved)."""
    stream, _ = open_log(str(log))     # as the doctor decodes it (a PowerShell-written UTF-16 log: real/memory x406)
    with stream:
        raw = stream.read()
    return [clean_text(line) for line in raw.split(b"\n")]


def _check_root(log: Path, case: dict, top: dict) -> None:
    """The finding's evidence really is in the log, and it cites the case's decisive line (`root`)."""
    root = case.get("root")
    assert root, "a case labelled with a rule names its decisive log line: root = \"<substring of it>\""
    lines = _log_lines(log)
    cited = [e for e in top["evidence"] if (ROOT / e["source"]).resolve() == log.resolve()]
    for e in cited:
        n = e["line"]
        held = lines[n - 1] if 1 <= n <= len(lines) else None
        assert e["text"] and held is not None and e["text"] in held, \
            f"evidence cites {log.name}:{n} as {e['text']!r}, the file has {held!r} there"
    on_root = {e["line"] for e in cited if root in e["text"]}
    # a repeat of a cited line (the same message, another timestamp or rank prefix) need not be cited again
    repeats = {parse_line(lines[n - 1]).message for n in on_root}
    holding = {n for n, line in enumerate(lines, 1)
               if root in line and (n in on_root or parse_line(line).message not in repeats)}
    try:
        assert on_root, f"no evidence line holds root {root!r}; it cites {[(e['line'], e['text'][:80]) for e in cited]}"
        assert holding == on_root, f"root {root!r} is on log lines {sorted(holding)}, evidence cites {sorted(on_root)}"
    except AssertionError:
        if case.get("root_not_cited"):
            pytest.xfail(f"known gap: {case['root_not_cited']}")
        raise
    assert not case.get("root_not_cited"), "the finding now cites the root line: drop root_not_cited"


def _check_tp(command: str, facts: dict) -> None:
    """The corrected sizes are ones vLLM accepts for that model and GPU count."""
    words = shlex.split(command.replace("\\\n", " "))
    tp = pp = None
    for i, word in enumerate(words):
        key, _, value = word.partition("=")
        value = value or (words[i + 1] if i + 1 < len(words) else "")
        if key in ("--tensor-parallel-size", "-tp"):
            tp = int(value)
        if key in ("--pipeline-parallel-size", "-pp"):
            pp = int(value)
    assert tp is not None, command
    heads, kv = facts.get("attention_heads"), facts.get("kv_heads")
    if heads:
        assert heads % tp == 0
    if kv:
        assert kv % tp == 0 or tp % kv == 0
    if facts.get("gpus"):
        assert tp * (pp or 1) <= facts["gpus"]


def test_every_rule_has_corpus_cases(catalog):
    labels = {case["label"] for f in CORPUS.rglob("cases.toml") for case in tomllib.loads(f.read_text())["case"]}
    # a running server's rules (`health`) have real /metrics bodies, not logs: tests/test_health.py serves them
    missing = sorted({r.id for r in catalog.rules.values() if r.family != "server"} - labels)
    assert not missing, f"rules without a corpus case: {missing}"


DEV_CASES = tomllib.loads((CORPUS_DEV / "cases.toml").read_text())["case"]   # missing: a collection error


@pytest.mark.parametrize("case", DEV_CASES, ids=lambda case: case["id"])
def test_shared_dev_corpus(case):
    """The real vLLM 0.32 logs the team was given (copies in tests/data/corpus-dev/, see its README.md)."""
    proc = run_cli("--format", "json", "--no-live", str(CORPUS_DEV / case["file"]))
    report = json.loads(proc.stdout)
    top = report["findings"][0]["rule"] if report["findings"] else "healthy"
    assert top == case["label"], case["id"]


def test_shared_dev_corpus_is_complete():
    assert len(DEV_CASES) == 8 and all((CORPUS_DEV / case["file"]).is_file() for case in DEV_CASES)
