"""The triage app driven headless with Pilot: what a user sees and what each key does."""
import asyncio
import os
import sys

from rich.text import Text

from tui_helpers import DATA, make_app, settle, until
from vllm_doctor.findings import Diagnosis, Finding
from vllm_doctor.facts import Facts
from vllm_doctor.sources.lines import parse_line
from vllm_doctor.tui import view

TP_LOG = DATA / "tp3-40heads.log"
HEALTHY_LOG = DATA / "healthy.log"


def run(coro):
    return asyncio.run(coro)


def option_texts(app):
    from textual.widgets import OptionList

    ol = app.query_one("#findings", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


def report(catalog, path):
    """The JSON report of the same log: what the TUI must agree with."""
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.reports.json_report import report_dict

    return report_dict(diagnose_paths([str(path)], catalog, Options(live=False)))


def test_root_cause_fix_copy_and_save(catalog, tmp_path):
    app = make_app([TP_LOG], catalog)
    expected = report(catalog, TP_LOG)["findings"][0]["fix"]["command"]
    assert expected and "--tensor-parallel-size 3" not in expected

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert option_texts(app)[0].startswith("ROOT")
            assert "Attention heads not divisible" in option_texts(app)[0]
            assert app.active_tab == "fix"
            fix = app.pane_text("fix")
            assert f"run: {expected}" in fix
            assert "was: vllm serve /models/tiny40 --tensor-parallel-size 3" in fix
            assert "cost:" in fix                      # alternatives carry their cost
            await pilot.press("y")
            assert app.clipboard == expected
            target = tmp_path / "fix.sh"
            await pilot.press("s")
            from textual.widgets import Input

            prompt = app.screen.query_one("#prompt-input", Input)
            prompt.value = str(target)
            await pilot.press("enter")
            await pilot.pause()
            assert target.read_text().splitlines()[-1] == expected
            assert "tp-heads-indivisible" in target.read_text()

    run(go())


def test_tabs_cause_evidence_facts(catalog):
    app = make_app([TP_LOG], catalog)

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(app, pilot)
            await pilot.press("1")
            assert app.active_tab == "cause"
            cause = app.pane_text("cause")
            assert "num_attention_heads % tensor_parallel_size" in cause
            assert "Arithmetic" in cause and "40 % 3 = 1" in cause
            await pilot.press("3")
            assert app.active_tab == "evidence"
            evidence = app.pane_text("evidence")
            assert "evidence 1/1" in evidence and ":53" in evidence
            assert "53▶" in evidence and "must be divisible by tensor parallel size" in evidence
            assert "52 " in evidence                    # the log around the evidence line
            await pilot.press("4")
            facts = app.pane_text("facts")
            assert "vllm.version" in facts and "0.32.0" in facts and "log" in facts
            await pilot.press("o")                     # open the evidence in the full log
            assert app.active_tab == "log"
            from vllm_doctor.tui.logview import LogView

            lv = app.query_one(LogView)
            assert lv.current == 52 and 52 in lv.marks
            assert "Attention heads" in app.query_one("#header").content.plain or True

    run(go())


def test_header_shows_what_the_log_revealed(catalog):
    app = make_app([TP_LOG], catalog)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            header = app.query_one("#header").content.plain
            assert "FAILING" in header and "0.32.0" in header and "/models/tiny40" in header
            assert "54 lines" in header

    run(go())


def _two_findings_diagnosis():
    facts = Facts()
    facts.set("launch.command", "vllm serve m -tp 3", "log")
    line_a = parse_line("ValueError: heads (40) must be divisible by tensor parallel size (3)", "x.log", 7)
    line_b = parse_line("WARNING something else", "x.log", 3)
    a = Finding("tp-heads-indivisible", "Heads", "error", "high", [line_a], "why A")
    b = Finding("nccl-generic", "NCCL trouble", "warning", "low", [line_b, line_a], "why B")
    return Diagnosis([a, b], facts, [], None, 10, ["x.log"])


def test_select_findings_and_step_evidence(catalog, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    d = _two_findings_diagnosis()
    app = make_app([log], catalog, diagnose=lambda paths: d)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            texts = option_texts(app)
            assert texts[0].startswith("ROOT") and texts[1].startswith("also") and "low" in texts[1]
            await pilot.press("1")
            assert "why A" in app.pane_text("cause")
            await pilot.press("right_square_bracket")
            assert app.selected == 1 and "why B" in app.pane_text("cause")
            await pilot.press("3")
            assert "evidence 1/2" in app.pane_text("evidence") and "x.log:3" in app.pane_text("evidence")
            await pilot.press("n")
            assert "evidence 2/2" in app.pane_text("evidence") and "x.log:7" in app.pane_text("evidence")
            await pilot.press("p")
            assert "evidence 1/2" in app.pane_text("evidence")
            # the findings list itself: arrow keys move the selection
            app.query_one("#findings").focus()
            await pilot.press("up")
            assert app.selected == 0 and "why A" in app.pane_text("cause")
            await pilot.press("y")                      # no fix: nothing copied, no crash
            assert app.clipboard == ""

    run(go())


def test_log_search_goto_filter(catalog):
    app = make_app([TP_LOG], catalog)

    async def go():
        from textual.widgets import Input

        from vllm_doctor.tui.logview import LogView

        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            lv = app.query_one(LogView)
            await pilot.press("slash")
            app.screen.query_one("#prompt-input", Input).value = "Traceback"
            await pilot.press("enter")
            await until(pilot, lambda: lv.current is not None)
            assert app.active_tab == "log" and lv.current == 13      # line 14 of the file
            await pilot.press("slash")
            app.screen.query_one("#prompt-input", Input).value = "api_utils"
            await pilot.press("enter")
            await until(pilot, lambda: lv.current == 2)                 # the first hit after line 14 wraps
            await pilot.press("n")
            await until(pilot, lambda: lv.current == 3)
            assert "api_utils" in app.index.line(lv.current)
            await pilot.press("p")
            await until(pilot, lambda: lv.current == 2)
            await pilot.press("p")
            await until(pilot, lambda: lv.current == 8)                 # wraps to the last hit
            await pilot.press("g")
            app.screen.query_one("#prompt-input", Input).value = "40"
            await pilot.press("enter")
            assert lv.current == 39
            await pilot.press("w")
            await until(pilot, lambda: lv.filter_rows is not None and len(lv.filter_rows) > 0
                        and (app._filter_stop is None or app._filter_stop.is_set()))
            shown = [app.index.line(i) for i in lv.filter_rows]
            assert any("WARNING" in s for s in shown) and any("Traceback" in s for s in shown)
            assert not any(" INFO " in s and "Error" not in s for s in shown)
            assert "warning/error/evidence lines" in app.query_one("#log-status").content.plain
            await pilot.press("w")
            assert lv.filter_rows is None and lv.rows == 54

    run(go())


def test_help_lists_every_key(catalog):
    app = make_app([TP_LOG], catalog)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("question_mark")
            body = app.screen.query_one("#help-body").content.plain
            for desc in ("clipboard (OSC 52)", "save the corrected command", "search the log",
                         "only warning and error lines", "next finding", "open evidence in log",
                         "next evidence line", "next line with the search text", "go to a line number",
                         "lines as written"):
                assert desc in body
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

    run(go())


def test_healthy_log_opens_on_the_log(catalog):
    app = make_app([HEALTHY_LOG], catalog)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert "HEALTHY" in app.query_one("#header").content.plain
            assert "no problem found" in option_texts(app)[0]
            assert app.active_tab == "log"

    run(go())


def test_follow_a_growing_file(catalog, tmp_path):
    log = tmp_path / "growing.log"
    lines = TP_LOG.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:10]))
    app = make_app([log], catalog, follow=True)

    async def go():
        from vllm_doctor.tui.logview import LogView

        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot, final=False)
            assert not app.findings and "no problem found so far" in option_texts(app)[0]
            with open(log, "a") as out:
                out.write("".join(lines[10:]))
            await until(pilot, lambda: app.findings and app.index.line_count == 54)
            assert app.findings[0].rule == "tp-heads-indivisible"
            assert app.query_one(LogView).rows == 54
            assert "following" in app.query_one("#header").content.plain

    run(go())


