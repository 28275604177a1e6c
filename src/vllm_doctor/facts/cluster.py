"""Cluster snapshots: one facts snapshot per node of a Ray cluster, in one file.

Format: {"schema_version": 1, "kind": "vllm-doctor-cluster", "address": str, "timeout_s": float,
"nodes": [{"node_id", "ip", "state": "ok" | "unreachable" | "dead", "why", "driver": bool,
"resources": {...}, "snapshot": <facts snapshot of that node or null>}]}.

Loading one (`--facts CLUSTER.json`) sets the fact cluster.nodes, one summary per node (ClusterNode as a
dict: what the cluster checks compare), and the driver node's own facts as this run's machine facts: the
driver is where `vllm serve` runs, so its GPUs are the ones a single-node check would look at.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .snapshot_format import CLUSTER_KIND as KIND
from .snapshot_format import SOURCE, SnapshotError, facts_from_json, shaped
SCHEMA_VERSION = 1
STATES = ("ok", "unreachable", "dead")
GIB_MIB = 1024


@dataclass
class ClusterNode:
    node_id: str
    ip: str
    state: str                       # ok: the probe answered; unreachable: it did not in time; dead: Ray says so
    why: str = ""
    driver: bool = False
    ray_gpus: float | None = None    # the GPU resource Ray schedules on (what a placement group sees)
    hostname: str | None = None
    gpus: int | None = None          # NVML's count on the node (after CUDA_VISIBLE_DEVICES)
    gpu_names: list[str] = field(default_factory=list)
    gpu_total_gib: float | None = None
    vars: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    shm_total_bytes: int | None = None
    interfaces: dict[str, str | None] = field(default_factory=dict)
    model: dict[str, Any] | None = None      # {"model", "present", "where"}

    @property
    def host_ip(self) -> str:
        """The address vLLM's workers report for this node: VLLM_HOST_IP when set there, else Ray's."""
        return self.vars.get("VLLM_HOST_IP") or self.ip

    @property
    def label(self) -> str:
        return f"{self.ip}{' (driver)' if self.driver else ''}"

    @property
    def own_interface(self) -> str | None:
        """The interface carrying the address Ray knows the node by."""
        return next((name for name, ip in self.interfaces.items() if ip == self.ip), None)


def sharing_an_ip(nodes: list[ClusterNode]) -> list[ClusterNode]:
    """The nodes whose workers would report an address another node reports too (vLLM's unique-IP rule)."""
    from collections import Counter

    count = Counter(n.host_ip for n in nodes)
    return [n for n in nodes if count[n.host_ip] > 1]


def version_spread(nodes: list[ClusterNode], package: str) -> tuple[ClusterNode, str | None, list[ClusterNode]] | None:
    """(the driver node, its version of `package`, the nodes with another) when the nodes differ; None when
    they agree or none has the package."""
    seen = {n.versions.get(package) for n in nodes}
    if len(seen) < 2 or seen == {None}:
        return None
    driver = next((n for n in nodes if n.driver), nodes[0])
    want = driver.versions.get(package)
    return driver, want, [n for n in nodes if n.versions.get(package) != want]


def _summary(entry: dict, values: dict[str, Any]) -> ClusterNode:
    devices = [d for d in values.get("gpu.devices") or [] if isinstance(d, dict)]
    mib = [d.get("memory_total_mib") for d in devices if isinstance(d.get("memory_total_mib"), (int, float))]
    count = values.get("gpu.count")
    resources = entry.get("resources") if isinstance(entry.get("resources"), dict) else {}
    ray_gpus = resources.get("GPU")
    return ClusterNode(
        node_id=str(entry.get("node_id", "")), ip=str(entry.get("ip", "")), state=str(entry.get("state", "ok")),
        why=str(entry.get("why") or ""), driver=bool(entry.get("driver")),
        ray_gpus=float(ray_gpus) if isinstance(ray_gpus, (int, float)) else None,
        hostname=values.get("net.hostname") if isinstance(values.get("net.hostname"), str) else None,
        gpus=count if isinstance(count, int) else (len(devices) if devices else None),
        gpu_names=[str(d.get("name")) for d in devices if d.get("name")],
        gpu_total_gib=round(min(mib) / GIB_MIB, 2) if mib else None,
        vars={str(k): str(v) for k, v in (values.get("env.vars") or {}).items()}
        if isinstance(values.get("env.vars"), dict) else {},
        versions={str(k): str(v) for k, v in (values.get("env.versions") or {}).items()}
        if isinstance(values.get("env.versions"), dict) else {},
        shm_total_bytes=values.get("env.shm_total_bytes") if isinstance(values.get("env.shm_total_bytes"), int) else None,
        interfaces={str(k): v for k, v in (values.get("net.interfaces") or {}).items()}
        if isinstance(values.get("net.interfaces"), dict) else {},
        model=values.get("node.model_present") if isinstance(values.get("node.model_present"), dict) else None)


def missing_interfaces(var: str, value: str, interfaces: dict) -> list[str]:
    """The names in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME that no interface of the node answers to.
    NCCL takes prefixes (`eth` matches eth0), `=eth0` exactly, `^docker` as exclusions, and needs one
    match; Gloo opens a device per comma-separated name, each by its exact name."""
    exact = var.startswith("GLOO") or value.startswith("=")
    if value.startswith("^") or not interfaces:
        return []
    names = [v for v in value.lstrip("=").split(",") if v]
    hit = lambda want: any(have == want if exact else have.startswith(want) for have in interfaces)  # noqa: E731
    if var.startswith("GLOO"):
        return [w for w in names if not hit(w)]
    return [] if any(hit(w) for w in names) else names


def schedulable_gpus(node: ClusterNode) -> int:
    """The GPUs a placement group can take on the node: Ray's GPU resource (what it schedules on), else
    NVML's count."""
    if node.ray_gpus is not None:
        return int(node.ray_gpus)
    return node.gpus or 0


def summarize(data: dict) -> list[ClusterNode]:
    """The nodes of a cluster document (as gather_cluster returns it), summarized."""
    out = []
    for entry in data.get("nodes") or []:
        snap = entry.get("snapshot")
        values = {k: v.get("value") for k, v in (snap or {}).get("facts", {}).items() if isinstance(v, dict)}
        out.append(_summary(entry, {k: shaped(k, v) for k, v in values.items()}))
    return out


def nodes_from_facts(facts) -> list[ClusterNode]:
    """The cluster.nodes fact back as ClusterNodes ([] without a cluster snapshot)."""
    raw = facts.get("cluster.nodes") or []
    return [ClusterNode(**n) for n in raw if isinstance(n, dict)]


def load_cluster(data: dict, path, facts) -> list[str]:
    """Read a cluster document into facts; SnapshotError (one line) when it cannot be used."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise SnapshotError(f"{path}: unsupported cluster snapshot schema_version {data.get('schema_version')!r} "
                             f"(expected {SCHEMA_VERSION})")
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise SnapshotError(f"{path}: 'nodes' must be a non-empty list of objects")
    nodes, driver_values = [], None
    for entry in entries:
        if entry.get("state", "ok") not in STATES:
            raise SnapshotError(f"{path}: node state {entry.get('state')!r} is not one of {', '.join(STATES)}")
        snap = entry.get("snapshot")
        values = facts_from_json(snap, path) if isinstance(snap, dict) else {}
        node = _summary(entry, {k: shaped(k, v) for k, v in values.items()})
        nodes.append(node)
        if node.driver and node.state == "ok":
            driver_values = values
    for key, value in (driver_values or {}).items():
        kept = shaped(key, value)
        if kept is not None:
            facts.set(key, kept, SOURCE)
    facts.set("cluster.nodes", [asdict(n) for n in nodes], SOURCE)
    alive = [n for n in nodes if n.state != "dead"]
    per_node = [g for n in alive if (g := schedulable_gpus(n))]
    if per_node:
        facts.set("cluster.gpus_per_node", min(per_node), SOURCE)
    facts.set("cluster.address", str(data.get("address") or ""), SOURCE)
    missing = [n.label for n in nodes if n.state != "ok"]
    return [f"{path}: no facts from node{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"({', '.join(sorted({n.state for n in nodes if n.state != 'ok'}))})"] if missing else []


def cluster_document(address: str, timeout_s: float, nodes: list[dict]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "address": address, "timeout_s": timeout_s,
            "nodes": nodes}
