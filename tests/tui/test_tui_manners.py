"""What the triage app says and where it looks: a traceback still arriving, the filter's evidence lines,
a search hit off to the right, the clipboard it cannot confirm, the log's messages, the footer."""
import asyncio
import threading
import time

from tui_helpers import DATA, ROOT, make_app, settle, until
from vllm_doctor.facts import Facts
from vllm_doctor.findings import Diagnosis, Finding, Rewrite
from vllm_doctor.sources.lines import parse_line

VICUNA = ROOT / "logs_corpus" / "parallel" / "vicuna13b-tp3.log"     # a pydantic traceback, heads vs tp
TP_LOG = DATA / "tp3-40heads.log"
QUIET = 0.3


def run(coro):
    return asyncio.run(coro)


def rules(app):
    return [f.rule for f in app.findings]


def option_texts(app):
    from textual.widgets import OptionList

    ol = app.query_one("#findings", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


def notices(app):
    return [n.message for n in app._notifications]


def _up_to_the_exception(log):
    """The log's lines, and where its traceback's exception line is (the frames come before it)."""
    lines = log.read_bytes().splitlines(keepends=True)
    return lines, next(i for i, line in enumerate(lines) if line.startswith(b"pydantic_core"))


# ---- 3. a traceback still arriving -----------------------------------------------------------------------
def test_a_traceback_still_arriving_is_diagnosing_not_unexplained(catalog, tmp_path):
    lines, cut = _up_to_the_exception(VICUNA)
    path = tmp_path / VICUNA.name
    path.write_bytes(b"".join(lines[:cut]))                 # the frames are in, the exception is not
    app = make_app([path], catalog, follow=True, live_quiet=QUIET)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.diagnosis is not None, timeout=10)
            shown = []
            deadline = time.monotonic() + 6 * QUIET        # quiet long enough to settle many times over
            while time.monotonic() < deadline:
                shown.append((app.live_state, tuple(rules(app))))
                await asyncio.sleep(0.02)
            assert not any("unrecognized" in shown_rules for _, shown_rules in shown)
            assert shown[-1] == ("diagnosing", ())
            assert option_texts(app)[0].startswith("diagnosing…")
            assert "DIAGNOSING" in app.query_one("#header").content.plain
            with open(path, "ab") as out:
                out.write(b"".join(lines[cut:]))
            await until(pilot, lambda: "tp-heads-indivisible" in rules(app), timeout=20)
            assert "unrecognized" not in rules(app)
            await until(pilot, lambda: app.live_state == "settled", timeout=20)
            assert rules(app)[0] == "tp-heads-indivisible"

    run(go())


def test_a_traceback_cut_for_good_is_settled_after_a_while(catalog, tmp_path):
    """The process died mid-traceback: after OPEN_TRACEBACK_S of quiet the log is settled as it is."""
    from vllm_doctor.diagnosis.saved import Options
    from vllm_doctor.tui.live import LiveDiagnosis

    lines, cut = _up_to_the_exception(VICUNA)
    path = tmp_path / "cut.log"
    path.write_bytes(b"".join(lines[:cut]))
    updates = []
    live = LiveDiagnosis(str(path), catalog, Options(live=False), lambda d, kind: updates.append(
        (time.monotonic(), kind, [f.rule for f in d.findings])), lambda text: None, quiet=0.1, open_traceback=0.8)
    thread = threading.Thread(target=live.run, daemon=True)
    start = time.monotonic()
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not any(kind == "settled" for _, kind, _ in updates) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        live.stop()
        thread.join(10)
    kinds = [kind for _, kind, _ in updates]
    assert "diagnosing" in kinds and "settled" in kinds and kinds.index("diagnosing") < kinds.index("settled")
    at, _, settled = next(u for u in updates if u[1] == "settled")
    assert at - start >= 0.8 and settled == ["unrecognized"]


# ---- 2. the filter keeps every finding's lines ------------------------------------------------------------
FILTER_LOG = [
    "(APIServer pid=1) INFO 10-01 12:00:00 [a.py:1] starting",
    "(APIServer pid=1) WARNING 10-01 12:00:01 [a.py:2] careful",
    "(APIServer pid=1) INFO 10-01 12:00:02 [a.py:3] Using max model len 999999",      # the evidence
    "plain text",
    "  the reason is here",                                                         # supporting, no level
    "(APIServer pid=1) ERROR 10-01 12:00:03 [a.py:4] it broke",
    "(APIServer pid=1) INFO 10-01 12:00:04 [a.py:5] done",
]


def _finding(log, evidence, supporting=(), fix_command=None):
    line = lambda n: parse_line(FILTER_LOG[n - 1], str(log), n)          # noqa: E731 - 1-based, as cited
    return Finding("max-len-too-long", "Context too long", "error", "high", [line(n) for n in evidence],
                   "the model's max length does not fit", supporting=[line(n) for n in supporting],
                   rewrite=Rewrite("command", fix_command) if fix_command else None)


def _filter_done(app, lv):
    return lambda: lv.filter_rows is not None and (app._filter_stop is None or app._filter_stop.is_set())


