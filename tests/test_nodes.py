"""Per-node diagnosis of multi-node logs (events/nodes.py): which node failed first, who followed."""
import json

from conftest import run_cli

# Written variant (not a copied log) of logs_corpus/nccl/n21's shape, as `kubectl logs --prefix` prints a
# LeaderWorkerSet of two pods: the worker pod loses its GPU memory first, the leader's engine then fails.
KUBE = """\
[pod/vllm-0/vllm] INFO 11-02 16:20:01 [api_server.py:1090] vLLM API server version 0.10.1.1
[pod/vllm-0/vllm] INFO 11-02 16:20:55 [ray_distributed_executor.py:183] use_ray_spmd_worker: True
[pod/vllm-0-1/vllm] (RayWorkerWrapper pid=311) ERROR 11-02 16:21:40 [worker_base.py:620] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 79.15 GiB of which 2.91 GiB is free.
[pod/vllm-0/vllm] (EngineCore_0 pid=98) ERROR 11-02 16:21:52 [core.py:700] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)
"""


def test_kubectl_pod_prefixes_name_the_nodes(tmp_path):
    log = tmp_path / "lws.log"
    log.write_text(KUBE)
    proc = run_cli("--no-live", "--format", "json", str(log))
    report = json.loads(proc.stdout)
    assert report["findings"][0]["rule"] == "cuda-oom-runtime"
    nodes = report["nodes"]
    assert nodes["failed_first"] == "pod/vllm-0-1" and nodes["line"] == 3
    assert nodes["process"] == "RayWorkerWrapper pid=311" and nodes["rank"] is None
    assert [f["node"] for f in nodes["followed"]] == ["pod/vllm-0"]
    assert report["first_failure"] == {"node": "pod/vllm-0-1", "process": "RayWorkerWrapper pid=311", "rank": None,
                                       "line": 3}
    # one entry per node: its processes and its first fatal line
    entries = {e["node"]: e for e in nodes["nodes"]}
    assert entries["pod/vllm-0-1"]["processes"] == ["RayWorkerWrapper pid=311"]
    assert entries["pod/vllm-0-1"]["first_fatal"] == {"rule": "cuda-oom-runtime", "line": 3}
    assert entries["pod/vllm-0"]["processes"] == ["EngineCore_0 pid=98"]
    assert entries["pod/vllm-0"]["first_fatal"]["line"] == 4
    text = " ".join(run_cli("--no-live", str(log)).stdout.decode().split())
    assert f"--> {log}:3 on node pod/vllm-0-1 (RayWorkerWrapper pid=311) |" in text, text
    assert "= nodes: pod/vllm-0 followed with" in text, text


def test_an_nccl_hostname_under_ip_is_that_node_and_without_it_the_driver(tmp_path):
    from vllm_doctor.events.nodes import DRIVER, NodeTracker
    from vllm_doctor.sources.lines import parse_line

    t = NodeTracker()
    lines = [parse_line("(RayWorkerWrapper pid=7, ip=10.0.0.2) gpu-b:7:90 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>"),
             parse_line("gpu-b:7:91 [0] NCCL WARN socketStartConnect: Connect to 10.0.0.1<4> failed : Connection refused"),
             parse_line("gpu-a:3:30 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")]
    for line in lines:
        t.feed(line)
    assert [t.node_of(x) for x in lines] == ["10.0.0.2", "10.0.0.2", DRIVER]
    assert set(t.nodes()) == {DRIVER, "10.0.0.2"}


def test_one_machine_has_no_node_story():
    proc = run_cli("--no-live", "--format", "json", "logs_corpus/nccl/n01-custom-ar-4090.log")
    report = json.loads(proc.stdout)
    assert "nodes" not in report
    first = report["first_failure"]
    assert first["node"] is None and first["line"] == report["findings"][0]["evidence"][0]["line"]
    text = run_cli("--no-live", "logs_corpus/nccl/n01-custom-ar-4090.log").stdout.decode()
    assert " on node " not in text and "= nodes:" not in text


