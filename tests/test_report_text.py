"""The short report: snapshots at 80 and 120 columns (and JSON) for the README case and one real log per
family, the rustc shape, the line budget, verbosity levels and width handling.

Re-bless after an intended change: UPDATE_SNAPSHOTS=1 python3 -m pytest -q tests/test_report_text.py
"""
from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "report-snapshots"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS", "") not in ("", "0")

# (name, log, extra args): real logs from logs_corpus, one per family, and the README's example
CASES = [
    ("readme-tp3", "logs_corpus/parallel/vicuna13b-tp3.log", []),
    ("memory-kv", "logs_corpus/real/memory/rm01-kv-29k-rtx3090.log", []),
    ("nccl-shm", "logs_corpus/real/nccl/rn05-v1-tp-shm-last-error.log", []),
    ("platform-driver", "logs_corpus/real/platform/rg08-compose-ray-804-phi3.log", []),
    ("config-llm-script", "logs_corpus/config/c13-llm-dtype-fp16-pydantic.log", []),
    ("install-broken", "logs_corpus/real/config/rc23-registry-subprocess-no-transformers.log", []),
    ("startup-stalled", "logs_corpus/real/nccl/rn09-glm45-waiting-engine-proc.log", []),
]


def report(log: str, *args: str, columns: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "vllm_doctor", "--no-live", *args, str(ROOT / log)],
                          capture_output=True, env=env, cwd=ROOT, timeout=60)


def _masked(text: str) -> str:
    return text.replace(str(ROOT) + "/", "")


def _check_snapshot(name: str, got: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        SNAPSHOTS.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        return
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: UPDATE_SNAPSHOTS=1 writes it"
    want = path.read_text()
    if want != got:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), name, "now"))
        pytest.fail(f"the report differs from {name} (UPDATE_SNAPSHOTS=1 if intended):\n{diff}", pytrace=False)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name, log, args", CASES, ids=[c[0] for c in CASES])
def test_text_snapshot(name, log, args, columns):
    proc = report(log, *args, columns=columns)
    assert proc.returncode == 1, proc.stderr.decode()
    text = _masked(proc.stdout.decode())
    _check_snapshot(f"{name}.{columns}.txt", text)
    lines = text.splitlines()
    assert lines[0].startswith("error[") or lines[0].startswith("warning["), lines[0]
    assert f"see: vllm-doctor explain {lines[0].split('[', 1)[1].split(']', 1)[0]}" in text
    for line in lines:        # prose wraps to the width; only commands, evidence and `edit:` lines may not
        if len(line) > columns:
            assert line.lstrip().startswith(("run: ", "was: ", "edit: ", "change: ")), line


@pytest.mark.parametrize("name, log, args", CASES, ids=[c[0] for c in CASES])
def test_json_snapshot(name, log, args):
    proc = report(log, "--format", "json", *args)
    doc = json.loads(proc.stdout)
    keep = {"status": doc["status"], "combined_fix": doc["combined_fix"],
            "findings": [{"rule": f["rule"], "fix": f["fix"]} for f in doc["findings"]]}
    _check_snapshot(f"{name}.json", _masked(json.dumps(keep, indent=2, ensure_ascii=False) + "\n"))


@pytest.mark.parametrize("name, log, args", CASES, ids=[c[0] for c in CASES])
def test_single_cause_report_fits_twelve_lines_at_80_columns(name, log, args):
    assert len(report(log, *args).stdout.decode().splitlines()) <= 12


def test_readme_example_block_is_the_real_output():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```\nerror[tp-heads-indivisible]", 1)[1].split("```", 1)[0]
    shown = "error[tp-heads-indivisible]" + block
    assert shown == _masked(report("logs_corpus/parallel/vicuna13b-tp3.log", columns=100).stdout.decode())


def test_verbosity_adds_explanation_facts_then_notes():
    log = "logs_corpus/parallel/vicuna13b-tp3.log"
    short, v, vv = (report(log, *a, columns=100).stdout.decode() for a in ([], ["-v"], ["-vv"]))
    assert "Tensor parallelism gives every GPU" not in short and "Tensor parallelism gives every GPU" in v
    assert "Facts used" not in short and "Facts used" in v
    assert "note:" not in v and "note: GPU count unknown" in vv
    assert short.count("run: ") == 1 and v.count("run: ") == 3          # -v: every alternative's own command
    assert "(cost: 3 pipeline stages: each token passes the stages in turn" in " ".join(v.split())


def test_the_corrected_command_is_never_wrapped_even_past_the_width():
    out = report("logs_corpus/parallel/vicuna13b-tp3.log", "--cmd",
                 "CUDA_VISIBLE_DEVICES=0,1,2 HF_HOME=/srv/huggingface-cache python3 -m vllm.entrypoints.openai.api_server "
                 "--model lmsys/vicuna-13b-v1.5 --tensor-parallel-size 3 --max-model-len 4096 --port 8011",
                 columns=60).stdout.decode()
    run = [ln for ln in out.splitlines() if ln.lstrip().startswith("run: ")]
    assert len(run) == 1 and run[0].rstrip().endswith("--tensor-parallel-size 2 --max-model-len 4096 --port 8011")
    assert len(run[0]) > 60


