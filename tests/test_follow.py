"""Follow mode: appended lines are picked up, truncation and rotation survived, Ctrl-C and --idle-exit."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from test_pipe_support import FATAL_LINENO, HEALTHY, TP_FAILURE, WARNING, Collector, no_traceback, spawn


def follow(path: Path, *extra: str):
    proc = spawn(["--no-live", "--follow", str(path), *extra], stdin=None)
    return proc, Collector(proc.stdout), Collector(proc.stderr)


def stop(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()


def append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_appended_lines_are_picked_up_and_ctrl_c_reports(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(HEALTHY + WARNING)
    proc, out, err = follow(log)
    try:
        assert out.wait_for("warning (predicts a failure)", timeout=10), out.text() + err.text()
        assert "failure at" not in out.text()
        append(log, TP_FAILURE)
        assert out.wait_for(f"failure at {log}:{4 + FATAL_LINENO}", timeout=10), out.text()
    finally:
        rc = stop(proc)
    out.join()
    assert rc == 1
    text = out.text()
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in text and no_traceback(text + err.text())


def test_truncation_reads_from_the_start(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(HEALTHY * 50 + WARNING)
    proc, out, err = follow(log)
    try:
        assert out.wait_for("warning (predicts a failure)", timeout=10)
        log.write_text(TP_FAILURE)                      # `> server.log` then the new server writes
        assert out.wait_for("was truncated", timeout=10), out.text()
        assert out.wait_for(f"failure at {log}:{FATAL_LINENO}", timeout=10), out.text()
    finally:
        rc = stop(proc)
    assert rc == 1


def test_rotation_finishes_the_old_file_then_follows_the_new(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(HEALTHY + WARNING)
    proc, out, err = follow(log)
    try:
        assert out.wait_for("warning (predicts a failure)", timeout=10)
        append(log, HEALTHY)
        os.rename(log, tmp_path / "server.log.1")
        log.write_text(TP_FAILURE)
        assert out.wait_for("was rotated", timeout=10), out.text()
        assert out.wait_for(f"failure at {log}:{FATAL_LINENO}", timeout=10), out.text()
    finally:
        rc = stop(proc)
    out.join()
    assert rc == 1
    # the new file is a run of its own, reported first; the rotated file's runs follow as earlier runs
    text = out.text()
    report = text[text.index("error[tp-heads-indivisible]"):]
    assert "earlier run (" in report and "(before rotation)" in report, report


def test_waits_for_a_missing_file_and_idle_exit_after_a_failure(tmp_path):
    log = tmp_path / "later.log"
    proc, out, err = follow(log, "--idle-exit", "0.5")
    try:
        assert out.wait_for("waiting for", timeout=10)
        log.write_text(TP_FAILURE)
        rc = proc.wait(timeout=15)                      # stops by itself: failure, then silence
    finally:
        if proc.poll() is None:
            proc.kill()
    out.join()
    assert rc == 1
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in out.text()


def test_follow_a_directory_is_a_usage_error(tmp_path):
    proc, out, err = follow(tmp_path)
    assert proc.wait(timeout=10) == 2
    err.join()
    assert "is a directory" in err.text() and no_traceback(err.text())


def test_idle_exit_after_a_failure_no_rule_names_but_not_on_a_quiet_healthy_start(tmp_path):
    """A real failure no rule names (ro12: a corrupt safetensors upload) gets no early notice; the file
    gone silent on its traceback still ends the follow (it followed forever). A start that goes quiet
    while loading (the healthy lines alone) is no failure: it keeps following until a signal."""
    from conftest import ROOT

    unexplained = (ROOT / "logs_corpus/real/other/ro12-other-corrupt-safetensors-upload.log").read_text()
    log = tmp_path / "server.log"
    log.write_text(HEALTHY + unexplained)
    proc, out, err = follow(log, "--idle-exit", "0.3")
    try:
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    out.join()
    assert rc == 1 and "error[unrecognized]" in out.text(), out.text() + err.text()

    quiet = tmp_path / "loading.log"
    quiet.write_text(HEALTHY)
    # --idle-exit 0: any silent look would stop it, were the quiet start taken for a failure
    proc, out, err = follow(quiet, "--idle-exit", "0")
    try:
        # read whenever it comes: the follow is still there to read it. (Its shm wait after serving is
        # the final report's hang, whose waits repeat while it lasts: no end for --idle-exit either.)
        append(quiet, WARNING)
        assert out.wait_for("warning (predicts a failure)", timeout=10), out.text() + err.text()
        assert proc.poll() is None
    finally:
        stop(proc)
    assert "A failure no rule explains" not in out.text() and no_traceback(err.text())
