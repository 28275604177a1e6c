"""The TUI's live modes (a followed log, a pipe, a wrapped command) run the pipe's LiveSession on the new
bytes: driven headless, a real failure log is written in steps; the failure shows once its fatal line is
there, and the diagnosis the app settles on equals `vllm-doctor --format json --no-live` of the file."""
import asyncio
import json
import subprocess
import sys
import tomllib

import pytest

from tui_helpers import ROOT, make_app, until

CORPUS = ROOT / "logs_corpus"
LOGS = [CORPUS / "parallel" / "vicuna13b-tp3.log",               # the fatal line is the last but one
        CORPUS / "real032" / "r06-tp3-qwen15b-vocab.log"]         # workers go on printing after it
QUIET = 0.3                                                        # quiet this long: the app settles
OPEN_TB = 1.0          # quiet this long mid-traceback (r06 ends in one): settled as it is (live.OPEN_TRACEBACK_S)


def run(coro):
    return asyncio.run(coro)


def root_of(log):
    """The case's decisive line (cases.toml `root`) and its rule."""
    for case in tomllib.loads((log.parent / "cases.toml").read_text())["case"]:
        if case.get("file") == log.name:
            return case["root"], case["label"]
    raise LookupError(log)


def cli_report(path):
    proc = subprocess.run([sys.executable, "-m", "vllm_doctor", "--format", "json", "--no-live", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def summary(report):
    """What must agree: each finding's rule, its fix command and the lines it cites, root cause first."""
    return [(f["rule"], (f.get("fix") or {}).get("command"), [e.get("line") for e in f["evidence"]])
            for f in report["findings"]]


def app_summary(app):
    from vllm_doctor.reports.json_report import report_dict

    return summary(report_dict(app.diagnosis))


def steps(log):
    """The log's lines cut in three: before the fatal line, the fatal line, the rest."""
    lines = log.read_bytes().splitlines(keepends=True)
    root, rule = root_of(log)
    fatal = next(i for i, line in enumerate(lines) if root.encode() in line)
    return lines, fatal, rule


def rules(app):
    return [f.rule for f in app.findings]


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.stem)
def test_follow_shows_the_failure_once_its_line_is_written(catalog, tmp_path, log):
    lines, fatal, rule = steps(log)
    path = tmp_path / log.name
    path.write_bytes(b"".join(lines[:fatal]))
    app = make_app([path], catalog, follow=True, live_quiet=QUIET, live_open_traceback=OPEN_TB)

    def settled_at(n):
        return lambda: app.live_state == "settled" and app.diagnosis.lines == n

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, settled_at(fatal), timeout=60)
            assert rule not in rules(app)                   # everything up to the fatal line: not yet
            with open(path, "ab") as out:
                out.write(lines[fatal])
            await until(pilot, lambda: rule in rules(app), timeout=60)
            finding = app.findings[rules(app).index(rule)]
            assert fatal + 1 in [ln.lineno for ln in finding.evidence]
            assert any(n.startswith("failure at line ") and f"[{rule}]" in n for n in app.notices)
            with open(path, "ab") as out:
                out.write(b"".join(lines[fatal + 1:]))
            await until(pilot, settled_at(len(lines)), timeout=60)
            assert not app.final and "following" in app.query_one("#header").content.plain
            return app_summary(app)

    shown = run(go())
    expected = summary(cli_report(path))
    assert expected[0][0] == rule and expected[0][1]
    assert shown == expected


def test_stream_final_diagnosis_is_the_sessions_finish(catalog, tmp_path):
    """`... | vllm-doctor tui -`: bytes come through a StreamFeed; at its end the final diagnosis."""
    from vllm_doctor.tui.live import StreamFeed

    log = LOGS[1]
    lines, fatal, rule = steps(log)
    feed = StreamFeed("<stdin>", spool_dir=str(tmp_path))
    app = make_app([feed.path], catalog, feed=feed, title="<stdin>", live_quiet=QUIET, live_open_traceback=OPEN_TB)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            for block in [lines[i:min(i + 7, fatal)] for i in range(0, fatal, 7)]:   # a few lines a write
                feed.write(b"".join(block))
                await asyncio.sleep(0.01)
            await until(pilot, lambda: app.live_state == "settled" and app.diagnosis.lines == fatal, timeout=60)
            assert rule not in rules(app) and "RUNNING" in app.query_one("#header").content.plain
            feed.write(b"".join(lines[fatal:fatal + 1]))
            await until(pilot, lambda: rule in rules(app), timeout=60)
            assert not app.final
            feed.write(b"".join(lines[fatal + 1:]))
            feed.close(returncode=1)
            await until(pilot, lambda: app.final, timeout=60)
            assert app.live_state == "final" and app.diagnosis.lines == len(lines)
            assert "exit 1" in app.query_one("#header").content.plain
            return app_summary(app)

    try:
        shown = run(go())
    finally:
        feed.cleanup()
    saved = tmp_path / "same.log"
    saved.write_bytes(b"".join(lines))
    assert shown == summary(cli_report(saved))


def test_run_mode_reports_while_the_command_runs(catalog, tmp_path):
    """`vllm-doctor tui -- CMD`: the command prints up to the fatal line and waits; the finding shows
    while it still runs; when it exits, the final diagnosis is the saved log's."""
    from vllm_doctor.tui.live import run_feed

    log = LOGS[0]
    lines, fatal, rule = steps(log)
    go_file = tmp_path / "go"
    script = (f"import os, sys, time\nlines = open({str(log)!r}, 'rb').read().splitlines(keepends=True)\n"
              f"sys.stdout.buffer.write(b''.join(lines[:{fatal + 1}])); sys.stdout.flush()\n"
              f"while not os.path.exists({str(go_file)!r}): time.sleep(0.02)\n"
              f"sys.stdout.buffer.write(b''.join(lines[{fatal + 1}:])); sys.stdout.flush()\n")
    feed = run_feed([sys.executable, "-c", script])
    app = make_app([feed.path], catalog, feed=feed, live_quiet=QUIET, live_open_traceback=OPEN_TB)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            try:
                await until(pilot, lambda: rule in rules(app), timeout=60)
                assert not feed.ended.is_set() and not app.final
            finally:
                go_file.write_text("")
            await until(pilot, lambda: app.final, timeout=60)
            assert feed.returncode == 0
            return app_summary(app)

    try:
        shown = run(go())
    finally:
        feed.cleanup()
    assert shown == summary(cli_report(log))


def test_quitting_while_following_ends_the_session(catalog, tmp_path):
    """Quit mid-follow: the live thread stops (the test's event loop would otherwise wait on it)."""
    path = tmp_path / "server.log"
    path.write_bytes(LOGS[1].read_bytes()[:4000])
    app = make_app([path], catalog, follow=True, live_quiet=QUIET, live_open_traceback=OPEN_TB)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.diagnosis is not None, timeout=60)
            live = app._live
        return live

    live = run(go())
    assert live is not None and live._stopped.is_set() and live._wake.fd == -1
