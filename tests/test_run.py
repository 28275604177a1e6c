"""Run mode: the child's exit code, live output, signal forwarding, no orphans, --retry."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_pipe_support import HEALTHY, TP_FAILURE, Collector, DOCTOR, ENV, ROOT, no_traceback, spawn

# A stand-in server: prints a log, then exits with a code, or hangs (optionally with a worker child).
FAKE = r'''
import os, signal, subprocess, sys, time
args = sys.argv[1:]
log, mode = args[0], args[1]
if "--tensor-parallel-size" in args and args[args.index("--tensor-parallel-size") + 1] == "2":
    log, mode = log.replace("fail", "healthy"), "0"          # the corrected command works
if os.environ.get("PIDFILE"):
    Path = open(os.environ["PIDFILE"], "w"); Path.write(str(os.getpid())); Path.close()
def stop(signum, frame):
    print(f"server got signal {signum}, shutting down", flush=True)
    sys.exit(3)
if mode in ("hang", "worker"):
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
if mode == "stubborn":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
sys.stdout.write(open(log).read()); sys.stdout.flush()
sys.stderr.write("to-stderr\n"); sys.stderr.flush()
if mode in ("hang", "stubborn"):
    print("READY", flush=True)
    while True:
        time.sleep(0.05)
sys.exit(int(mode))
'''


@pytest.fixture()
def fake(tmp_path: Path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE)
    (tmp_path / "fail.log").write_text(TP_FAILURE)
    (tmp_path / "healthy.log").write_text(HEALTHY)
    return tmp_path


def doctor_run(args: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(DOCTOR + ["run", "--no-live", *args], capture_output=True, env={**ENV, **kw.pop("env", {})},
                          cwd=ROOT, timeout=timeout, stdin=subprocess.DEVNULL, **kw)


@pytest.mark.parametrize("code", [0, 1, 3])
def test_exit_code_is_the_childs(fake, code):
    log = fake / ("healthy.log" if code == 0 else "fail.log")
    result = doctor_run(["--", sys.executable, str(fake / "fake_server.py"), str(log), str(code)])
    assert result.returncode == code
    assert result.stdout.startswith(log.read_bytes())   # output shown (merged: stderr too)
    assert b"to-stderr" in result.stdout
    err = result.stderr.decode()
    assert no_traceback(err)
    if code:
        assert "error[tp-heads-indivisible]: Attention heads not divisible" in err
        # the exact launch command is known: the fix edits it
        assert "fake_server.py" in err and "--tensor-parallel-size 2" in err
    else:
        assert "no problem found" in err


def test_separate_keeps_stderr_apart(fake):
    result = doctor_run(["--separate", sys.executable, str(fake / "fake_server.py"), str(fake / "healthy.log"), "0"])
    assert result.returncode == 0
    assert b"to-stderr" not in result.stdout and b"to-stderr" in result.stderr
    assert result.stdout == (fake / "healthy.log").read_bytes()


def test_command_not_found_is_127_without_traceback():
    result = doctor_run(["--", "no-such-command-vllm-doctor-test"])
    assert result.returncode == 127
    assert "command not found" in result.stderr.decode() and no_traceback(result.stderr.decode())


def test_no_command_is_a_usage_error():
    result = doctor_run([])
    assert result.returncode == 2


def _live_members(pgid: int) -> list[int]:
    from vllm_doctor.streams.child import group_members

    return group_members(pgid)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_is_forwarded_and_child_exit_code_returned(fake, signum):
    pidfile = fake / "pid"
    proc = spawn(["run", "--no-live", "--", sys.executable, str(fake / "fake_server.py"), str(fake / "fail.log"), "hang"],
                 env={**ENV, "PIDFILE": str(pidfile)})
    out, err = Collector(proc.stdout), Collector(proc.stderr)
    try:
        assert out.wait_for("READY", timeout=15), err.text()
        assert err.wait_for("failure at <output>:", timeout=10)     # reported while the server still runs
        proc.send_signal(signum)
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    out.join()
    err.join()
    assert f"server got signal {int(signum)}" in out.text()
    assert rc == 3
    assert "error[tp-heads-indivisible]: Attention heads not divisible" in err.text() and no_traceback(err.text())
    assert _live_members(int(pidfile.read_text())) == []


def test_no_child_survives_ctrl_c_of_a_stubborn_server(fake):
    pidfile = fake / "pid"
    proc = spawn(["run", "--no-live", "--kill-after", "0.3", "--", sys.executable, str(fake / "fake_server.py"),
                  str(fake / "healthy.log"), "stubborn"], env={**ENV, "PIDFILE": str(pidfile)})
    out, err = Collector(proc.stdout), Collector(proc.stderr)
    try:
        assert out.wait_for("READY", timeout=15), err.text()
        pgid = int(pidfile.read_text())
        assert len(_live_members(pgid)) == 2                        # server + its worker
        proc.send_signal(signal.SIGINT)                              # ignored by both: escalation follows
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_members(pgid) == []
    assert rc == 128 + signal.SIGKILL                                # SIGTERM ignored too: killed
    assert no_traceback(err.text())


def test_retry_runs_the_corrected_command_once_with_yes(fake):
    # a script that takes vLLM's flags itself (shows --tensor-parallel-size) gets it edited in place
    result = doctor_run(["--retry", "--yes", "--", sys.executable, str(fake / "fake_server.py"),
                         str(fake / "fail.log"), "1", "--tensor-parallel-size", "3"])
    err = result.stderr.decode()
    assert "retrying:" in err and "--tensor-parallel-size 2" in err
    assert result.returncode == 0                                    # the retry's exit code
    assert result.stdout.count(b"Starting vLLM API server") == 1     # the retry's output, shown once
    assert err.index("error[tp-heads-indivisible]: Attention heads") < err.index("retrying:") < err.index("no problem found")
    assert no_traceback(err)


def test_retry_without_a_terminal_and_without_yes_runs_nothing(fake):
    result = doctor_run(["--retry", "--", sys.executable, str(fake / "fake_server.py"), str(fake / "fail.log"), "1",
                         "--tensor-parallel-size", "3"])
    assert result.returncode == 1
    assert "needs a confirmation" in result.stderr.decode()
    assert b"Starting vLLM API server" not in result.stdout


def test_nothing_is_retried_without_retry(fake):
    result = doctor_run(["--yes", "--", sys.executable, str(fake / "fake_server.py"), str(fake / "fail.log"), "1"])
    assert result.returncode == 1 and "retrying" not in result.stderr.decode()


def test_retry_never_runs_a_fix_that_is_no_command_line(fake):
    """`python fake_server.py` shows no vLLM flag: the fix is a flags-only change, which --retry must not
    append to the script and run."""
    result = doctor_run(["--retry", "--yes", "--", sys.executable, str(fake / "fake_server.py"), str(fake / "fail.log"), "1"])
    err = result.stderr.decode()
    assert result.returncode == 1 and "no corrected command to run" in err and "retrying:" not in err
    assert err.count("error[tp-heads-indivisible]") == 1          # one run only: nothing was retried
