"""Without a terminal the TUI refuses in one line (exit 2) instead of writing escape codes and waiting
for keys that never come."""
import os
import subprocess
import sys

import pytest

from tui_helpers import DATA

LOG = str(DATA / "tp3-40heads.log")


def _doctor(args, **kwargs):
    """The CLI in a process of its own session: it has no controlling terminal (/dev/tty cannot open)."""
    if "input" not in kwargs:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], timeout=30, start_new_session=True,
                          **kwargs)


def _refused(proc, instead):
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert proc.stdout == b"" and "\x1b" not in err           # no escape codes anywhere
    assert err.count("\n") == 1 and err.startswith("vllm-doctor: error: the TUI needs a terminal")
    assert f"run `{instead}` for the text report" in err


@pytest.mark.parametrize("args", [["tui", LOG], ["--tui", LOG]], ids=["tui", "--tui"])
def test_saved_log_with_stdout_redirected(args):
    _refused(_doctor(args), "vllm-doctor LOG")


def test_follow_with_stdout_redirected():
    _refused(_doctor(["tui", "--follow", LOG]), "vllm-doctor --follow FILE")


def test_run_refuses_before_starting_the_command(tmp_path):
    marker = tmp_path / "started"
    code = f"open({str(marker)!r}, 'w').close()"
    _refused(_doctor(["run", "--tui", "--", sys.executable, "-c", code]), "vllm-doctor run -- CMD")
    _refused(_doctor(["tui", "--", sys.executable, "-c", code]), "vllm-doctor run -- CMD")
    assert not marker.exists()


def test_pipe_with_no_terminal_for_keys():
    """stdout is a terminal but the process has no controlling one: the keys have nowhere to come from."""
    master, slave = os.openpty()
    try:
        proc = _doctor(["tui", "-"], input=b"INFO hello\n", stdout=slave)
    finally:
        os.close(slave)
        os.close(master)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "the TUI needs a terminal" in err and "... | vllm-doctor" in err


def test_usage_errors_come_before_the_terminal(tmp_path):
    proc = _doctor(["tui", str(tmp_path / "missing.log")])
    assert proc.returncode == 2 and b"cannot read" in proc.stderr and b"terminal" not in proc.stderr
