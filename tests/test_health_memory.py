"""`health`'s memory side on fake NVML machines, joined with real /metrics bodies: a GPU of the server's group
holding more than the server's budget (total x its own gpu_memory_utilization, plus what vLLM keeps outside
it), and the processes NVML lists there that are not the server's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("prometheus_client")

H100_MIB = 81559           # the fake H100's total (79.6 GiB)
BUDGET_MIB = int(0.9 * H100_MIB)     # what a 0.9 server holds, CUDA graphs inside the budget
SERVER_PIDS = frozenset({100, 101, 102})     # the API server, then its two workers (what NVML lists)


def gpu_facts(fake_nvml, used: dict[int, int], procs: dict[int, list] | None = None):
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.nvml import collect_gpu_facts

    nvml = fake_nvml.h100_sxm_x8()
    for index, mib in used.items():
        nvml.machine.gpus[index].used_mib = mib
    for index, listed in (procs or {}).items():
        nvml.machine.gpus[index].processes = listed
    facts = Facts()
    collect_gpu_facts(facts, nvml, environ={})
    return facts


def metrics(name: str):
    from vllm_doctor.facts.server_metrics import figures

    return figures((ROOT / "tests" / "data" / "health" / name).read_text())


OLD_GEN = "old-gen-qwen3vl-issue55.metrics"      # a real GPU server's body: gpu_memory_utilization="0.9"


def over(command: str, facts, version: str | None, body: str = OLD_GEN, pids=SERVER_PIDS, environ=None):
    from vllm_doctor.checks.health_memory import over_budget
    from vllm_doctor.command import Command

    return over_budget(Command.parse(command), facts, environ or {}, metrics(body), version, pids)


def test_a_leftover_process_on_a_gpu_of_the_group_is_named(fake_nvml, catalog):
    from vllm_doctor.checks.preflight import finding_for

    leftover = 6 * 1024
    facts = gpu_facts(fake_nvml, {0: BUDGET_MIB + 500, 1: BUDGET_MIB + 500 + leftover},
                      {0: [(101, "python3", BUDGET_MIB)],
                       1: [(102, "python3", BUDGET_MIB), (4242, "VLLM::EngineCore", leftover)]})
    [p] = over("vllm serve Qwen/Qwen3-VL-8B-Instruct -tp 2", facts, "0.32.0")
    assert p.rule == "server-memory-unexplained" and p.confidence == "high"
    assert p.message.startswith("vllm-doctor health: GPU 1 of the server's 2 (-tp 2 on GPUs 0,1) holds 78.2 GiB, "
                                "6.5 GiB more than the server's budget of 71.7 GiB (0.9 x 79.6 GiB, the server's "
                                "cache info)")
    assert p.message.endswith("not the server's: pid 4242 (VLLM::EngineCore) 6.0 GiB")
    f = finding_for(p, catalog, facts, None, 1, source="health", title_prefix="")
    assert f.rule == "server-memory-unexplained" and "GPU 1 (pid 4242" in f.fix.summary
    assert f.fix.arithmetic == ["GPU 1: 78.2 GiB held - 71.7 GiB budget (0.9 x 79.6 GiB) = 6.5 GiB the server does "
                                "not count"]


def test_what_the_server_keeps_outside_its_budget_is_no_finding(fake_nvml):
    # a rank at its budget plus the CUDA context: healthy
    assert over("vllm serve m -tp 2", gpu_facts(fake_nvml, {0: BUDGET_MIB + 700, 1: BUDGET_MIB + 700}),
                "0.32.0") == []
    # 4 GiB of CUDA graphs outside the budget: healthy before 0.20.0 (and with --enforce-eager none are made)
    graphs = gpu_facts(fake_nvml, {0: BUDGET_MIB + 4600, 1: BUDGET_MIB + 4600})
    assert over("vllm serve m -tp 2", graphs, "0.19.1") == []
    assert over("vllm serve m -tp 2", graphs, None) == []          # an unknown version: the larger allowance
    # from 0.20.0 the graphs are inside the budget: the same 4.5 GiB is someone else's
    [p] = over("vllm serve m -tp 2", graphs, "0.20.0")
    assert "GPU 0,1 of the server's 2 (-tp 2 on GPUs 0,1) hold up to 76.2 GiB" in p.message
    assert p.confidence == "medium" and "not the server's" not in p.message   # NVML listed no process


def test_no_budget_to_judge(fake_nvml):
    full = gpu_facts(fake_nvml, {0: H100_MIB - 100, 1: H100_MIB - 100})
    # 0.7-0.9.0 counted others' memory inside the budget: a full GPU is no excess of the server's
    assert over("vllm serve m -tp 2", full, "0.8.5") == []
    # a real 0.32 body whose KV cache was given in bytes (kv_cache_memory_bytes="1073741824"): no budget
    assert over("vllm serve m -tp 2", full, "0.32.0", body="v0.32.0-cpu-idle.metrics") == []
    # the launch unknown: no group
    from vllm_doctor.checks.health_memory import over_budget
    assert over_budget(None, full, {}, metrics(OLD_GEN), "0.32.0") == []


def test_the_budget_is_the_servers_own_then_the_launchs(fake_nvml):
    facts = gpu_facts(fake_nvml, {0: H100_MIB - 100})
    [p] = over("vllm serve m", facts, "0.32.0")
    assert "(0.9 x 79.6 GiB, the server's cache info)" in p.message
    # a body without cache info: the launch's flag, else the version's default
    from vllm_doctor.checks.health_memory import over_budget
    from vllm_doctor.command import Command
    from vllm_doctor.facts.server_metrics import Figures

    [q] = over_budget(Command.parse("vllm serve m --gpu-memory-utilization 0.5"), facts, {}, Figures(), "0.32.0")
    assert "(0.5 x 79.6 GiB, the launch)" in q.message
    [r] = over_budget(Command.parse("vllm serve m"), facts, {}, Figures(), "0.32.0")
    assert "(0.92 x 79.6 GiB, vLLM 0.32.0's default)" in r.message


def test_a_container_numbering_processes_otherwise_names_nobody(fake_nvml):
    """NVML lists host PIDs; a server read in a container knows its own PIDs only: none of them is listed, so
    no process is called another's."""
    facts = gpu_facts(fake_nvml, {0: H100_MIB - 100}, {0: [(88001, "python3", BUDGET_MIB), (88002, None, 6000)]})
    [p] = over("vllm serve m", facts, "0.32.0")
    assert "not the server's" not in p.message and p.confidence == "medium"


