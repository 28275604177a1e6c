"""facts --ray on a real Ray cluster on this machine (ray.cluster_utils.Cluster: several raylets on one host),
no mock of Ray's API. Skipped where Ray is not installed (`pip install -e '.[ray]'`; CI installs it).

The cluster: a head and three worker nodes, each with one "GPU" resource (Ray schedules on the resource, which
is what vLLM's placement group asks for; this host has no NVIDIA GPU, so NVML has none to report). Two
workers carry the same VLLM_HOST_IP, as when an exported variable is copied to every node."""
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

MODELS = "tests/fixtures/models"
COPIED_IP = "10.0.0.2"
LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster():
    import os

    # every raylet on loopback: by default Ray binds the host's interface address, which tests never use
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1,
                                                                    "node_ip_address": LOOPBACK})
    saved = os.environ.get("VLLM_HOST_IP")
    nodes = {}
    try:
        for name, env in (("b", {"VLLM_HOST_IP": COPIED_IP}), ("c", {"VLLM_HOST_IP": COPIED_IP}), ("d", {})):
            os.environ.pop("VLLM_HOST_IP", None)
            os.environ.update(env)        # a raylet (and the workers it starts) inherits the environment
            nodes[name] = c.add_node(num_cpus=1, num_gpus=1, resources={f"node_{name}": 1},
                                     node_ip_address=LOOPBACK)
        c.wait_for_nodes()
    finally:
        os.environ.pop("VLLM_HOST_IP", None)
        if saved is not None:
            os.environ["VLLM_HOST_IP"] = saved
    c.named = nodes
    yield c
    c.shutdown()


def test_facts_ray_one_entry_per_node_and_the_snapshot_round_trips(cluster, tmp_path):
    model = str(Path(MODELS).resolve())       # workers do not run in the caller's directory: absolute
    proc = run_cli("facts", "--ray", cluster.address, "--ray-timeout", "60", "--model", model, "--format", "json",
                   timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    nodes = doc["nodes"]
    assert len(nodes) == 4 and all(n["state"] == "ok" for n in nodes), [(n["ip"], n["state"], n["why"]) for n in nodes]
    assert sum(n["driver"] for n in nodes) == 1
    host_ips = sorted(n["snapshot"]["facts"]["env.vars"]["value"].get("VLLM_HOST_IP", "-") for n in nodes)
    assert host_ips == ["-", "-", COPIED_IP, COPIED_IP]
    # every node looked for the model itself
    assert all(n["snapshot"]["facts"]["node.model_present"]["value"]["present"] for n in nodes)
    assert all(n["resources"].get("GPU") == 1.0 for n in nodes)
    snap = tmp_path / "cluster.json"
    snap.write_bytes(proc.stdout)

    # the snapshot through --facts: check predicts vLLM's failures on this cluster
    launch = ["vllm", "serve", f"{MODELS}/llama-2-13b", "--distributed-executor-backend", "ray"]
    proc = run_cli("check", "--format", "json", "--facts", str(snap), "--", *launch, "-tp", "4")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    rules = [f["rule"] for f in report["findings"]]
    assert "nccl-network" in rules, rules      # two nodes report 10.0.0.2: "Every node should have a unique IP"
    net = next(f for f in report["findings"] if f["rule"] == "nccl-network")
    assert "Every node should have a unique IP address. Got 4 nodes" in net["evidence"][0]["text"]
    proc = run_cli("check", "--format", "json", "--facts", str(snap), "--", *launch, "-tp", "8")
    report = json.loads(proc.stdout)
    top = report["findings"][0]
    assert top["rule"] == "parallel-exceeds-gpus", [f["rule"] for f in report["findings"]]
    assert "Cannot provide a placement group requiring 8 GPUs" in top["evidence"][0]["text"]
    # the text view: one line per node
    proc = run_cli("facts", "--ray", cluster.address, "--ray-timeout", "60", timeout=180)
    assert proc.returncode == 0 and proc.stdout.decode().count(f"VLLM_HOST_IP={COPIED_IP}") == 2, proc.stdout


PROBE = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    from vllm_doctor.facts.node_probe import probe_node
    from vllm_doctor.facts.ray_cluster import gather_cluster

    MARK = Path(sys.argv[2])

    def probe(model=None):          # defined in __main__: Ray ships it by value to every node
        import ray
        if ray.get_runtime_context().get_assigned_resources().get("node_d") is None and \\
                "node_d" in ray.cluster_resources() and _on_d():
            MARK.write_text("probing")
            time.sleep(120)         # the test kills this node meanwhile
        return probe_node(model)

    def _on_d():
        import ray
        me = ray.get_runtime_context().get_node_id()
        return any(n["NodeID"] == me and "node_d" in n["Resources"] for n in ray.nodes())

    t = time.monotonic()
    doc = gather_cluster(sys.argv[1], timeout_s=float(sys.argv[3]), probe=probe)
    print(json.dumps({"elapsed": time.monotonic() - t, "doc": doc}))
''')


def test_a_node_killed_mid_probe_is_unreachable_within_the_timeout(cluster, tmp_path):
    script, mark = tmp_path / "probe.py", tmp_path / "probing"
    script.write_text(PROBE)
    timeout = 45
    proc = subprocess.Popen([sys.executable, str(script), cluster.address, str(mark), str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not mark.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert mark.exists(), proc.communicate(timeout=30)
    cluster.remove_node(cluster.named["d"])          # the node dies while its probe runs
    out, err = proc.communicate(timeout=timeout + 60)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # one host: every node has its IP, so they are told apart by node id
    states = {n["node_id"] + ("/d" if "node_d" in n["resources"] else ""): (n["state"], n["why"])
              for n in result["doc"]["nodes"]}
    dead = [s for k, s in states.items() if k.endswith("/d")]
    assert dead and dead[0][0] == "unreachable" and "NodeDiedError" in dead[0][1], states
    assert sum(s == "ok" for s, _ in states.values()) == 3, states
    assert result["elapsed"] < timeout + 10, result["elapsed"]

    # probed again after its death: Ray lists the node as dead, the others answer
    proc = run_cli("facts", "--ray", cluster.address, "--ray-timeout", "60", "--format", "json", timeout=180)
    nodes = json.loads(proc.stdout)["nodes"]
    gone = [n for n in nodes if "node_d" in n["resources"]]
    assert gone == [] or gone[0]["state"] == "dead", gone
    assert sum(n["state"] == "ok" for n in nodes) == 3


def test_no_cluster_is_a_one_line_error(tmp_path):
    proc = run_cli("facts", "--ray", "127.0.0.1:1", "--ray-timeout", "5", timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.decode()
    assert "cannot connect to a Ray cluster at 127.0.0.1:1" in err and "Traceback" not in err, err