def test_a_multi_process_line_names_its_process_and_rank():
    from vllm_doctor.events.nodes import process_of
    from vllm_doctor.sources.lines import parse_line

    cases = {"(RayWorkerWrapper pid=1320, ip=10.0.0.2) [rank1]:[E ProcessGroupNCCL.cpp:629] x":
             ("RayWorkerWrapper pid=1320", 1),
             "(VllmWorker rank=3 pid=77) ERROR 06-01 10:00:00 [multiproc_executor.py:1] x": ("VllmWorker pid=77", 3),
             "(EngineCore_DP1 pid=5) ERROR 06-01 10:00:00 [core.py:1] x": ("EngineCore_DP1 pid=5", None),
             "[rank8]:[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed": (None, 8),
             "ERROR 06-01 10:00:00 [core.py:1] x": (None, None)}
    for text, expected in cases.items():
        assert process_of(parse_line(text)) == expected, text


def test_the_ray_network_fix_names_the_worker_node_and_its_variables():
    """n09: the Gloo full mesh fails on the worker 10.41.0.8: the fix says to set the interface variables
    where Ray starts on that node (GLOO_* never travels from the head's `vllm serve`). n08 fails on the
    driver's node: no worker to name, the head's command is the place."""
    report = json.loads(run_cli("--no-live", "--format", "json", "logs_corpus/nccl/n09-gloo-fullmesh.log").stdout)
    fix = report["findings"][0]["fix"]
    assert "on 10.41.0.8" in fix["summary"] and "GLOO_SOCKET_IFNAME=<its interface> ray start" in fix["summary"]
    assert report["findings"][0]["facts"].get("failed_first_on") == "10.41.0.8"
    report = json.loads(run_cli("--no-live", "--format", "json", "logs_corpus/nccl/n08-ray-multinode-nic.log").stdout)
    assert report["nodes"]["failed_first"] == "the driver's node"
    assert "ray start" not in report["findings"][0]["fix"]["summary"]
    # --anonymize masks the nodes' addresses, never the story's own words for the driver
    text = run_cli("--no-live", "--anonymize", "logs_corpus/nccl/n08-ray-multinode-nic.log").stdout.decode()
    assert "on the driver's node" in text and "<host-" not in text.split("\n")[1], text


def test_two_nodes_failing_in_the_same_second_are_not_ordered(tmp_path):
    """Both pods print the OOM at 16:21:40: the merged log's order (Ray and kubectl forward lines late)
    cannot say which was first, and the report says so; a second later on one of them, it can."""
    lines = KUBE.splitlines()
    twin = ("[pod/vllm-0/vllm] (RayWorkerWrapper pid=120) ERROR 11-02 16:21:40 [worker_base.py:620] "
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 1 has a total capacity "
            "of 79.15 GiB of which 2.91 GiB is free.")
    log = tmp_path / "tied.log"
    log.write_text("\n".join([*lines[:3], twin, *lines[3:]]) + "\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["nodes"]["failed_first"] == "pod/vllm-0-1" and report["nodes"]["undecided_with"] == ["pod/vllm-0"]
    text = " ".join(run_cli("--no-live", str(log)).stdout.decode().split())
    assert "on node pod/vllm-0-1 (RayWorkerWrapper pid=311) or pod/vllm-0 |" in text, text
    assert "the log cannot tell whether pod/vllm-0-1 or pod/vllm-0 failed first" in text, text
    log.write_text("\n".join([*lines[:3], twin.replace("16:21:40", "16:21:41"), *lines[3:]]) + "\n")
    report = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    assert report["nodes"]["undecided_with"] == []


def test_a_failure_no_rule_names_still_says_which_node_crashed_first():
    """real/multinode: rmn05's remote worker segfaults in NCCL (`*** SIGSEGV received` under its ip=) before
    the driver's ActorDiedError, the evidence; rmn01's raylet check fails on its node. first_failure names
    the node as the thread does; a paste with no node on any error line names none (rmn03, one machine)."""
    expected = {"rmn05-v1-tp16-remote-worker-nccl-segfault": "10.52.51.232",
                "rmn01-ray-cgraph-raylet-checkfail-worker-node": "172.27.221.101",
                "rmn06-ray-host-oom-node-29.45.33.204": "29.45.33.204",     # Ray's OOM killer names it
                "rmn04-ray-cgraph-raylet-checkfail-driver-node": "the driver's node",   # its raylet, no ip=
                "rmn03-mp-tp8-worker1-died": None}
    for name, node in expected.items():
        report = json.loads(run_cli("--no-live", "--format", "json", f"logs_corpus/real/multinode/{name}.log").stdout)
        assert report["findings"][0]["rule"] == "unrecognized"
        assert report["first_failure"]["node"] == node, (name, report["first_failure"])
