"""`health`'s GPU side on fake NVML machines: a GPU of the server's group that holds no rank, found from the
launch (its -tp/-pp/-dp and CUDA_VISIBLE_DEVICES) and each GPU's memory; and the launch read from the process
list (a real process on this machine whose argv is a vLLM server's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from conftest import ROOT

RANK_MIB = 73_600          # what one rank of a started server holds on an 80 GB H100 at the default 0.9


def gpu_facts(fake_nvml, used: dict[int, int], machine: str = "h100_sxm_x8"):
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.nvml import collect_gpu_facts

    nvml = getattr(fake_nvml, machine)()
    for index, mib in used.items():
        nvml.machine.gpus[index].used_mib = mib
    facts = Facts()
    collect_gpu_facts(facts, nvml, environ={})
    return facts


def idle(command: str, facts, environ=None):
    from vllm_doctor.checks.health_gpus import idle_gpus
    from vllm_doctor.command import Command

    return idle_gpus(Command.parse(command), facts, environ)


def test_a_rank_share_outside_the_group_means_another_numbering(fake_nvml, catalog):
    from vllm_doctor.checks.preflight import finding_for

    facts = gpu_facts(fake_nvml, {0: RANK_MIB, 1: RANK_MIB, 2: RANK_MIB, 3: 480, 5: RANK_MIB})
    [p] = idle("vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 4", facts, environ={})
    assert p.rule == "server-gpu-idle" and p.confidence == "high"
    assert "GPU 3 of the server's 4 (-tp 4 on GPUs 0,1,2,3) holds 0.5 GiB" in p.message
    assert "GPU 5, outside them, holds 71.9 GiB" in p.message
    f = finding_for(p, catalog, facts, None, 1, source="health", title_prefix="")
    assert {(e.name, e.value) for e in f.fix.edits} == {("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
                                                        ("CUDA_VISIBLE_DEVICES", "0,1,2,3")}


def test_a_rank_missing_with_nothing_elsewhere_points_at_the_log(fake_nvml, catalog):
    from vllm_doctor.checks.preflight import finding_for

    facts = gpu_facts(fake_nvml, {0: RANK_MIB, 1: RANK_MIB, 2: 0, 3: 0})
    [p] = idle("vllm serve m -tp 2 -pp 2", facts)
    assert "GPU 2,3 of the server's 4 (-tp 2 -pp 2 on GPUs 0,1,2,3) hold 0.0 GiB" in p.message
    assert p.confidence == "medium"          # the process's own CUDA_VISIBLE_DEVICES was not read
    f = finding_for(p, catalog, facts, None, 1, source="health", title_prefix="")
    assert f.fix.edits == [] and "log" in f.fix.summary


def test_a_group_whose_every_gpu_holds_its_share_is_healthy(fake_nvml):
    full = gpu_facts(fake_nvml, {i: RANK_MIB for i in range(4)})
    assert idle("vllm serve m -tp 4", full) == []
    # the same machine read with the server's own selection: its group is GPUs 4-7, all holding a rank
    moved = gpu_facts(fake_nvml, {i: RANK_MIB for i in range(4, 8)})
    assert idle("vllm serve m -tp 4", moved, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == []
    assert idle("CUDA_VISIBLE_DEVICES=4,5,6,7 vllm serve m -tp 4", moved) == []
    # two replicas of -tp 2 on four GPUs, and a single-GPU server beside three idle GPUs (nothing wrong)
    assert idle("vllm serve m -tp 2 --data-parallel-size 2", full) == []
    single = gpu_facts(fake_nvml, {0: RANK_MIB})
    assert idle("vllm serve m", single) == []


def test_no_verdict_without_a_started_server_or_beyond_this_machine(fake_nvml):
    # a server still loading holds little anywhere: no rank's share to compare with
    loading = gpu_facts(fake_nvml, {0: 900, 1: 20})
    assert idle("vllm serve m -tp 2", loading) == []
    # a group over nodes (more ranks than GPUs here, or Ray's): this machine holds only a part of it
    part = gpu_facts(fake_nvml, {0: 20_312, 1: 0}, machine="rtx4090_x2")
    assert idle("vllm serve m -tp 4", part) == []
    assert idle("vllm serve m -tp 2 --distributed-executor-backend ray", part) == []


@pytest.fixture
def fake_server_process():
    """A real process whose argv is a vLLM server's: `python -c … vllm serve ./m -tp 4 --port P`."""
    procs = []

    def start(port: int, env: dict[str, str]) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "vllm", "serve", "./m",
                                 "-tp", "4", "--port", str(port)], stdin=subprocess.PIPE,
                                env={**os.environ, **env})
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the process list is read from /proc")
def test_the_launch_is_read_from_the_process_list(fake_server_process):
    from vllm_doctor.facts.server_process import find_server

    port = 18000 + os.getpid() % 1000
    proc = fake_server_process(port, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    deadline = time.monotonic() + 30
    found = None
    while found is None and time.monotonic() < deadline and proc.poll() is None:
        found = find_server(port)          # the child's argv appears once it has exec'd
        time.sleep(0.0 if found else 0.05)
    assert found is not None and found.pid == proc.pid
    assert found.command == f"vllm serve ./m -tp 4 --port {port}"
    assert found.environ == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert find_server(port + 1) is None       # another port: another server


def test_the_vllm_part_of_each_launcher_argv():
    from vllm_doctor.facts.server_process import vllm_argv

    assert vllm_argv(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "-tp", "2"]) == \
        ["vllm", "serve", "m", "-tp", "2"]
    assert vllm_argv(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]) == \
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert vllm_argv(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"]) == ["vllm", "serve", "m"]
    assert vllm_argv(["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]) is None
    assert vllm_argv(["vllm", "bench", "serve"]) is None


def test_the_cli_joins_a_served_body_a_snapshot_and_the_command(fake_nvml, tmp_path):
    """End to end: a real 0.32 body over HTTP, the GPUs from --facts, the launch from --cmd."""
    pytest.importorskip("prometheus_client")
    from test_health import Served, body, handler_for
    from vllm_doctor.facts.snapshot import save_snapshot

    snap = tmp_path / "gpus.json"
    snap.write_text(json.dumps(save_snapshot(gpu_facts(fake_nvml, {0: RANK_MIB, 1: RANK_MIB, 2: RANK_MIB, 3: 480,
                                                                 5: RANK_MIB}))))
    served = Served([body("v0.32.0-cpu-steady-1.metrics"), body("v0.32.0-cpu-steady-2.metrics")])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(served))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = subprocess.run([sys.executable, "-m", "vllm_doctor", "health", f"http://127.0.0.1:{httpd.server_address[1]}",
                              "--interval", "0", "--facts", str(snap), "--cmd", "vllm serve m -tp 4", "--no-color"],
                             capture_output=True, timeout=120, cwd=ROOT)
    finally:
        httpd.shutdown()
        httpd.server_close()
    text = out.stdout.decode()
    assert out.returncode == 1, text + out.stderr.decode()
    assert "error[server-gpu-idle]" in text and "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve" in text


def test_the_group_is_said_in_rank_order(fake_nvml):
    """CUDA_VISIBLE_DEVICES=3,1: rank 0 on GPU 3, rank 1 on GPU 1, which holds nothing."""
    facts = gpu_facts(fake_nvml, {3: RANK_MIB, 1: 0})
    [p] = idle("vllm serve m -tp 2", facts, environ={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert "GPU 1 of the server's 2 (-tp 2 on GPUs 3,1) holds 0.0 GiB" in p.message