def test_an_idle_rank_is_judged_before_any_budget(fake_nvml, catalog):
    """A GPU of the group that holds no rank means the ranks are elsewhere: the budget of that group is moot."""
    from test_health import Served, body

    from vllm_doctor.checks.health import Reading, diagnose_server
    from vllm_doctor.command import Command
    from vllm_doctor.facts.server import ServerSample
    from vllm_doctor.facts.server_metrics import figures

    del Served
    text = body(OLD_GEN)
    sample = ServerSample(url="http://127.0.0.1:8000", at=0.0, health_status=200, version="0.32.0",
                          metrics_text=text)
    reading = Reading(sample, sample, figures(text), figures(text))
    command = Command.parse("vllm serve m -tp 2")
    both = diagnose_server(reading, catalog, command, gpu_facts(fake_nvml, {0: H100_MIB - 100, 1: 0}), {})
    assert [f.rule for f in both.findings] == ["server-gpu-idle"]
    one = diagnose_server(reading, catalog, command, gpu_facts(fake_nvml, {0: H100_MIB - 100, 1: H100_MIB - 100}), {})
    assert [f.rule for f in one.findings] == ["server-memory-unexplained"]


def test_the_servers_family_is_read_from_the_process_tree(tmp_path):
    from vllm_doctor.facts.server_process import _family

    def proc(pid: int, ppid: int, name: str = "python3") -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")

    proc(1, 0)
    proc(100, 1)
    proc(101, 100, "VLLM::EngineCore")
    proc(102, 101, "a (odd) name")      # a name with spaces and parentheses
    proc(103, 1)                        # a sibling: not the server's
    assert _family(100, [1, 100, 101, 102, 103], tmp_path) == {100, 101, 102}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the process list is read from /proc")
def test_the_real_process_tree_holds_a_child():
    from vllm_doctor.facts.server_process import _family

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        assert child.pid in _family(os.getpid(), pids, Path("/proc"))
    finally:
        child.kill()
        child.wait(timeout=30)


def test_the_cli_reports_the_excess_from_a_snapshot(fake_nvml, tmp_path):
    """End to end: the real GPU body over HTTP, the GPUs from --facts, the launch from --cmd (its model a local
    directory, read offline)."""
    from test_health import Served, body, handler_for
    from vllm_doctor.facts.snapshot import save_snapshot

    snap = tmp_path / "gpus.json"
    snap.write_text(json.dumps(save_snapshot(gpu_facts(fake_nvml, {0: BUDGET_MIB + 6000}))))
    served = Served([body(OLD_GEN)], version="0.32.0")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(served))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        out = subprocess.run([sys.executable, "-m", "vllm_doctor", "health", f"http://127.0.0.1:{httpd.server_address[1]}",
                              "--interval", "0", "--facts", str(snap), "--cmd",
                              f"vllm serve {ROOT / 'tests' / 'fixtures' / 'models' / 'llama-2-13b'}", "--format",
                              "json"],
                             capture_output=True, timeout=120, cwd=ROOT)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert out.returncode == 1, out.stdout.decode() + out.stderr.decode()
    [finding] = json.loads(out.stdout)["findings"]
    said = finding["evidence"][0]["text"]
    assert finding["rule"] == "server-memory-unexplained" and "5.9 GiB more than the server's budget" in said
    # the launch's model read from its directory, offline: the memory model's share of the budget
    assert "the model's weights 24.2 GiB and KV cache 25.0 GiB of it" in said


