"""A saved log gets this machine's facts only when it was evidently written here (facts/origin.py)."""
import json
import socket

from conftest import run_cli
from vllm_doctor.facts import Facts
from vllm_doctor.facts.origin import local_addresses, written_here

# NCCL's line prefix and bootstrap line as NCCL prints them (host:pid:tid [cudaDev] NCCL INFO ...)
NCCL_LINES = ("gpu-node-3:2201:2201 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>\n"
              "gpu-node-3:2201:2201 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)\n")
TP_FAILURE = ("ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n")


def _log_facts(**values) -> Facts:
    facts = Facts()
    for key, value in values.items():
        facts.set(key.replace("__", "."), value, "log")
    return facts


def test_nothing_in_the_log_means_written_elsewhere():
    origin = written_here(_log_facts(args__model="Qwen/Qwen2.5-7B-Instruct"), Facts(), hostname="laptop",
                          addresses={"192.168.1.5"})
    assert not origin.here and "nothing in the log" in origin.reason


def test_host_name_and_address_match():
    assert written_here(_log_facts(log__hostnames=["gpu-node-3"]), Facts(), hostname="gpu-node-3.cluster",
                        addresses=set()).here
    assert not written_here(_log_facts(log__hostnames=["gpu-node-3"]), Facts(), hostname="gpu-node-4",
                            addresses=set()).here
    origin = written_here(_log_facts(log__node_ips=["10.0.0.3"]), Facts(), hostname="x", addresses={"10.0.0.3"})
    assert origin.here and "10.0.0.3" in origin.reason
    # loopback is every machine's address: it proves nothing
    assert not written_here(_log_facts(log__node_ips=["127.0.0.1"]), Facts(), hostname="x",
                            addresses={"127.0.0.1"}).here


def test_model_path_that_exists_here(tmp_path):
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    assert written_here(_log_facts(args__model=str(model)), Facts(), hostname="x", addresses=set()).here
    assert not written_here(_log_facts(args__model=str(tmp_path / "gone" / "m")), Facts(), hostname="x",
                            addresses=set()).here


def test_same_gpus_as_listed_by_collect_env():
    machine = Facts()
    machine.set("gpu.devices", [{"index": 0, "name": "NVIDIA A100-SXM4-80GB"},
                                {"index": 1, "name": "NVIDIA A100-SXM4-80GB"}], "nvml")
    log = _log_facts(gpu__devices=[{"index": 0, "name": "A100-SXM4-80GB"}, {"index": 1, "name": "A100-SXM4-80GB"}])
    assert written_here(log, machine, hostname="x", addresses=set()).here
    one = _log_facts(gpu__devices=[{"index": 0, "name": "A100-SXM4-80GB"}])
    assert not written_here(one, machine, hostname="x", addresses=set()).here


def test_local_addresses_never_loopback():
    assert not any(a.startswith("127.") for a in local_addresses())


def _machine(report: dict) -> dict:
    return report["facts"]["doctor.machine_facts"]["value"]


def test_saved_log_from_elsewhere_keeps_this_machine_out(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(NCCL_LINES + TP_FAILURE)
    report = json.loads(run_cli("--format", "json", str(log)).stdout)
    assert _machine(report)["used"] is False
    assert not any(key.startswith("env.") or fact["source"] in ("env", "nvml") and key.startswith("gpu.")
                   for key, fact in report["facts"].items()), report["facts"].keys()
    assert report["facts"]["log.hostnames"]["value"] == ["gpu-node-3"]
    live = json.loads(run_cli("--format", "json", "--live", str(log)).stdout)
    assert _machine(live)["used"] is True and any(key.startswith("env.") for key in live["facts"])


def test_saved_log_written_here_uses_this_machine(tmp_path):
    host = socket.gethostname()
    log = tmp_path / "server.log"
    log.write_text(NCCL_LINES.replace("gpu-node-3", host) + TP_FAILURE)
    report = json.loads(run_cli("--format", "json", str(log)).stdout)
    assert _machine(report)["used"] is True and host in _machine(report)["reason"]
    assert any(key.startswith("env.") for key in report["facts"])


def test_pipe_is_output_made_here():
    """In the pipe (no file argument, stdin not a terminal) the output is made here now: this machine's
    facts are used without --live, and the reason says so."""
    proc = run_cli("--format", "json", input=TP_FAILURE.encode())
    assert proc.stdout == TP_FAILURE.encode()
    report = json.loads(proc.stderr)
    assert _machine(report)["used"] is True and "runs on this machine" in _machine(report)["reason"]
