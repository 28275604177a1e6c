"""Plain text reports are written without Rich, and must be byte for byte what Rich's Console wrote:
real logs at every verbosity, and text Rich would change (markup, emoji codes, control codes, tabs, wide
characters in a line cut to the width)."""
from __future__ import annotations

import dataclasses

import pytest

from conftest import ROOT
from vllm_doctor.diagnosis.saved import Options, diagnose_paths
from vllm_doctor.reports import text as T

LOGS = sorted((ROOT / "logs_corpus").rglob("*.log"))[::12]    # every family, a few dozen logs
TRICKY = [
    "[bold]markup[/bold] in a [red]message",
    "an emoji code :warning: and :thumbs_up: and a time 12:30:45",
    "a\ttab, a bell\x07, a carriage return\r and a form feed\x0c",
    "wide 日本語の文字 and é accents " * 8,
    "x" * 300,
    "a message printed over\ntwo lines " + "y" * 200,
]


def _rich_only(monkeypatch) -> None:
    """Every plain line through Rich's Console, as before the plain writer."""
    monkeypatch.setattr(T, "_PlainOut", lambda buffer: T._RichOut(T._console(buffer, False)))


def _both(monkeypatch, diagnosis, **kwargs) -> tuple[str, str]:
    plain = T.render_text(diagnosis, color=False, **kwargs)
    with monkeypatch.context() as m:
        _rich_only(m)
        rich = T.render_text(diagnosis, color=False, **kwargs)
    return plain, rich


@pytest.fixture(scope="module")
def diagnoses(catalog):
    out = []
    for path in LOGS:
        d = diagnose_paths([str(path)], catalog, Options(live=False))
        out.append((path.name, d))
    return out


def test_real_logs_read_the_same(monkeypatch, diagnoses):
    assert len(diagnoses) >= 20
    for name, d in diagnoses:
        for verbose in (0, 1, 2):
            for all_runs in (False, True):
                plain, rich = _both(monkeypatch, d, verbose=verbose, all_runs=all_runs, width=80)
                assert plain == rich, (name, verbose, all_runs)


def _tricky(d, text: str):
    """The diagnosis with `text` in every place the report shows log or rule text."""
    findings = []
    for f in d.findings:
        evidence = [dataclasses.replace(line, message=text + " " + line.message) for line in f.evidence]
        findings.append(dataclasses.replace(f, title=text, evidence=evidence, notes=[text, *f.notes]))
    return dataclasses.replace(d, findings=findings, notices=[text, f"{d.sources[0]}: {text}"],
                               run_label=text if d.earlier else d.run_label)


@pytest.mark.parametrize("text", TRICKY, ids=["markup", "emoji", "control", "wide", "long", "newline"])
def test_text_rich_would_change_reads_the_same(monkeypatch, diagnoses, text):
    for name, d in diagnoses[:8]:
        for verbose in (0, 2):
            for width in (40, 100):
                plain, rich = _both(monkeypatch, _tricky(d, text), verbose=verbose, width=width)
                assert plain == rich, (name, verbose, width)


def test_an_ordinary_report_makes_no_rich_console(monkeypatch, catalog):
    """The point of the plain writer: the README's report is written without a Rich Console at all."""
    def no_console(*args, **kwargs):
        raise AssertionError("a Rich Console was made for a plain report")

    monkeypatch.setattr(T, "_console", no_console)
    d = diagnose_paths([str(ROOT / "logs_corpus/parallel/vicuna13b-tp3.log")], catalog, Options(live=False))
    assert T.render_text(d, color=False, width=80).startswith("error[tp-heads-indivisible]: ")


def test_colour_still_goes_through_rich(diagnoses):
    name, d = next((n, d) for n, d in diagnoses if d.findings)
    coloured = T.render_text(d, color=True, width=80)
    assert "\x1b[" in coloured