def test_the_filter_keeps_the_evidence_whatever_its_level(catalog, tmp_path):
    from vllm_doctor.tui.logview import LogView

    log = tmp_path / "x.log"
    log.write_text("\n".join(FILTER_LOG) + "\n")
    release = threading.Event()
    diagnosis = Diagnosis([_finding(log, [3], [5])], Facts(), [], None, len(FILTER_LOG), [str(log)])

    def diagnose(paths):
        release.wait(20)               # the filter is on before the diagnosis comes
        return diagnosis

    app = make_app([log], catalog, diagnose=diagnose)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.index.done)
            lv = app.query_one(LogView)
            await pilot.press("w")
            await until(pilot, _filter_done(app, lv))
            assert list(lv.filter_rows) == [1, 5]                  # the WARNING and the ERROR line
            release.set()
            await settle(app, pilot)
            await until(pilot, lambda: list(lv.filter_rows) == [1, 2, 4, 5] and _filter_done(app, lv)())
            await pilot.press("w")
            assert lv.filter_rows is None
            await pilot.press("w")                                  # on again: the evidence from the start
            await until(pilot, lambda: list(lv.filter_rows) == [1, 2, 4, 5] and _filter_done(app, lv)())

    run(go())


# ---- 4. a search hit off to the right ---------------------------------------------------------------------
def _row_text(lv, line):
    return lv.render_line(lv.line_row(line) - int(lv.scroll_y)).text


def test_a_search_hit_beyond_the_right_edge_is_scrolled_into_view(catalog, tmp_path):
    from textual.widgets import Input

    from vllm_doctor.tui.logview import LogView

    log = tmp_path / "wide.log"
    wide = "(APIServer pid=7) INFO 10-01 12:00:00 [a.py:1] " + "x" * 150 + " NEEDLE here"
    log.write_text("\n".join(["first", wide, "last"]) + "\n")
    app = make_app([log], catalog)

    async def search(pilot, text):
        await pilot.press("slash")
        app.screen.query_one("#prompt-input", Input).value = text
        await pilot.press("enter")

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            lv = app.query_one(LogView)
            await search(pilot, "needle")
            await until(pilot, lambda: lv.current == 1)
            assert lv.hscroll > 0 and "NEEDLE" in _row_text(lv, 1)
            lv.hscroll = 0
            await search(pilot, "first")                          # a hit in view: no sideways jump
            await until(pilot, lambda: lv.current == 0)
            assert lv.hscroll == 0
            await search(pilot, "APIServer")                      # in the prefix messages leave out
            await until(pilot, lambda: any("r shows the lines as written" in n for n in notices(app)))
            assert lv.current == 1

    run(go())


# ---- 5. the clipboard it cannot confirm; s saves a file ---------------------------------------------------
def test_copy_says_sent_not_copied_and_s_saves_a_file(catalog, tmp_path, monkeypatch):
    from textual.widgets import Input

    monkeypatch.chdir(tmp_path)
    app = make_app([TP_LOG], catalog)

    async def save(pilot):
        await pilot.press("s")
        name = app.screen.query_one("#prompt-input", Input).value
        await pilot.press("enter")
        await pilot.pause()
        return name

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            command = app.findings[0].fix_command
            await pilot.press("y")
            said = notices(app)[-1]
            assert "OSC 52" in said and "may ignore it" in said and "press s" in said
            assert not any("copied" in n for n in notices(app))
            assert await save(pilot) == "vllm-doctor-fix.sh"
            script = (tmp_path / "vllm-doctor-fix.sh").read_text()
            assert script.startswith("#!/bin/sh") and script.splitlines()[-1] == command
            assert "vllm-doctor-fix.sh" in notices(app)[-1] and str(tmp_path) in notices(app)[-1]
            assert await save(pilot) == "vllm-doctor-fix-2.sh"            # never over an earlier one
            assert (tmp_path / "vllm-doctor-fix-2.sh").read_text() == script

    run(go())


