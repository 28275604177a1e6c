"""The checks a cluster snapshot (facts --ray) makes possible: what vLLM's Ray executor will meet on the
cluster's nodes, each predicted with the message vLLM (or Ray, or NCCL) prints for it.

vLLM's rules (vllm/v1/executor/ray_utils.py, initialize_ray_cluster): the placement group is world_size
bundles of {GPU: 1}, the first pinned to the driver's node (`node:<driver ip>: 0.001`), so the driver
node needs a GPU ("Current node has no GPU available", the V0/V1 executors; the newest executor may drop
the pin, hence medium confidence) and the alive nodes together need world_size GPUs, else the group waits
1800 s ("Cannot provide a placement group"). Tensor parallel across nodes is only a warning there
(_verify_bundles): the fix keeps tp within the smallest GPU node. Workers report the node's IP, VLLM_HOST_IP
when set: two nodes with one address stop the executor ("Every node should have a unique IP address").
The 0.34.0 wheel has neither the driver pin nor the unique-IP check: from that release both are skipped.
"""
from __future__ import annotations

from vllm_doctor.command.versions import at_least
from vllm_doctor.facts.cluster import missing_interfaces, nodes_from_facts, schedulable_gpus, sharing_an_ip, version_spread
from vllm_doctor.vllm_math import memory as mm

SHM_MIN_BYTES = 1 << 30
# Present through 0.32.0 (docs/reference/vllm-messages.md), gone in the 0.34.0 wheel: the unique-IP check and
# the driver-node pin of the first bundle (and with it "Current node has no GPU available")
DRIVER_PIN_GONE = "0.34.0"
COMPARED_VERSIONS = ("vllm", "torch", "ray", "transformers", "nvidia-nccl-cu12", "nvidia-nccl-cu13")
NO_CLUSTER = "no cluster snapshot (vllm-doctor facts --ray --format json > cluster.json; then --facts cluster.json)"


