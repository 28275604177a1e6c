"""--anonymize over the corpus: every kind of secret, planted in real logs of every family (failing,
unrecognized and healthy), reaches no report format.

Each log gets what a user's log carries: the launch line of test_anonymize_hostile (every token shape,
URL credentials, e-mail, every IP form, host names, /home, /Users and C:\\Users users) in front, an NCCL
line under a host name, its Python frames under a user's home, and, for every other log, the
`kubectl logs --prefix` pod on each line. The report is rendered in-process (text -vv, JSON, Markdown -vv)
the way `emit` writes it; the control renders it without --anonymize and must show the planted values.
"""
from __future__ import annotations

import io
import re
import tomllib
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT
from test_anonymize_hostile import COMMAND, PLANTED
from vllm_doctor.sources.files import open_log

POD = "vllm-prod-7d9f8c6b5-x2k4q"
ALL = {**PLANTED, "k8s pod": POD}
SITE = re.compile(r"/(?:[\w.+-]+/)*?lib/python3(?:\.\d+)?/(?:site|dist)-packages")
EVERY = 3                      # every 4th log of each folder, and every unrecognized one (the CI budget)


def _cases() -> list[Path]:
    chosen = []
    for cases_file in sorted((ROOT / "logs_corpus").rglob("cases.toml")):
        cases = tomllib.loads(cases_file.read_text())["case"]
        for i, case in enumerate(cases):
            if i % EVERY == 0 or case.get("label", "").startswith("other:"):   # "other": unrecognized is right
                chosen.append(cases_file.parent / case["file"])
    return chosen


CASES = _cases()


def planted(log: Path, pod: bool) -> str:
    stream, _ = open_log(str(log))     # as the doctor decodes it (a PowerShell-written UTF-16 log: real/memory x406)
    with stream:
        lines = stream.read().decode("utf-8", errors="replace").splitlines()
    user = PLANTED["/home user"]
    lines = [SITE.sub(f"/home/{user}/venv/lib/python3.10/site-packages", line) for line in lines]
    lines[1:1] = [f"{PLANTED['nccl prefix host']}:2777:2777 [0] NCCL INFO Bootstrap : Using eth0:{PLANTED['ipv4']}<0>"]
    lines.insert(0, "$ " + COMMAND)
    if pod:
        lines = [f"[pod/{POD}/vllm] {line}" for line in lines]
    return "\n".join(lines) + "\n"


def leaks(text: str) -> list[str]:
    return [name for name, value in ALL.items() if value in text]


@lru_cache(maxsize=1)
def _catalog():
    from vllm_doctor.rules.catalog import load_catalog

    return load_catalog(ROOT / "rules")


def reports(path: Path, anonymize: bool) -> dict[str, str]:
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.reports.emit import emit

    diagnosis = diagnose_paths([str(path)], _catalog(), Options(live=False))
    out = {}
    shared = SimpleNamespace(anonymize=anonymize)      # one masker per run, as in the CLI
    for fmt, verbose in (("text", 2), ("json", 0), ("markdown", 2)):
        args = SimpleNamespace(format=fmt, no_color=True, verbose=verbose, all_runs=True, rules_dir=None,
                               anonymize=anonymize)
        if anonymize and hasattr(shared, "_anonymizer"):
            args._anonymizer = shared._anonymizer
        buffer = io.StringIO()
        emit(diagnosis, args, buffer)
        shared.__dict__.setdefault("_anonymizer", getattr(args, "_anonymizer", None))
        out[fmt] = buffer.getvalue()
    return out


@pytest.fixture(scope="module")
def shown_without_anonymize(tmp_path_factory) -> set[str]:
    """The control: what the reports show of the planted values when nothing masks them."""
    tmp = tmp_path_factory.mktemp("control")
    seen: set[str] = set()
    for i, log in enumerate(CASES[::3]):
        path = tmp / f"{i}.log"
        path.write_text(planted(ROOT / log, pod=i % 2 == 0))
        for text in reports(path, anonymize=False).values():
            seen.update(leaks(text))
    return seen


def test_the_control_shows_every_kind(shown_without_anonymize):
    assert len(CASES) >= 100
    assert set(ALL) - shown_without_anonymize == set()


@pytest.mark.parametrize("log", CASES, ids=[str(c.relative_to(ROOT / "logs_corpus")) for c in CASES])
def test_no_planted_secret_in_any_format(log, tmp_path):
    for pod in (False, True) if CASES.index(log) % 2 else (True,):
        path = tmp_path / "planted.log"
        path.write_text(planted(log, pod))
        for fmt, text in reports(path, anonymize=True).items():
            assert leaks(text) == [], f"{fmt} (pod prefix: {pod}) leaks {leaks(text)}"
