"""On every corpus case the TUI shows the same root cause and corrected command as the reports."""
import asyncio
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


def test_every_corpus_folder_has_cases():
    logs = [param.values[2] for param in CASES]
    for folder in FOLDERS:
        assert any(log.is_relative_to(folder) for log in logs), f"no case with a log under {folder}"


@pytest.mark.parametrize("folder, case, log", CASES)
def test_tui_agrees_with_the_reports(catalog, folder, case, log):
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.reports.json_report import report_dict
    from vllm_doctor.reports.text import render_text

    options = Options(live=False, command=case.get("cmd"),
                      model=str(ROOT / "tests/fixtures/models" / case["model"]) if case.get("model") else None,
                      snapshot=str(folder / case["snapshot"]) if case.get("snapshot") else None)
    diagnosis = diagnose_paths([str(log)], catalog, options)
    expected = report_dict(diagnosis)
    text = render_text(diagnosis, color=False, width=400)     # no prose wrapping: compare whole lines
    app = make_app([log], catalog, options=options)

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
            assert f"error[{top['rule']}]: {top['title']}" in text or f"warning[{top['rule']}]: {top['title']}" in text
            command = (top["fix"] or {}).get("command")
            fix = app.pane_text("fix", width=400)
            if command and top["fix"].get("form") == "edit":     # compose, pod spec, LLM(...): the edit
                assert f"edit: {top['fix']['instruction']}" in fix
            elif command:
                assert f"run: {command}" in fix          # the same corrected command as JSON and text
                assert command in text.replace("\n        ", " ") or command.split()[0] in text
                await pilot.press("y")
                assert app.clipboard.endswith(command)
            else:
                assert "run:" not in fix

    asyncio.run(go())
