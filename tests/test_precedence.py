"""Each causal precedence names its evidence and real logs where it holds and where it must not
(src/vllm_doctor/diagnosis/precedence.py); docs/precedences.md is generated from that list."""
from __future__ import annotations

import json
import tomllib

import pytest

from conftest import ROOT, run_main
from vllm_doctor.diagnosis.precedence import PRECEDENCES, precedence_markdown

CORPUS = ROOT / "logs_corpus"


def _case(ref: str) -> tuple[dict, str]:
    group, case_id = ref.rsplit("/", 1)
    cases = tomllib.loads((CORPUS / group / "cases.toml").read_text())["case"]
    case = next((c for c in cases if c["id"] == case_id), None)
    assert case is not None, f"{ref}: no such corpus case"
    return case, str(CORPUS / group / (case.get("file") or f"{case_id}.log"))


def _top(path: str) -> str:
    proc = run_main("--format", "json", "--no-live", path)
    assert proc.returncode in (0, 1), proc.stderr.decode()
    findings = json.loads(proc.stdout)["findings"]
    return findings[0]["rule"] if findings else "healthy"


def test_every_precedence_has_evidence_and_both_sides_of_its_pair():
    names = [p.name for p in PRECEDENCES]
    assert len(names) == len(set(names))
    for p in PRECEDENCES:
        assert p.evidence and p.where and p.holds and p.must_not, p.name
        for ref in p.holds + p.must_not:
            _case(ref)


@pytest.mark.parametrize("ref", sorted({r for p in PRECEDENCES for r in p.holds + p.must_not}))
def test_each_side_of_a_pair_gets_its_label(ref):
    case, path = _case(ref)
    top = _top(path)
    label = case["label"]
    if label.startswith("other:"):
        assert top == "unrecognized", (ref, top)
    else:
        assert top == label, (ref, top)


def test_the_precedence_list_in_the_docs_is_generated():
    doc = ROOT / "docs" / "precedences.md"
    assert doc.read_text() == precedence_markdown() + "\n", \
        "docs/precedences.md drifted: regenerate it from diagnosis/precedence.py (precedence_markdown)"


def test_a_precursor_an_error_of_its_own_outranks_is_no_finding():
    """p21: `Error in inspecting model architecture` (a precursor of install-broken) and then vLLM went on to its
    tensor-parallel check, which failed: the precursor explained nothing, so neither `also[install-broken]` nor
    a fix of it; rg15, its inspection failure and nothing outranking it after: the root cause."""
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.rules.catalog import load_catalog

    catalog = load_catalog(ROOT / "rules")
    for ref, rules in (("parallel/p21-v092-red-herring", ["tp-heads-indivisible"]),
                       ("real/platform/rg15", ["install-broken"])):
        d = diagnose_paths([str(_case(ref)[1])], catalog, Options(live=False))
        assert [f.rule for f in d.findings][:len(rules)] == rules and "install-broken" not in [
            f.rule for f in d.findings[len(rules):]], (ref, [f.rule for f in d.findings])
        assert d.combined is None or "install-broken" not in d.combined.rules[1:], ref