def test_evidence_is_cut_with_an_ellipsis_at_a_character_boundary(tmp_path):
    """A wide-character message (a real CJK exception text shape) is cut by cells, never mid-character."""
    src = (ROOT / "logs_corpus/parallel/vicuna13b-tp3.log").read_text().splitlines(True)
    at = next(i for i, ln in enumerate(src) if "must be divisible by tensor parallel size" in ln)
    src[at] = src[at].rstrip("\n") + " 注意力头数必须能被张量并行数整除" * 6 + "\n"     # written by us: a variant
    log = tmp_path / "wide.log"
    log.write_text("".join(src))
    out = report(str(log), columns=80).stdout.decode()
    evidence = next(ln for ln in out.splitlines() if ln.startswith("  | "))
    assert evidence.endswith("…")
    from rich.cells import cell_len

    assert cell_len(evidence) <= 80


def test_this_fixes_names_only_the_findings_whose_fix_is_in_the_command():
    """A real log (vLLM 0.9.2): the TP fix is in `run:`; the model inspection error before it is a precursor the
    TP error outranks (vLLM went on past it): no finding of its own, never something the command fixes."""
    log = "logs_corpus/parallel/v092-red-herring-then-heads.log"
    text = report(log).stdout.decode()
    assert "install-broken" not in text and "run: vllm serve" in text
    assert "this fixes" not in text
    doc = json.loads(report(log, "--format", "json").stdout)
    assert doc["combined_fix"]["rules"] == ["tp-heads-indivisible"]


def test_the_evidence_window_keeps_what_the_rule_matched():
    """Cut to the width, the evidence line keeps the span the rule matched (issue: a path prefix kept and the
    message lost), marks what it left out with `…`, and says where the span starts."""
    from vllm_doctor.reports.brief import evidence_window

    path = "/usr/local/lib/python3.12/site-packages/torch/cuda/__init__.py:129: UserWarning: "
    mark = "The NVIDIA driver on your system is too old (found version 11080)"
    for tail in ("", ". Please update your GPU driver by downloading and installing a new version from the URL"):
        text = path + mark + tail
        for width in range(len(mark) + 2, len(text) + 3):
            shown, at = evidence_window(text, mark, width)
            assert len(shown) <= width and mark in shown and at == len(path), (width, shown)
            assert shown.startswith("…") == (text.find(mark) + len(mark) > width - 1 and len(text) > width)
            assert shown.endswith("…") == (not text.endswith(shown.strip("…"))), (width, shown)
        shown, _ = evidence_window(text, mark, 30)         # narrower than the span: its start, cut
        assert len(shown) == 30 and shown.startswith("…The NVIDIA driver") and shown.endswith("…")
    # a span too wide behind a short start keeps the line's start; no span: the start, cut
    assert evidence_window("Value error, " + mark * 2, mark * 2, 60)[0].startswith("Value error, The")
    assert evidence_window(text, "", 40) == (text[:39] + "…", None)
    assert evidence_window("short", "short", 40) == ("short", 0)


def test_the_vllm_pytorch_lists_under_its_host_pid_is_never_the_one_to_stop():
    """rm22: in a container PyTorch lists vLLM itself ("Process 1956684 has 70.13 GiB" beside "69.53 GiB is
    allocated by PyTorch"): that PID is named as this vLLM, only the other is to be freed, and the flag change
    offered otherwise comes with its own command, not "rerun unchanged"."""
    out = report("logs_corpus/real/memory/rm22-other-streaming-quant-peak-load.log", columns=100).stdout.decode()
    help_text = out.split("help: ", 1)[1].split("\n  then:", 1)[0]
    assert "PID 1952521 holds 8.96 GiB" in help_text and "1956684" not in help_text, out
    assert "PID 1956684 holds 70.13 GiB, about the 69.53 GiB PyTorch allocated" in " ".join(out.split())
    assert "that is this vLLM" in " ".join(out.split())
    assert "then: rerun your command, unchanged, once that is done" in out
    assert "otherwise change: --quantization fp8" in out


@pytest.mark.parametrize("name, log, args", CASES, ids=[c[0] for c in CASES])
def test_at_80_columns_the_evidence_shows_what_matched_and_because_has_this_cases_numbers(name, log, args):
    """One log per family: the evidence row holds (the start of) the text the rule matched, and `because:` says
    something of this case with a number in it (not the rule's general prose)."""
    proc = report(log, "--format", "json", *args)
    top = json.loads(proc.stdout)["findings"][0]
    text = report(log, *args).stdout.decode()
    lines = text.splitlines()
    evidence = next(ln for ln in lines if ln.startswith("  | "))[4:].strip("…")
    line_text = top["evidence"][0]["text"]
    assert evidence in line_text, (evidence, line_text)
    at = next(ln for ln in lines if ln.startswith("  --> ")).split()[1].split(":")
    column = int(at[2]) if len(at) > 2 else None
    assert column is not None and line_text[column - 1:column - 1 + 12] in evidence, (name, at, evidence)
    because = [ln for ln in lines if ln.startswith("  = because: ")]
    assert because and any(c.isdigit() for c in because[0]), (name, because)
