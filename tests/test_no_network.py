"""No network and no code execution: every sub-command stays on this machine and never runs a model's code.

Network: each command runs in a fresh interpreter whose socket layer is guarded (GUARD below): a connect,
bind or datagram to an address that is not loopback, or a name look-up of a host that is not local, is
written to a log file and refused. The model named is a Hugging Face hub id that no cache holds (HF_HOME
is an empty directory, and the hub's own offline switches are unset), so the only thing keeping the
doctor off the network is the doctor. The control runs the same command with `--online`: the guard sees
the hub look-up, so a silent guard means something.

Remote code: a model directory with `auto_map` and a `configuration_*.py` that writes a marker file when
imported (the way transformers would run it with trust_remote_code=True); diagnose, check, plan and the
TUI read its config and never create the marker. The control imports it through transformers with
trust_remote_code=True and sees the marker appear.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

LOG = ROOT / "logs_corpus/real/parallel/rp03-r1-distill-qwen7b-tp8.log"     # real: 28 heads, -tp 8
HUB_MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"                      # rp03's model, never cached here
LAUNCH = ["vllm", "serve", HUB_MODEL, "--tensor-parallel-size", "8"]

GUARD = r'''
def install_guard(note, patch):
    """Refuse (and note) every inet connect/bind/datagram off loopback and every look-up of a remote name."""
    import ipaddress
    import socket

    local_names = {"", "localhost", "localhost.localdomain", "ip6-localhost"}

    def local(host):
        if isinstance(host, bytes):
            host = host.decode()
        if host is None or host in local_names:
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def guarded(name, real):
        def call(self, *args):
            address = args[-1] if name == "sendto" else args[0]
            if self.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
                note(f"{name} {address!r}")
                raise OSError(101, "network is unreachable (test guard)")
            return real(self, *args)
        return call

    def lookup(real):
        def call(host, *args, **kwargs):
            if not local(host):
                note(f"{real.__name__} {host!r}")
                raise socket.gaierror(socket.EAI_NONAME, "name look-up refused (test guard)")
            return real(host, *args, **kwargs)
        return call

    for name in ("connect", "connect_ex", "bind", "sendto"):
        patch(socket.socket, name, guarded(name, getattr(socket.socket, name)))
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        patch(socket, name, lookup(getattr(socket, name)))
'''
RUN_CLI = GUARD + """
import os


def _note(what):
    with open(os.environ["NET_GUARD_LOG"], "a", encoding="utf-8") as f:
        f.write(what + "\\n")
    if os.environ.get("NET_GUARD_STOP_AT_FIRST"):   # the control needs one attempt, not the hub's retries
        os._exit(3)