class ClusterChecks:
    """Mixin of Checker: needs self.facts, self.command, self.tp, self.pp, self.dp, self.version, self.out."""

    def cluster_steps(self) -> list:
        nodes = nodes_from_facts(self.facts)
        if not nodes:
            return []
        self.nodes = [n for n in nodes if n.state == "ok"]
        self.lost = [n for n in nodes if n.state != "ok"]
        return [("cluster: the placement group fits the nodes", self.placement_group, True),
                ("cluster: one IP per node (VLLM_HOST_IP)", self.host_ips, True),
                ("cluster: the socket interfaces exist on every node", self.interfaces, False),
                ("cluster: the same versions on every node", self.versions, False),
                ("cluster: the model on every node", self.model_everywhere, False),
                ("cluster: /dev/shm on every node", self.cluster_shm, False)]

    def _lost_why(self) -> str | None:
        if not self.lost:
            return None
        return "no facts from " + ", ".join(f"{n.label} ({n.state})" for n in self.lost)

    # -- placement group ------------------------------------------------------------------------
    def placement_group(self) -> str | None:
        world = self.tp * self.pp * self.dp
        alive = self.nodes + [n for n in self.lost if n.state == "unreachable"]   # Ray still schedules there
        per_node = {n.label: schedulable_gpus(n) for n in alive}
        total = sum(per_node.values())
        driver = next((n for n in alive if n.driver), None)
        layout = ", ".join(f"{label}: {g}" for label, g in per_node.items())
        facts = {"world_size": world, "cluster_gpus": total, "gpus_per_node": layout}
        specs = [{"GPU": 1.0} for _ in range(min(world, 4))]
        if driver is not None:
            specs[0][f"node:{driver.ip}"] = 0.001
        shown = str(specs)[:-1] + (", ...]" if world > 4 else "]")
        if world > total:
            message = (f"ValueError: Cannot provide a placement group requiring {world} GPUs "
                       f"(placement_group_specs={shown}) within 1800 seconds.")
            self.add("parallel-exceeds-gpus", message, {"world_size": str(world), "gpus": str(total)},
                     facts={**facts, "why": f"tp x pp{' x dp' if self.dp > 1 else ''} = {world} > {total} GPUs "
                                            "on the cluster's alive nodes"})
            return None
        pinned = not (self.version and at_least(self.version, DRIVER_PIN_GONE))
        if driver is not None and schedulable_gpus(driver) < 1 and world > 0 and pinned:
            self.add("parallel-exceeds-gpus",
                     f"ValueError: Current node has no GPU available. current_node_resource={{'CPU': 1.0}}. vLLM "
                     f"engine cannot start without GPU. Make sure you have at least 1 GPU available in a node "
                     f"current_node_id='{driver.node_id}' current_ip='{driver.ip}'.",
                     {"world_size": str(world), "gpus": str(total)}, confidence="medium",
                     facts={**facts, "why": f"the driver node {driver.ip} (where vllm serve runs) has no GPU; "
                                            "start vllm serve on a GPU node of the cluster"})
            return None
        if driver is None:
            return "the snapshot names no driver node (run facts --ray where vllm serve will run)"
        return self._lost_why()

    # -- node IPs -------------------------------------------------------------------------------
    def host_ips(self) -> str | None:
        if self.tp * self.pp * self.dp < 2 or len(self.nodes) < 2:
            return None
        if self.version and at_least(self.version, DRIVER_PIN_GONE):
            return None                  # vLLM no longer compares the nodes' IPs
        clashing = sharing_an_ip(self.nodes)
        if not clashing:
            return self._lost_why()
        ips = sorted({n.host_ip for n in self.nodes})
        ids = [n.node_id[:12] for n in self.nodes]
        message = (f"RuntimeError: Every node should have a unique IP address. Got {len(self.nodes)} nodes with node "
                   f"ids {ids} and {len(ips)} unique IP addresses {ips}. Please check your network "
                   f"configuration. If you set `VLLM_HOST_IP` environment variable, make sure it is unique for "
                   f"each node.")
        self.add("nccl-network", message, {"n_nodes": str(len(self.nodes)), "n_ips": str(len(ips))},
                 facts={"same_ip": {n.label: n.host_ip for n in clashing}})
        return None

    # -- interfaces -----------------------------------------------------------------------------
    def interfaces(self) -> str | None:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            for n in self.nodes:
                value = n.vars.get(var)
                if not value or not n.interfaces:
                    continue
                missing = missing_interfaces(var, value, n.interfaces)
                if not missing:
                    continue
                which = "NCCL" if var.startswith("NCCL") else "Gloo"
                message = ("NCCL WARN Bootstrap : no socket interface found" if which == "NCCL" else
                           "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] "
                           f"ifa != nullptr. Unable to find address for: {missing[0]}")
                self.add("nccl-network", message, {"env_ifname": value},
                         confidence="high" if which == "NCCL" else "medium",
                         facts={"node": n.label, "variable": f"{var}={value}",
                                "interfaces_there": ", ".join(f"{k} ({v})" for k, v in n.interfaces.items() if v),
                                })
                return None
        return self._lost_why()

    # -- versions -------------------------------------------------------------------------------
    def versions(self) -> str | None:
        for package in COMPARED_VERSIONS:
            spread = version_spread(self.nodes, package)
            if spread is None:
                continue
            driver, want, odd = spread
            have = odd[0].versions.get(package, "not installed")
            if package == "ray":
                message = (f"RuntimeError: Version mismatch: The cluster was started with: Ray: {want} This "
                           f"process on node {odd[0].ip} was started with: Ray: {have}")
            else:
                message = (f"{package} {want or 'not installed'} on the driver node {driver.ip}, {have} on "
                           f"{odd[0].label}: the cluster's nodes run different {package} versions")
            self.add("cluster-version-mismatch", message, {"package": package},
                     confidence="high" if package == "ray" else "medium",
                     facts={"package": package, "driver": driver.label,
                            "versions": {n.label: n.versions.get(package, "not installed") for n in self.nodes}})
            return None
        return self._lost_why()

    # -- the model ------------------------------------------------------------------------------
    def model_everywhere(self) -> str | None:
        probed = [n for n in self.nodes if n.model is not None]
        if not probed:
            return "the snapshot was taken without --model"
        model = str(self.command.model or "")
        for n in probed:
            if model and n.model.get("model") not in (model, None):
                return f"the snapshot probed {n.model.get('model')}, not {model}"
            if not n.model.get("present"):
                where = n.model.get("where", "")
                self.add("model-not-found",
                         f"ValueError: Invalid repository ID or local directory specified: '{n.model.get('model')}'.",
                         {"model": str(n.model.get("model"))},
                         facts={"node": n.label, "looked_in": where,
                                "why": "vLLM's workers load the weights on their own node: the model must be at "
                                       "the same path (or in the HF cache) on every node"})
                return None
        return self._lost_why()

    # -- /dev/shm -------------------------------------------------------------------------------
    def cluster_shm(self) -> str | None:
        if self.tp * self.pp < 2:
            return None
        for n in self.nodes:
            if n.shm_total_bytes is not None and n.shm_total_bytes < SHM_MIN_BYTES:
                self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                         "(size 9637888)", {"shm_path": "/dev/shm/nccl-XXXXXX", "shm_size": "9637888"},
                         confidence="medium",
                         facts={"node": n.label, "reason": f"/dev/shm on {n.label} is "
                                f"{mm.fmt_bytes(n.shm_total_bytes)} (< {mm.fmt_bytes(SHM_MIN_BYTES)})"})
                return None
        return self._lost_why()
