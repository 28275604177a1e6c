"""check with a cluster snapshot (the shape `facts --ray` writes): the placement group, node IPs, interfaces,
versions, the model and /dev/shm per node, each predicted with the message vLLM, Ray, NCCL or Gloo prints."""
import json
import re

from conftest import run_cli

MODELS = "tests/fixtures/models"
RAY = "--distributed-executor-backend ray"


def rules(d):
    return [f.rule for f in d.findings]


import pytest  # noqa: E402


@pytest.fixture
def on_cluster(catalog, cluster_snapshot):
    def run(nodes, cmd, **kw):
        from vllm_doctor.checks.preflight import predict

        return predict(cmd, catalog, snapshot=cluster_snapshot(nodes), live=False, port_probe=None, **kw)
    return run


def test_unsatisfiable_placement_group_gets_the_layout_that_fits(on_cluster):
    # three nodes of 4 H100: tp 8 x pp 2 asks 16 bundles of one GPU, the cluster has 12
    nodes = [{"machine": "h100_sxm_x4"} for _ in range(3)]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = d.findings[0]
    assert f.rule == "parallel-exceeds-gpus"
    assert "Cannot provide a placement group requiring 16 GPUs" in f.evidence[0].message
    assert f.facts["cluster_gpus"] == 12
    # tp stays within a node (4 GPUs), pp spans the three nodes: 4 x 3 = 12
    assert re.search(r"(-tp|--tensor-parallel-size) 4 (-pp|--pipeline-parallel-size) 3\b", f.fix_command), f.fix_command
    # the same launch on three nodes of 8 H100 fits
    big = on_cluster([{"machine": "h100_sxm_x8"} for _ in range(3)], f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    assert "parallel-exceeds-gpus" not in rules(big)


def test_driver_node_without_a_gpu(on_cluster):
    nodes = [{"machine": None, "driver": True}, {"machine": "h100_sxm_x8", "driver": False}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-2-13b -tp 4 {RAY}")
    f = d.findings[0]
    assert f.rule == "parallel-exceeds-gpus" and "Current node has no GPU available" in f.evidence[0].message
    assert "10.0.0.1" in f.facts["why"]


def test_duplicate_vllm_host_ip_names_the_node_and_the_variable(on_cluster):
    nodes = [{"machine": "h100_sxm_x8", "vars": {"VLLM_HOST_IP": "10.0.0.1"}},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "vars": {"VLLM_HOST_IP": "10.0.0.1"}}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = next(f for f in d.findings if f.rule == "nccl-network")
    assert "Every node should have a unique IP address. Got 2 nodes" in f.evidence[0].message
    assert "1 unique IP addresses ['10.0.0.1']" in f.evidence[0].message
    # the node whose copy is wrong, and its own address
    assert "on 10.0.0.2: vllm_host_ip=10.0.0.2" in f.fix.summary.lower(), f.fix.summary
    assert "10.0.0.1 (driver)" not in f.fix.summary      # its VLLM_HOST_IP is its own
    # 0.34.0 no longer compares the nodes' IPs (nor pins the first bundle to the driver's node)
    newer = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}", vllm_version="0.34.0")
    assert "nccl-network" not in rules(newer)


def test_distinct_ips_are_fine(on_cluster):
    nodes = [{"machine": "h100_sxm_x8", "vars": {"VLLM_HOST_IP": "10.0.0.1"}},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "vars": {"VLLM_HOST_IP": "10.0.0.2"}}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    assert rules(d) == [], [(f.rule, f.evidence[0].message) for f in d.findings]
    assert all(c.ran for c in d.coverage if c.label.startswith("cluster:") and "model" not in c.label)


def test_socket_interface_missing_on_one_node(on_cluster):
    nodes = [{"machine": "h100_sxm_x8", "vars": {"NCCL_SOCKET_IFNAME": "ens5"},
              "interfaces": {"lo": "127.0.0.1", "ens5": "10.0.0.1"}},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "vars": {"NCCL_SOCKET_IFNAME": "ens5"},
              "interfaces": {"lo": "127.0.0.1", "eth0": "10.0.0.2"}}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = d.findings[0]
    assert f.rule == "nccl-network" and "no socket interface found" in f.evidence[0].message
    assert f.facts["node"] == "10.0.0.2"
    assert "on 10.0.0.2: nccl_socket_ifname=eth0" in f.fix.summary.lower(), f.fix.summary
    # a prefix NCCL accepts (`eth` matches eth0) and an exclusion list are no finding
    for value in ("eth,ens", "^docker,lo"):
        ok = [dict(n, vars={"NCCL_SOCKET_IFNAME": value}) for n in nodes]
        ok[0]["interfaces"] = {"lo": "127.0.0.1", "eth1": "10.0.0.1"}
        assert rules(on_cluster(ok, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")) == [], value


def test_gloo_interface_is_matched_exactly(on_cluster):
    # Gloo opens the device by its exact name: `eth` is no interface for it (NCCL would take it as a prefix)
    nodes = [{"machine": "h100_sxm_x8", "vars": {"GLOO_SOCKET_IFNAME": "eth"}},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "vars": {"GLOO_SOCKET_IFNAME": "eth0"}}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = d.findings[0]
    assert f.rule == "nccl-network" and "Unable to find address for: eth" in f.evidence[0].message
    assert f.facts["node"] == "10.0.0.1 (driver)"


def test_versions_differ_across_nodes(on_cluster):
    nodes = [{"machine": "h100_sxm_x8"},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "versions": {"vllm": "0.31.0", "torch": "2.10.0", "ray": "2.60.0"}}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = d.findings[0]
    assert f.rule == "cluster-version-mismatch" and f.facts["package"] == "vllm"
    assert "On 10.0.0.2: pip install 'vllm==0.32.0'" in f.fix.summary, f.fix.summary
    ray = [{"machine": "h100_sxm_x8"},
           {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "versions": {"vllm": "0.32.0", "torch": "2.10.0", "ray": "2.54.0"}}]
    f = on_cluster(ray, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}").findings[0]
    assert f.rule == "cluster-version-mismatch" and "Version mismatch: The cluster was started with" in f.evidence[0].message


def test_model_missing_on_a_worker_node(on_cluster):
    model = "/models/llama-3-70b"
    nodes = [{"machine": "h100_sxm_x8", "model": model},
             {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "model": model, "model_present": False}]
    d = on_cluster(nodes, f"vllm serve {model} -tp 8 -pp 2 {RAY}")
    f = next(f for f in d.findings if f.rule == "model-not-found")
    assert f.facts["node"] == "10.0.0.2"


def test_small_shm_on_one_node(on_cluster):
    nodes = [{"machine": "h100_sxm_x8"}, {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "shm_gib": 0.0625}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    f = next(f for f in d.findings if f.rule == "nccl-shm")
    assert f.facts["node"] == "10.0.0.2" and "64 MiB" in f.facts["reason"]


def test_an_unreachable_node_makes_the_cluster_checks_incomplete(on_cluster):
    nodes = [{"machine": "h100_sxm_x8"}, {"machine": "h100_sxm_x8", "ip": "10.0.0.2", "state": "unreachable",
                                          "why": "no answer within 30 s"}]
    d = on_cluster(nodes, f"vllm serve {MODELS}/llama-3-70b -tp 8 -pp 2 {RAY}")
    pg = next(c for c in d.coverage if c.label.startswith("cluster: the placement group"))
    assert not pg.ran and "10.0.0.2 (unreachable)" in pg.why
    assert d.status == "unchecked"


def test_cli_check_with_a_cluster_snapshot(cluster_snapshot):
    snap = cluster_snapshot([{"machine": "h100_sxm_x4"} for _ in range(3)])
    proc = run_cli("check", "--format", "json", "--facts", snap, "--",
                   "vllm", "serve", f"{MODELS}/llama-3-70b", "-tp", "8", "-pp", "2", "--distributed-executor-backend", "ray")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["findings"][0]["rule"] == "parallel-exceeds-gpus"
    # the same snapshot read by the log diagnosis: the cluster's facts are there
    proc = run_cli("facts", "--facts", snap, "--format", "json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["facts"]["cluster.nodes"]["value"]) == 3


def test_facts_anonymize_masks_the_nodes_of_a_cluster_snapshot(cluster_snapshot):
    """`facts --facts cluster.json --anonymize`, text and JSON: no node's host name or address is shown
    (in JSON a host name stands alone in its field: the key says what it is); the control shows them."""
    nodes = [{"machine": "h100_sxm_x4", "hostname": f"trainer-{c}", "ip": f"10.42.7.{i + 11}"}
             for i, c in enumerate("abc")]
    snap = cluster_snapshot(nodes)
    names = [n["hostname"] for n in nodes] + [n["ip"] for n in nodes]
    for fmt in ("text", "json"):
        plain = run_cli("facts", "--facts", snap, "--format", fmt)
        shown = [n for n in names if n in plain.stdout.decode()]
        assert plain.returncode == 0 and (shown == names if fmt == "json" else shown), (fmt, shown)
        masked = run_cli("facts", "--facts", snap, "--format", fmt, "--anonymize")
        out = masked.stdout.decode()
        assert masked.returncode == 0 and [n for n in names if n in out] == [], (fmt, out[:3000])
        if fmt == "json":
            assert len(json.loads(out)["facts"]["cluster.nodes"]["value"]) == 3