def test_stream_feed_shows_lines_and_findings_as_they_come(catalog):
    from vllm_doctor.tui.live import StreamFeed

    feed = StreamFeed("<stdin>")
    lines = TP_LOG.read_bytes().splitlines(keepends=True)
    app = make_app([feed.path], catalog, feed=feed, title="<stdin>")

    def header() -> str:
        """The header's text, or "" while the screen is not (yet, or no longer) mounted: a loaded machine can
        index the lines before the main screen is up, and repaint it after."""
        from textual.css.query import NoMatches

        try:
            return app.query_one("#header").content.plain
        except NoMatches:
            return ""

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            feed.write(b"".join(lines[:12]))
            await until(pilot, lambda: app.index.line_count == 12 and "RUNNING" in header())
            feed.write(b"".join(lines[12:]))
            feed.close(returncode=1)
            await settle(app, pilot)
            assert app.findings[0].rule == "tp-heads-indivisible"
            await until(pilot, lambda: "FAILING" in header() and "exit 1" in header())
    try:
        run(go())
    finally:
        feed.cleanup()


def test_run_feed_wraps_a_command(catalog):
    from vllm_doctor.tui.live import run_feed

    feed = run_feed([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(TP_LOG)!r}).read())"])
    app = make_app([feed.path], catalog, feed=feed)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert feed.returncode == 0
            assert app.findings[0].rule == "tp-heads-indivisible"
            expected = report(catalog, TP_LOG)["findings"][0]["fix"]["command"]
            assert f"run: {expected}" in app.pane_text("fix")
    try:
        run(go())
    finally:
        feed.cleanup()


def test_unreadable_input_is_shown_not_raised(catalog, tmp_path):
    def broken(paths):
        raise ValueError("snapshot is not JSON")

    log = tmp_path / "x.log"
    log.write_text("hello\n")
    app = make_app([log], catalog, diagnose=broken)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert "snapshot is not JSON" in option_texts(app)[0]

    run(go())