install_guard(_note, setattr)
from vllm_doctor.__main__ import main
raise SystemExit(main())
"""



@pytest.fixture
def guarded_env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN")}
    env.update(NO_COLOR="1", HF_HOME=str(tmp_path / "hf-home"), NET_GUARD_LOG=str(tmp_path / "net.log"),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    return env


def guarded(env, *args, stdin: bytes | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, *args], input=stdin, capture_output=True, env=env,
                          cwd=ROOT, timeout=120)
    log = Path(env["NET_GUARD_LOG"])
    attempts = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()[-2000:]
    return proc, attempts


COMMANDS = {
    "diagnose": (["--cmd", " ".join(LAUNCH), str(LOG)], None),
    "diagnose json": (["--format", "json", "--cmd", " ".join(LAUNCH), str(LOG)], None),
    "stdin -": (["--cmd", " ".join(LAUNCH), "-"], LOG.read_bytes()),
    "pipe": (["--cmd", " ".join(LAUNCH)], LOG.read_bytes()),
    "run": (["run", "--cmd", " ".join(LAUNCH), "--", "cat", str(LOG)], None),
    "check": (["check", "--", *LAUNCH], None),
    "check json": (["check", "--format", "json", "--", *LAUNCH], None),
    "plan": (["plan", HUB_MODEL, "--gpus", "8"], None),
    "facts": (["facts"], None),
    "facts json": (["facts", "--format", "json"], None),
    "explain": (["explain", "tp-heads-indivisible"], None),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_command_reaches_the_network(guarded_env, name):
    args, stdin = COMMANDS[name]
    proc, attempts = guarded(guarded_env, *args, stdin=stdin)
    assert attempts == [], f"{name} tried the network: {attempts}"
    # 3: `check` could not run the checks that matter (the model is not in any cache here): no network either
    assert proc.returncode in ((0, 1, 2, 3) if name.startswith("check") else (0, 1, 2)), proc.stderr.decode()[-2000:]
    if name in ("diagnose", "diagnose json", "stdin -", "pipe"):     # the log's failure, found offline
        assert proc.returncode == 1, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
        assert "tp-heads-indivisible" in proc.stdout.decode() + proc.stderr.decode()


def test_the_guard_sees_a_hub_look_up(guarded_env):
    """The control: with --online the doctor does ask the hub, and the guard catches it (and refuses it)."""
    proc, attempts = guarded(dict(guarded_env, NET_GUARD_STOP_AT_FIRST="1"), "check", "--online", "--", *LAUNCH)
    assert any("huggingface.co" in a for a in attempts), attempts
    assert proc.returncode == 3       # stopped by the guard at that attempt


def test_the_tui_reaches_no_network(catalog, guarded_env, monkeypatch):
    """The TUI runs in this process: the same guard, installed here for the test's length."""
    for key in ("HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(key, guarded_env[key])
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "tui"))
    from tui_helpers import make_app, settle
    from vllm_doctor.diagnosis.saved import Options

    attempts: list[str] = []
    names: dict = {}
    exec(compile(GUARD, "guard", "exec"), names)
    names["install_guard"](attempts.append, monkeypatch.setattr)

    async def run():
        app = make_app([LOG], catalog, options=Options(live=True, online=False, command=" ".join(LAUNCH)))
        async with app.run_test() as pilot:
            await settle(app, pilot)
            return app.diagnosis

    diagnosis = asyncio.run(run())
    assert [f.rule for f in diagnosis.findings][:1] == ["tp-heads-indivisible"]
    assert attempts == []


# ---- remote code ---------------------------------------------------------------------------------------------
REMOTE_CONFIG = '''\
import pathlib
pathlib.Path({marker!r}).write_text("remote code ran")
from transformers import PretrainedConfig


class TinyRemoteConfig(PretrainedConfig):
    model_type = "tinyremote"
'''


@pytest.fixture
def remote_model(tmp_path):
    """tests/fixtures/models/tinyremote (auto_map, 40 heads) with the configuration module its auto_map names."""
    model = tmp_path / "tinyremote"
    shutil.copytree(ROOT / "tests/fixtures/models/tinyremote", model)
    marker = tmp_path / "REMOTE_CODE_RAN"
    (model / "configuration_tinyremote.py").write_text(REMOTE_CONFIG.format(marker=str(marker)))
    return model, marker


def test_the_marker_is_written_when_remote_code_is_trusted(remote_model, tmp_path):
    """The control: transformers with trust_remote_code=True does run the module, so a missing marker below
    means the doctor did not run it."""
    model, marker = remote_model
    script = ("import sys\nfrom transformers import AutoConfig\n"
              "AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True, local_files_only=True)\n")
    subprocess.run([sys.executable, "-c", script, str(model)], capture_output=True, timeout=120,
                   env=dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_MODULES_CACHE=str(tmp_path / "modules")))
    assert marker.exists()


REMOTE_COMMANDS = {
    "diagnose": lambda m: ["--model", str(m), "--cmd", f"vllm serve {m} --tensor-parallel-size 3", str(LOG)],
    "check": lambda m: ["check", "--format", "json", "--", "vllm", "serve", str(m), "--tensor-parallel-size", "3"],
    "plan": lambda m: ["plan", str(m), "--gpus", "4", "--format", "json"],
}


@pytest.mark.parametrize("name", list(REMOTE_COMMANDS))
def test_a_models_own_code_never_runs(remote_model, guarded_env, tmp_path, name):
    model, marker = remote_model
    guarded_env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    proc, attempts = guarded(guarded_env, *REMOTE_COMMANDS[name](model))
    assert not marker.exists(), f"{name} ran the model's configuration module"
    assert attempts == []
    out = proc.stdout.decode()
    # the config was read all the same (as JSON): 40 heads, which -tp 3 does not divide
    if name == "check":
        assert "tp-heads-indivisible" in out, out[-2000:]
    if name == "plan":
        assert json.loads(out)["layouts"], out[-2000:]