def test_s_saves_the_report_of_a_finding_without_a_command(catalog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "x.log"
    log.write_text("\n".join(FILTER_LOG) + "\n")
    diagnosis = Diagnosis([_finding(log, [3], [5])], Facts(), [], None, len(FILTER_LOG), [str(log)])
    app = make_app([log], catalog, diagnose=lambda paths: diagnosis)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("y")
            assert "press s to save the finding's report" in notices(app)[-1]
            await pilot.press("s")
            await pilot.press("enter")
            await pilot.pause()
            report = (tmp_path / "vllm-doctor-report.txt").read_text()
            assert "Context too long" in report and "the model's max length does not fit" in report
            assert f"{log}:3: {FILTER_LOG[2]}" in report and f"{log}:5: {FILTER_LOG[4]}" in report
            assert "report" in notices(app)[-1] and "vllm-doctor-report.txt" in notices(app)[-1]

    run(go())


def test_with_anonymize_y_and_s_hand_out_masked_text(catalog, tmp_path, monkeypatch):
    """`tui --anonymize`: the corrected command sent by `y` and the script `s` saves go through the run's
    masker (test_anonymize_hostile's planted NCCL log: every secret is in its launch line); the control
    app without the mask hands the secrets out."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from test_anonymize_hostile import leaks, planted_log

    from vllm_doctor.reports.anonymize import Anonymizer

    monkeypatch.chdir(tmp_path)
    log = tmp_path / "planted.log"
    log.write_text(planted_log())

    def handed_out(mask):
        app = make_app([log], catalog, mask=mask)
        sent: list[str] = []
        app.copy_to_clipboard = sent.append

        async def go():
            async with app.run_test(size=(100, 30)) as pilot:
                await settle(app, pilot)
                await pilot.press("y")
                await pilot.press("s")
                await pilot.press("enter")
                await pilot.pause()
        run(go())
        saved = sorted(tmp_path.glob("vllm-doctor-*"))
        assert sent and saved, (sent, notices(app))
        text = sent[-1] + saved[-1].read_text()
        saved[-1].unlink()
        return text

    assert len(leaks(handed_out(None))) >= 20
    masked = handed_out(Anonymizer().apply)
    assert leaks(masked) == [] and "<secret-" in masked and "--tensor-parallel-size" in masked, masked


# ---- 6. messages, or the raw lines ------------------------------------------------------------------------
def test_the_log_shows_messages_and_r_shows_the_raw_lines(catalog):
    from vllm_doctor.tui.logview import LogView

    app = make_app([TP_LOG], catalog)
    lineno = next(i for i, line in enumerate(TP_LOG.read_text().splitlines()) if "Resolved architecture" in line)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("5")
            lv = app.query_one(LogView)
            lv.show_line(lineno)
            await pilot.pause()
            shown = _row_text(lv, lineno)
            assert "Resolved architecture: LlamaForCausalLM" in shown and "APIServer" not in shown
            assert "INFO 12-01" not in shown and "[model.py:733]" not in shown
            await pilot.press("r")
            assert _row_text(lv, lineno).startswith(f"{lineno + 1:>4} (APIServer pid=30416) INFO 12-01")
            assert "raw lines" in app.query_one("#log-status").content.plain
            await pilot.press("r")
            assert "APIServer" not in _row_text(lv, lineno)

    run(go())


# ---- 7. the footer names what the keys step through ------------------------------------------------------
def _footer(app):
    return {str(key.key_display): key.description for key in app.query("FooterKey")}


def test_the_footer_says_what_n_p_w_g_do_on_each_tab(catalog):
    from vllm_doctor.tui.logview import LogView

    app = make_app([TP_LOG], catalog)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.pause()
            footer = _footer(app)
            assert footer["n"] == "next evidence" and footer["p"] == "prev evidence"
            assert "g" not in footer and "w" not in footer                 # Log keys: named on the Log tab
            await pilot.press("5")
            await pilot.pause()
            footer = _footer(app)
            assert footer["n"] == "next hit" and footer["p"] == "prev hit"
            assert footer["g"] == "goto line" and footer["w"] == "warnings" and footer["r"] == "raw"
            assert "y" not in footer
            await pilot.press("y")                                       # still there, unnamed
            assert app.clipboard == app.findings[0].fix_command
            await pilot.press("2")
            await pilot.press("w")                                       # from the Fix tab: the Log, filtered
            assert app.active_tab == "log" and app.query_one(LogView).filter_rows is not None

    run(go())


def test_s_saves_an_edit_as_the_report_never_as_a_shell_script(tmp_path):
    """An `LLM(...)` line (or a compose `command:` list) is no command a shell runs: `s` saves the report."""
    from vllm_doctor.findings import Fix
    from vllm_doctor.tui import saving

    finding = Finding("cli-invalid-choice", "Invalid value", "error", "high", [], "dtype fp16 is not a choice",
                      fix=Fix("Use dtype='float16'"),
                      rewrite=Rewrite("edit", 'llm = LLM(model="m", dtype="float16")',
                                      instruction='gen.py line 6: `llm = LLM(model="m", dtype="float16")`'))
    assert saving.free_name(finding, str(tmp_path)) == saving.REPORT_NAME
    path = tmp_path / "out.txt"
    assert saving.save(str(path), finding, None) == "report"
    text = path.read_text()
    assert not text.startswith("#!/bin/sh") and "gen.py line 6" in text


def test_a_command_wider_than_the_pane_scrolls_and_is_never_wrapped(catalog):
    """At 80 columns the corrected command (92 characters here) stays one line: the Fix pane scrolls it
    sideways, so selecting it with the mouse copies the whole command."""
    log = ROOT / "logs_corpus" / "parallel" / "v092-red-herring-then-heads.log"

    async def go():
        app = make_app([log], catalog)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            command = app.current_finding.fix_command
            assert len(command) > 80
            widget = app.query_one("#fix-commands")
            assert widget.size.height == 2 and widget.size.width >= len("run: ") + len(command)   # was, run
            assert widget.parent.size.width <= 80 and widget.parent.max_scroll_x > 0
            assert f"run: {command}" in app.pane_text("fix", width=400)

    run(go())
