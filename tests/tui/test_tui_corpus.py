"""On every corpus case the TUI shows the same root cause and corrected command as the reports.

The panes are built by `tui.view` from the diagnosis; the app only puts them into widgets. So every case
checks the views against the reports (cheap), and one case of each folder per fix shape (healthy, no fix,
a command to run, an edit, a flag change, a rerun) also runs the whole app and reads its widgets, which
is where the wiring could go wrong. Mounting the app for every case cost a minute of the suite for the
same assertions."""
import asyncio
import functools
import io
import tomllib

import pytest

from tui_helpers import ROOT, make_app, settle

FOLDERS = [ROOT / "logs_corpus", ROOT / "tests" / "data" / "corpus-dev"]   # the latter: copies of the real 0.32 logs


def _cases():
    for base in FOLDERS:
        files = [base / "cases.toml"] if (base / "cases.toml").exists() else sorted(base.glob("*/cases.toml"))
        for cases_file in files:
            for case in tomllib.loads(cases_file.read_text()).get("case", []):
                log = cases_file.parent / (case.get("file") or f"{case['id']}.log")
                if log.exists():
                    yield pytest.param(cases_file.parent, case, log, id=f"{cases_file.parent.name}/{case['id']}")


CASES = list(_cases())


def _options(folder, case):
    from vllm_doctor.diagnosis.saved import Options

    return Options(live=False, command=case.get("cmd"),
                   model=str(ROOT / "tests/fixtures/models" / case["model"]) if case.get("model") else None,
                   snapshot=str(folder / case["snapshot"]) if case.get("snapshot") else None)


def _reports(catalog, folder, case, log):
    """The diagnosis, its JSON report and its text report (no prose wrapping: compare whole lines)."""
    from vllm_doctor.diagnosis.saved import diagnose_paths
    from vllm_doctor.reports.json_report import report_dict
    from vllm_doctor.reports.text import render_text

    diagnosis = diagnose_paths([str(log)], catalog, _options(folder, case))
    return diagnosis, report_dict(diagnosis), render_text(diagnosis, color=False, width=400)


def _shape(top: dict | None) -> str:
    """What the Fix pane holds for a report's top finding."""
    if top is None:
        return "healthy"
    fix = top["fix"] or {}
    if fix.get("command"):
        return "edit" if fix.get("form") == "edit" else "run"
    return fix.get("form") or "none"


def _plain(renderable) -> str:
    from rich.console import Console

    console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _check_fix_pane(top: dict, text: str, fix: str, copied: str | None) -> None:
    """The Fix pane says what the reports say: the edit, or the same corrected command (which `y` copies)."""
    command = (top["fix"] or {}).get("command")
    if command and top["fix"].get("form") == "edit":     # compose, pod spec, LLM(...): the edit
        assert f"edit: {top['fix']['instruction']}" in fix
    elif command:
        assert f"run: {command}" in fix          # the same corrected command as JSON and text
        assert command in text.replace("\n        ", " ") or command.split()[0] in text
        assert copied is not None and copied.endswith(command)
    else:
        assert "run:" not in fix


def test_every_corpus_folder_has_cases():
    logs = [param.values[2] for param in CASES]
    for folder in FOLDERS:
        assert any(log.is_relative_to(folder) for log in logs), f"no case with a log under {folder}"


@pytest.mark.parametrize("folder, case, log", CASES)
def test_tui_views_agree_with_the_reports(catalog, folder, case, log):
    from vllm_doctor.tui import view

    diagnosis, expected, text = _reports(catalog, folder, case, log)
    if not expected["findings"]:
        assert not diagnosis.findings
        return
    top, finding = expected["findings"][0], diagnosis.findings[0]
    assert finding.rule == top["rule"]
    label = view.finding_label(finding, 0).plain
    assert label.startswith("ROOT") and top["title"] in label
    assert f"error[{top['rule']}]: {top['title']}" in text or f"warning[{top['rule']}]: {top['title']}" in text
    fix = _plain(view.fix_renderable(finding, diagnosis.facts.get("launch.command")))
    _check_fix_pane(top, text, fix, view.fix_command_text(finding))


@functools.lru_cache(maxsize=1)
def _mounted_cases() -> tuple[list, frozenset]:
    """One case per folder and fix shape, the first in corpus order; and the shapes they cover."""
    from vllm_doctor.rules.catalog import load_catalog

    catalog = load_catalog(ROOT / "rules")
    seen, picked = set(), []
    for param in CASES:
        folder, case, log = param.values
        _, expected, _ = _reports(catalog, folder, case, log)
        key = (folder, _shape(expected["findings"][0] if expected["findings"] else None))
        if key not in seen:
            seen.add(key)
            picked.append(param)
    return picked, frozenset(shape for _, shape in seen)


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_the_app_shows_what_the_views_render":
        metafunc.parametrize("folder, case, log", _mounted_cases()[0])


def test_the_mounted_cases_cover_every_fix_shape():
    shapes = _mounted_cases()[1]
    assert {"healthy", "none", "run", "edit"} <= shapes, shapes


def test_the_app_shows_what_the_views_render(catalog, folder, case, log):
    _, expected, text = _reports(catalog, folder, case, log)
    app = make_app([log], catalog, options=_options(folder, case))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            from textual.widgets import OptionList

            first = str(app.query_one("#findings", OptionList).get_option_at_index(0).prompt)
            if not expected["findings"]:
                assert "no problem found" in first and "HEALTHY" in app.query_one("#header").content.plain
                return
            top = expected["findings"][0]
            assert app.findings[0].rule == top["rule"]
            assert first.startswith("ROOT") and top["title"] in first
            copied = None
            if (top["fix"] or {}).get("command") and top["fix"].get("form") != "edit":
                await pilot.press("y")
                copied = app.clipboard
            _check_fix_pane(top, text, app.pane_text("fix", width=400), copied)

    asyncio.run(go())