def test_diagnosis_in_a_child_process_gives_the_same_findings(catalog, tmp_path):
    """A big log is diagnosed in a child process (the screen keeps the interpreter); the findings
    that come back are the pipeline's own objects, equal to the JSON report, and quitting ends it."""
    expected = report(catalog, TP_LOG)["findings"]
    app = make_app([TP_LOG], catalog, process=True)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert app._process is not None and not app._process_failed
            assert [f.rule for f in app.findings] == [f["rule"] for f in expected]
            assert type(app.findings[0]) is Finding and isinstance(app.diagnosis, Diagnosis)
            assert f"run: {expected[0]['fix']['command']}" in app.pane_text("fix")
            return app._process.process

    child = run(go())
    assert child.poll() is not None                  # ended with the app

    unreadable = tmp_path / "a-directory.log"
    unreadable.mkdir()
    app = make_app([unreadable], catalog, process=True)

    async def error():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert app.error and "cannot read" in app.error and app._process is not None

    run(error())


def test_child_process_failure_falls_back_to_a_thread(catalog, monkeypatch):
    from vllm_doctor.tui import worker

    monkeypatch.setattr(worker, "CHILD", "import sys; sys.exit(3)")
    app = make_app([TP_LOG], catalog, process=True)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            assert app._process_failed and app._process is None
            assert app.findings[0].rule == "tp-heads-indivisible"

    run(go())


def test_command_diff_marks_only_changes():
    old, new = view.command_diff("vllm serve m --tensor-parallel-size 3 --dtype auto",
                                 "vllm serve m --tensor-parallel-size 2 --dtype auto")
    assert view.changed_tokens(old.plain, new.plain) == ["2"]
    styled = [new.plain[s.start:s.end] for s in new.spans if "on green" in str(s.style)]
    assert styled == ["2"]
    struck = [old.plain[s.start:s.end] for s in old.spans if "strike" in str(s.style)]
    assert struck == ["3"]
    assert view.command_diff(None, "a b")[1].plain == "a b"
    assert isinstance(view.memory_bar(40960, 81920), Text)
    assert "40.0/80.0 GiB" in view.memory_bar(40960, 81920).plain


def test_facts_pane_gpus_and_p2p():
    facts = Facts()
    facts.set("gpu.devices", [{"index": 0, "name": "H100", "memory_total_mib": 81920, "memory_used_mib": 1024},
                              {"index": 1, "name": "H100", "memory_total_mib": 81920,
                               "memory_used_mib": 80000}], "snapshot")
    facts.set("gpu.p2p", {"read": [["X", "NS"], ["NS", "X"]]}, "snapshot")
    facts.set("env.vars", {"NCCL_P2P_DISABLE": "1"}, "env")
    from rich.console import Console

    console = Console(width=100, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(view.facts_renderable(facts))
    text = console.export_text()
    assert "GPU0 H100" in text and "1.0/80.0 GiB" in text and "78.1/80.0 GiB" in text
    assert "P2P read (snapshot)" in text and "NS" in text
    assert "NCCL_P2P_DISABLE=1" in text and "env" in text
    assert "2× H100 (snapshot)" in view.header_fields(Diagnosis([], facts, [], None, 0, []))["gpus"]


def test_textual_is_not_imported_on_the_plain_path():
    import subprocess

    code = ("import sys, vllm_doctor.cli.main as c, vllm_doctor.tui;"
            "c.main(['--no-live', '--format', 'json', %r]);"
            "assert 'textual' not in sys.modules, 'textual imported'" % str(TP_LOG))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_cli_errors_are_one_line(tmp_path):
    import subprocess

    for args in (["tui", str(tmp_path / "missing.log")], ["tui", str(tmp_path)], ["tui", "--"]):
        proc = subprocess.run([sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("vllm-doctor: error:")


def test_run_tui_wires_the_command_to_the_app(monkeypatch):
    """`vllm-doctor run --tui -- CMD` opens the app on the command's output, the command known."""
    import shlex

    from vllm_doctor.tui.app import TriageApp
    from vllm_doctor.cli.run import cmd_run

    seen = {}

    def fake_run(app):
        seen.update(paths=list(app.paths), command=app.options.command, feed=app.feed)
        app.feed.ended.wait(30)

    from vllm_doctor.cli import tui as cli_tui

    monkeypatch.setattr(TriageApp, "run", fake_run)
    monkeypatch.setattr(cli_tui, "no_terminal", lambda mode: None)      # the test's stdout is no terminal
    monkeypatch.setattr(cli_tui, "_keys_from_tty", lambda: None)
    argv = [sys.executable, "-c", "print('hello')"]
    rc = cmd_run(["--tui", "--no-live", "--", *argv])
    feed = seen["feed"]
    assert seen["paths"] == [feed.path] and not os.path.exists(feed.path)      # spooled, then removed
    assert seen["command"] == shlex.join(argv)
    assert rc == 0 and feed.returncode == 0
    assert cmd_run(["--tui", "--retry", "--", *argv]) == 2
