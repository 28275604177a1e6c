"""Pipe mode: byte-exact passthrough, early reports before EOF, warnings once, EPIPE and Ctrl-C."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess

from test_pipe_support import (FATAL_LINENO, HEALTHY, TP_FAILURE, WARNING, Collector, DOCTOR, ENV, ROOT,
                               no_traceback, spawn)


def run_pipe(data: bytes, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(DOCTOR + ["--no-live", *extra], input=data, capture_output=True, env=ENV, cwd=ROOT,
                          timeout=timeout)


def test_random_binary_passes_through_byte_exact():
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(300_000)) + os.urandom(3 << 20)
    result = run_pipe(data)
    assert result.stdout == data
    assert result.returncode in (0, 1)
    assert no_traceback(result.stderr.decode("utf-8", "replace"))


def test_huge_line_invalid_utf8_crlf_and_failure_byte_exact():
    huge = b"x" * (9 << 20)                       # > 8 MiB without a newline
    data = (b"INFO start\r\n" + b"\xff\xfe\xc3(\xed\xa0\x80 invalid utf-8\r\n" + huge + b"\n"
            + TP_FAILURE.replace("\n", "\r\n").encode() + b"\x1b[31mred\x1b[0m" + huge[:1000])  # no final newline
    result = run_pipe(data)
    assert result.stdout == data
    err = result.stderr.decode()
    assert "tp-heads-indivisible" in err           # the CRLF traceback is still understood
    assert result.returncode == 1
    assert no_traceback(err)


def test_failure_is_reported_before_eof_and_final_report_at_eof():
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    out = Collector(proc.stdout)
    try:
        proc.stdin.write(TP_FAILURE.encode())
        proc.stdin.flush()                        # the pipe stays open: the server "hangs"
        assert err.wait_for("failure at <stdin>:%d" % FATAL_LINENO, timeout=10), err.text()
        text = err.text()
        assert "tp-heads-indivisible" in text
        assert "run: vllm serve /models/tiny40 --tensor-parallel-size 2" in text
        assert "error[tp-heads-indivisible]" not in text           # the final report waits for the end of input
        assert out.wait_for("For further information visit", timeout=5)   # passthrough is not held back
        # more output after the failure (not a fresh, healthy start: that would mean it recovered)
        proc.stdin.write(b"(APIServer pid=1) INFO 12-01 00:31:30 [launcher.py:80] Shutting down FastAPI HTTP server.\n")
        proc.stdin.close()
        assert proc.wait(timeout=20) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    err.join()
    final = err.text()
    assert final.count("failure at") == 1
    assert final.index("failure at") < final.index("error[tp-heads-indivisible]: Attention heads not divisible")


def test_predictive_warning_shown_once_and_marked():
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    Collector(proc.stdout)
    try:
        proc.stdin.write((HEALTHY + WARNING).encode())
        proc.stdin.flush()
        assert err.wait_for("warning (predicts a failure)", timeout=10), err.text()
        proc.stdin.write((WARNING * 3).encode())
        proc.stdin.close()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    err.join()
    text = err.text()
    assert text.count("warning (predicts a failure)") == 1
    assert "[startup-stalled]" in text       # the shm-broadcast wait predicts a stall


def test_reader_going_away_is_not_a_traceback():
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    try:
        proc.stdin.write(HEALTHY.encode())
        proc.stdin.flush()
        assert proc.stdout.read(10)
        proc.stdout.close()                       # like `| head -c 10`
        for _ in range(50):
            proc.stdin.write(HEALTHY.encode() * 20)
        proc.stdin.write(TP_FAILURE.encode())
        proc.stdin.close()
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    err.join()
    text = err.text()
    assert rc == 1                                # the diagnosis went on after EPIPE
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in text
    assert no_traceback(text) and "BrokenPipeError" not in text


def test_ctrl_c_twice_reports_what_was_seen():
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    Collector(proc.stdout)
    try:
        proc.stdin.write(TP_FAILURE.encode())
        proc.stdin.flush()
        assert err.wait_for("failure at", timeout=10)
        proc.send_signal(signal.SIGINT)
        assert err.wait_for("interrupted", timeout=5)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
    err.join()
    assert rc == 1
    text = err.text()
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in text
    assert no_traceback(text) and "KeyboardInterrupt" not in text


def test_sigterm_reports_and_exits_cleanly_on_a_healthy_stream():
    proc = spawn(["--no-live"])
    err = Collector(proc.stderr)
    out = Collector(proc.stdout)
    try:
        proc.stdin.write(HEALTHY.encode())
        proc.stdin.flush()
        assert out.wait_for("Starting vLLM API server", timeout=10)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
    err.join()
    assert rc == 0
    assert "no problem found in <stdin>" in err.text()


def test_json_report_keeps_stderr_one_document_and_report_file(tmp_path):
    result = run_pipe(TP_FAILURE.encode(), "--format", "json")
    assert result.stdout == TP_FAILURE.encode()
    doc = json.loads(result.stderr)
    assert doc["findings"][0]["rule"] == "tp-heads-indivisible"
    report = tmp_path / "report.txt"
    result = run_pipe(TP_FAILURE.encode(), "--report", str(report))
    assert result.returncode == 1
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in report.read_text()
    assert "error[tp-heads-indivisible]" not in result.stderr.decode()


def test_dash_reads_stdin_and_empty_input_says_so():
    result = run_pipe(b"", "-")       # "no problem found" in nothing would be a false all-clear
    assert result.returncode == 2 and result.stdout == b""
    assert "standard input is empty" in result.stderr.decode() and no_traceback(result.stderr.decode())


def test_the_tp_failure_after_5000_digit_lines_is_still_diagnosed():
    """Three lines whose prefix and message carry 5,000-digit numbers (past Python's int-from-string limit)
    before the real TP failure: every byte passes through, the failure is still named (issue 32)."""
    huge = "7" * 5000
    lines = (f"(APIServer pid={huge}) INFO 12-01 00:31:17 [api_utils.py:286] non-default args: {{}}\n"
             f"[rank{huge}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] Watchdog caught collective\n"
             f"INFO 12-01 00:31:20 [default_loader.py:262] Loading weights took {huge} seconds\n")
    data = lines.encode() + b"INFO filler\n" * 20_000 + TP_FAILURE.encode()
    result = run_pipe(data)
    assert result.stdout == data
    err = result.stderr.decode()
    assert "tp-heads-indivisible" in err and result.returncode == 1
    assert no_traceback(err)