def _with_model(facts, name: str):
    from vllm_doctor.facts.model import load_model_facts

    assert load_model_facts(str(ROOT / "tests" / "fixtures" / "models" / name), facts) is None
    return facts


def test_the_models_share_is_said_beside_the_budget(fake_nvml, catalog):
    """Llama-2-13B's config: 24.2 GiB of weights on one GPU, and the old body's 32768 KV tokens at 800 KiB each."""
    from vllm_doctor.checks.preflight import finding_for

    facts = _with_model(gpu_facts(fake_nvml, {0: H100_MIB - 100}), "llama-2-13b")
    [p] = over("vllm serve meta-llama/Llama-2-13b-hf", facts, "0.32.0")
    assert "; the model's weights 24.2 GiB and KV cache 25.0 GiB of it" in p.message
    f = finding_for(p, catalog, facts, None, 1, source="health", title_prefix="")
    assert f.fix.arithmetic[1].startswith("of the budget, the model's weights take 24.2 GiB per GPU and its KV cache "
                                          "25.0 GiB")


def test_a_kv_cache_given_in_bytes_is_judged_by_the_models_share(fake_nvml):
    """A real 0.32 body whose KV cache was sized in bytes (1280 tokens): no budget, so the model's weights plus
    that cache (24.2 + 1.0 GiB for Llama-2-13B) and a few GiB beside them bound what the rank holds."""
    body = "v0.32.0-cpu-idle.metrics"
    fits = _with_model(gpu_facts(fake_nvml, {0: 28 * 1024}), "llama-2-13b")
    assert over("vllm serve m", fits, "0.32.0", body=body) == []
    shared = _with_model(gpu_facts(fake_nvml, {0: 40 * 1024}), "llama-2-13b")
    [p] = over("vllm serve m", shared, "0.32.0", body=body)
    assert ("holds 40.0 GiB, 14.8 GiB more than the server's budget of 25.2 GiB (weights 24.2 + KV cache 1.0 GiB, "
            "--kv-cache-memory-bytes)") in p.message


def test_a_group_holding_less_than_one_ranks_weights_holds_no_rank(fake_nvml, catalog):
    """With the model's config (Llama-2-13B at -tp 2: 12.1 GiB of weights a rank), a group whose every GPU holds
    almost nothing holds no rank, where comparing its GPUs with each other sees nothing wrong; the ranks' share on
    GPUs 2,3 says where they run (a container's own numbering: its 0,1 are the host's 2,3)."""
    from vllm_doctor.checks.health_gpus import idle_gpus
    from vllm_doctor.checks.health_memory import rank_share
    from vllm_doctor.checks.preflight import finding_for
    from vllm_doctor.command import Command

    facts = _with_model(gpu_facts(fake_nvml, {0: 300, 1: 300, 2: BUDGET_MIB, 3: BUDGET_MIB}), "llama-2-13b")
    command = Command.parse("vllm serve meta-llama/Llama-2-13b-hf -tp 2")
    assert idle_gpus(command, facts, {}) == []            # without the config: nothing to compare with
    weights, _ = rank_share(command, facts, metrics(OLD_GEN))
    [p] = idle_gpus(command, facts, {}, weights)
    assert p.message == ("vllm-doctor health: GPU 0,1 of the server's 2 (-tp 2 on GPUs 0,1) hold 0.3 GiB while one "
                         "rank's weights alone take 12.1 GiB; GPU 2,3, outside them, hold 71.7 GiB")
    f = finding_for(p, catalog, facts, None, 1, source="health", title_prefix="")
    assert f.rule == "server-gpu-idle" and "GPU 2,3 holds what GPU 0,1 should" in f.fix.summary
    # the same group holding its ranks: no finding
    full = _with_model(gpu_facts(fake_nvml, {0: BUDGET_MIB, 1: BUDGET_MIB}), "llama-2-13b")
    assert idle_gpus(command, full, {}, weights) == []
