"""The remedy for cross-node network failures (nccl-network): the socket interface NCCL and Gloo picked on
each node (from NCCL's `NET/Socket : Using …` lines), InfiniBand errors, nodes sharing one IP, and where to set
the variables in a Ray cluster (on the node that failed, where Ray starts there); a cluster snapshot
(`facts --ray`) names the node and the value outright."""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from vllm_doctor.command.edits import DockerOption, SetEnv
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.refine.ray_placement import is_address, pinned_address
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.remedies.placement import node_instruction

_VIRTUAL_IF = re.compile(r"^(?:lo|docker\d*|virbr\d*|veth\w*|br-\w+|cni\d*|flannel[\w.]*|cali\w*|tailscale\d*|"
                         r"vxlan[\w.]*|tun\d*|kube-\w+|weave)$")
_SOCKET_IF = re.compile(r"\[\d+\](?P<ifname>[^:\s]+):(?P<ip>[0-9a-fA-F.:%\w]+)<\d+>")


def _is_bad_interface(ifname: str, ip: str) -> bool:
    return bool(_VIRTUAL_IF.match(ifname)) or ip.startswith("127.") or ip.startswith("172.17.") or ip == "::1"


def seen_interfaces(ctx: RemedyContext) -> list[tuple[str, str, str | None]]:
    """(interface, ip, node ip or None) that NCCL reported using, in log order."""
    out = []
    for m in ctx.matches_named("nccl-socket-using", "nccl-bootstrap-using"):
        if m.pattern.name == "nccl-socket-using":
            out += [(s.group("ifname"), s.group("ip"), m.line.ip)
                    for s in _SOCKET_IF.finditer(m.captures.get("socket_ifs") or "")]
        elif m.captures.get("bootstrap_if"):
            out.append((m.captures["bootstrap_if"], m.captures.get("bootstrap_ip") or "", m.line.ip))
    return out


def _network_arithmetic(ctx: RemedyContext, seen: list, bad: list, node_ips: list[str]) -> list[str]:
    """Which interface each node used, the Ray nodes, and the connection that failed."""
    lines = [f"{f'node {n}' if n else 'this node'}: NCCL uses {i} ({ip})"
             + ("  <- not routable between nodes" if (i, ip, n) in bad else "") for i, ip, n in seen]
    if node_ips:
        lines.append("Ray nodes seen in the log: " + ", ".join(node_ips))
    # the failed connection as the fatal line states it; a supporting "closed by remote peer X" names the
    # side that went away (often a local proxy), not the connection that failed
    failed = next((m.captures for m in ctx.matches if m.kind == "fatal" and m.captures.get("peer_addr")), None)
    if failed:
        why = failed.get("os_error") or failed.get("gloo_error") or ctx.capture("os_error") or ""
        lines.append(f"connection to {failed['peer_addr']} failed: {why}".rstrip(": "))
    return lines


def _choose_interface(good: list, node_ips: list[str]) -> str | None:
    """The interface to pin: the first good one on a Ray node IP, else the most common good one."""
    if not good:
        return None
    on_node = [i for i, ip, n in good if ip in node_ips]
    return on_node[0] if on_node else Counter(i for i, ip, n in good).most_common(1)[0][0]


def _network_notes(ctx: RemedyContext, seen: list, bad: list, choice: str | None) -> list[str]:
    notes = []
    if ctx.has_pattern("connection-closed-by-peer") and ctx.pattern_names <= {
            "connection-closed-by-peer", "nccl-socket-using", "nccl-bootstrap-using", "nccl-ifname-env"}:
        notes.append("`Connection closed by remote peer` means the other rank died first: its own error is the cause.")
    refused = ("refused" in (ctx.capture("os_error") or "").lower()
               or ctx.has_pattern("socket-retries", "socket-poll-connect", "socket-connect-check"))
    if seen and not bad and refused:
        notes.append("Every interface NCCL picked looks routable, yet connections are refused or retried: a "
                     "firewall between the nodes is the usual cause - NCCL and Gloo listen on ephemeral ports, so "
                     "allow all TCP between the nodes (check with `nc -vz OTHER_NODE PORT` from the log).")
    if (not ctx.env("GLOO_SOCKET_IFNAME") and choice is None
            and ctx.has_pattern("gloo-full-mesh", "gloo-pair", "gloo-loopback-fallback")):
        notes.append("Gloo (vLLM's CPU group) binds to the address the hostname resolves to: set GLOO_SOCKET_IFNAME.")
    return notes


IB_FAULTS = ("ib-async-fatal", "ib-fatal-error", "ib-poll-cq", "ib-comm-fatal")
# a verbs call failing while NCCL sets InfiniBand up (registering memory, creating a queue pair)
IB_SETUP = ("ibv-call-failed", "mlx5-create-qp")
# every InfiniBand failure, the card's (above), a set-up call's and a peer's completion or a QP set-up: none is a
# socket's
IB_ERRORS = ("ib-async-fatal", "ib-fatal-error", "ib-poll-cq", "ib-comm-fatal", "ibv-call-failed", "mlx5-create-qp",
             "ib-completion-error", "ibv-modify-qp")


def _fix_ib_fault(ctx: RemedyContext) -> Fix:
    """The HCA, its port or the fabric failed under NCCL (an async fatal event, completions in error, every
    device given up): no socket setting changes that; the card or link does, or NCCL leaves it out."""
    dev = ctx.capture("ib_dev")
    event = ctx.capture("ib_event") or ctx.capture("ib_reason")
    node = next((m.line.host or m.line.ip for m in ctx.matches_named(*IB_FAULTS) if m.line.host or m.line.ip), None)
    where = f" on {node}" if node else ""
    arithmetic = [f"InfiniBand {dev}:{ctx.capture('ib_port')}: {event}" if dev else f"InfiniBand: {event}"] \
        if (dev or event) else []
    if ctx.capture("ib_failed"):
        arithmetic.append(f"{ctx.capture('ib_failed')} of {ctx.capture('ib_devices')} IB devices failed on one "
                          f"communicator: none left to fall back to")
    skip = [SetEnv("NCCL_IB_HCA", f"^{dev}")] if dev else []
    summary = (f"Check the InfiniBand {'device ' + dev if dev else 'devices'}{where} (`ibstat`, `ibv_devinfo`, "
               f"the kernel log): NCCL saw the card or its link fail"
               + (f"; until it is fixed, leave it out with NCCL_IB_HCA=^{dev}" if dev else ""))
    return Fix(summary, skip, arithmetic=arithmetic,
               alternatives=[Alternative("run over TCP instead: NCCL_IB_DISABLE=1", [SetEnv("NCCL_IB_DISABLE", "1")],
                                         "much slower cross-node traffic")],
               facts_used={"ib_device": dev or "unknown"},
               notes=["An async fatal event or a completion in error is the HCA, its cable or the switch port "
                      "(or a peer whose card failed): restart the job once the port is Active again."])


def _fix_ib_setup(ctx: RemedyContext) -> Fix:
    """A verbs call failed as NCCL set InfiniBand up. Out of memory there is the locked-memory limit (the
    buffers are pinned for the HCA), which containers keep at 64 KiB unless raised; else the HCA's state."""
    call, error = ctx.capture("ib_call") or "mlx5dv_create_qp", ctx.capture("os_error") or "an error"
    arithmetic = [f"{call} failed: {error}"]
    tcp = Alternative("run over TCP instead: NCCL_IB_DISABLE=1", [SetEnv("NCCL_IB_DISABLE", "1")],
                      "much slower cross-node traffic")
    if "Cannot allocate memory" in error:
        edits = [DockerOption("--ulimit", "memlock=-1")] if ctx.is_docker else []
        where = "start the container with --ulimit memlock=-1" if ctx.is_docker else \
            "raise the locked-memory limit on every node (`ulimit -l unlimited`; memlock in " \
            "/etc/security/limits.conf, LimitMEMLOCK=infinity for a service, --ulimit memlock=-1 for a container)"
        return Fix(f"Let NCCL pin its InfiniBand buffers: {where}", edits, arithmetic=arithmetic,
                   alternatives=[tcp], notes=["`ulimit -l` where vLLM runs must say unlimited (or gigabytes): "
                                              "InfiniBand registers every buffer it sends from as locked memory."])
    return Fix(f"Check the InfiniBand devices (`ibv_devinfo`, `ibstat`: port Active, the right NCCL_IB_HCA and "
               f"NCCL_IB_GID_INDEX): {call} failed with {error} as NCCL set them up", [], arithmetic=arithmetic,
               alternatives=[tcp])


def _fix_pinned_ip(ctx: RemedyContext) -> Fix:
    """Ray's autoscaler cannot place vLLM's first bundle, pinned to `node:<ip>`, because no Ray node registered
    with that address (refine/ray_placement.py): the driver's address as vLLM sees it (VLLM_HOST_IP, else the default
    route's interface) is not the one Ray knows this node by."""
    line = next((m.line.message for m in ctx.matches if m.pattern.name == "autoscaler"), "")
    pinned = pinned_address(line) or "?"
    ray = ctx.fact("log.ray_address")
    known = ", ".join(sorted(({ray} | set(ctx.fact("log.node_ips") or [])) - {None})) or "none"
    edits = [SetEnv("VLLM_HOST_IP", ray)] if ray else []
    where = f" (the cluster it joined is at {ray})" if ray else ""
    if is_address(pinned):
        restart = f", or restart Ray on this node with --node-ip-address={pinned}"
        why = f"the Ray addresses in the log: {known}, none in the same address block"
    elif any(c in pinned for c in "<>*") or "x.x" in pinned:
        restart = ""
        why = ("the paste hides the address; vLLM had checked that this node has a free GPU, so only the label "
               "can be missing: no Ray node registered with that address")
    else:
        restart = ""
        why = f"'{pinned}' is a host name and Ray labels its nodes by IP address: VLLM_HOST_IP must be an address"
    return Fix(summary=f"Give vLLM the address Ray knows this node by: VLLM_HOST_IP={ray or '<its Ray address>'}"
                       f"{where}{restart}",
               edits=edits,
               arithmetic=[f"vLLM pinned its first bundle to node:{pinned}; {why}"],
               facts_used={"pinned_ip": pinned, "ray_addresses": known},
               notes=["vLLM pins the placement group's first bundle to the driver's node as `node:<its IP>` "
                      "(VLLM_HOST_IP when set, else the interface of the default route); Ray names each node "
                      "after the address it registered with. `ray status` / `ray list nodes` show those "
                      "addresses; VLLM_HOST_IP must be this node's, set before `ray start` on every node.",
                      "If this node is a worker and not the head, its own Ray address replaces the cluster's."])


# the code that bound the address, by its frames -> the setting that names that address
BIND_SETTINGS = (("nixl_connector", "VLLM_NIXL_SIDE_CHANNEL_HOST"), ("/kv_transfer/", "the KV connector's host"),
                 ("coordinator", "--data-parallel-address"), ("data_parallel", "--data-parallel-address"))


def _fix_bind_not_local(ctx: RemedyContext) -> Fix:
    """ZMQ could not bind an address the node does not have: the address configured for this node is another's."""
    m = next(m for m in ctx.matches if m.pattern.name == "zmq-bind-not-local")
    files = [f.file for f in m.traceback.frames] if m.traceback is not None else []
    setting = next((name for part, name in BIND_SETTINGS if any(part in f for f in files)), "VLLM_HOST_IP")
    node = m.printed.ip
    addr = ctx.capture("bind_addr")
    where = f" (node {node} tried to bind {addr})" if node and addr else (f" ({addr})" if addr else "")
    return Fix(summary=f"Give each node its own address: {setting} names an address this node does not have"
                       f"{where}; set it per node to that node's own IP",
               edits=[], arithmetic=[f"bind {addr}:{ctx.capture('bind_port')} failed: EADDRNOTAVAIL"] if addr else [],
               facts_used={"bind_addr": addr, "setting": setting, "node": node},
               notes=["A value copied from another node (or computed on the head and passed to the workers) fails "
                      "here: set it on each node before `ray start` there, not once in the launch command, which "
                      "vLLM's Ray executor copies to every worker; `ip -br addr` shows a node's own addresses."])


RAY_DRIVER_NODE = ("ray-driver-node-unknown", "ray-driver-ip-unmatched")


def _fix_driver_node(ctx: RemedyContext) -> Fix:
    """Ray's driver (vLLM's process) found no registered node that is its own: no `ray start` where it runs (a
    separate container keeps its own /tmp/ray), or it resolves another IP than the one its node registered with."""
    driver, raylets = ctx.capture("driver_ip"), ctx.capture("raylet_ips")
    arithmetic = [f"this process resolved its node as {driver}; Ray's nodes registered as {raylets}"
                  + (f" (GCS at {ctx.capture('gcs_ip')})" if ctx.capture("gcs_ip") else "")] if driver and raylets else []
    ip = driver or "<this node's IP>"
    notes = ["vLLM joins the cluster as a Ray driver, and a driver attaches to the raylet that `ray start` ran on "
             "its own node, found through the session files under /tmp/ray and by its IP. A vLLM container started "
             "beside the Ray container (not inside it) has neither; vLLM's multi-node recipe runs `vllm serve` in "
             "the container that ran `ray start` (`docker exec` into it)."]
    if driver and driver.startswith("172.17."):
        notes.append(f"{driver} is Docker's default bridge network: the process runs in a container without "
                     "--network host, so its address is one no Ray node has.")
    return Fix(summary="Run vLLM where `ray start` ran on this node (the same container or host, RAY_ADDRESS set to "
                       f"the head), and start Ray there with the address this process uses: `ray start "
                       f"--node-ip-address={ip}` (VLLM_HOST_IP={ip} too)",
               edits=[], arithmetic=arithmetic, facts_used={"driver_ip": driver, "raylet_ips": raylets},
               notes=notes)


def fix_network(ctx: RemedyContext) -> Fix:
    if ctx.has_pattern(*RAY_DRIVER_NODE) and not any(m.kind == "fatal" and m.pattern.name not in RAY_DRIVER_NODE
                                                     for m in ctx.matches):
        return _fix_driver_node(ctx)
    if "autoscaler" in ctx.pattern_names and ctx.pattern_names <= {"autoscaler", "placement-group-wait"}:
        return _fix_pinned_ip(ctx)      # the wait it explains came with it (wait-with-its-reason)
    if ctx.pattern_names == {"zmq-bind-not-local"}:
        return _fix_bind_not_local(ctx)
    # an IB fault alone is the card or link; with a socket or Gloo failure beside it, the interfaces come first
    only_ib = not any(m.kind == "fatal" and m.pattern.name not in IB_ERRORS for m in ctx.matches)
    if ctx.has_pattern(*IB_FAULTS) and only_ib:
        return _fix_ib_fault(ctx)
    if ctx.has_pattern(*IB_SETUP) and only_ib:
        return _fix_ib_setup(ctx)
    seen = seen_interfaces(ctx)
    node_ips = sorted({m.line.ip for m in ctx.matches} - {None})
    bad = [(i, ip, n) for i, ip, n in seen if _is_bad_interface(i, ip)]
    good = [(i, ip, n) for i, ip, n in seen if not _is_bad_interface(i, ip)]
    arithmetic = _network_arithmetic(ctx, seen, bad, node_ips)
    facts_used: dict[str, Any] = {"ray.node_ips": node_ips} if node_ips else {}
    choice = _choose_interface(good, node_ips)
    edits: list = []
    alternatives: list[Alternative] = []
    parts, notes = [], []
    if choice:
        edits += [SetEnv("NCCL_SOCKET_IFNAME", choice), SetEnv("GLOO_SOCKET_IFNAME", choice)]
        parts.append(f"pin NCCL_SOCKET_IFNAME={choice} and GLOO_SOCKET_IFNAME={choice} on every node")
        facts_used["interface"] = choice
        if bad:
            notes.append("NCCL picked " + ", ".join(sorted({f"{i} ({ip})" for i, ip, n in bad}))
                         + " on some node; that interface only exists inside one host.")
    else:
        parts.append("set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on every node to the interface that carries "
                     "the nodes' IPs (see `ip -br addr`)")
        env_if = ctx.env("NCCL_SOCKET_IFNAME") or ctx.capture("env_ifname")
        if env_if:
            notes.append(f"NCCL_SOCKET_IFNAME is {env_if}: check that this interface exists and is up on every node.")
    if ctx.has_pattern("ray-unique-ip"):
        own = next((ip for i, ip, n in good if n is None), None)
        if own:
            edits.append(SetEnv("VLLM_HOST_IP", own))
        parts.append("give every node its own VLLM_HOST_IP (" + (own or "this node's IP") + " here, not a copy)")
        arithmetic.append(f"Ray saw {ctx.capture('n_nodes') or '?'} nodes but {ctx.capture('n_ips') or '?'} "
                          f"distinct IPs {ctx.capture('ips') or ''}")
        notes.append("VLLM_HOST_IP must be set per node to that node's own address (export it before `ray start` "
                     "on each node); a value copied to every node gives all nodes the same IP.")
    if ctx.has_pattern(*IB_ERRORS):
        alternatives.append(Alternative("rule InfiniBand out: NCCL_IB_DISABLE=1 (TCP sockets only)",
                                        edits + [SetEnv("NCCL_IB_DISABLE", "1")], "much slower cross-node traffic"))
        notes.append("An IB completion error (e.g. RETRY_EXC_ERR) is a fabric/port problem: check `ibstat`, the "
                     "link state and NCCL_IB_HCA on both nodes.")
    if ctx.has_pattern("no-interface-in-subnet"):
        notes.append(f"NCCL_COMM_ID names the root {ctx.capture('peer_addr') or 'address'}: no interface of this "
                     "node is in its subnet. Unset NCCL_COMM_ID (vLLM does not need it) or give it an address this "
                     "node reaches on its own network.")
    worker = _first_worker(ctx)
    if worker:
        iface = choice or "<its interface>"
        # the Ray node whose lines show it first: what reaches it is placement's to say, as for every remedy
        parts.append(node_instruction([SetEnv("NCCL_SOCKET_IFNAME", iface), SetEnv("GLOO_SOCKET_IFNAME", iface)],
                                      worker, ray=True))
        facts_used["worker_node"] = worker
        notes.append("vLLM never copies GLOO_* from the head to its Ray workers; recent releases copy NCCL_* "
                     "(vllm/ray/ray_env.py), so an interface name valid on the head lands on every node: name one "
                     "each node has, or set it per node before `ray start`.")
    per_node = _cluster_node_fixes(ctx)
    if per_node:
        # a cluster snapshot names the node and the value: that is the fix, not this machine's guesses
        parts, edits = per_node, []
        facts_used["per_node"] = per_node
    notes += _network_notes(ctx, seen, bad, choice)
    nccl_lines = any("NCCL WARN" in t or "NCCL INFO" in t for t in ctx.lines) or bool(ctx.env("NCCL_DEBUG"))
    if (not nccl_lines or not seen) and not per_node:
        edits.append(SetEnv("NCCL_DEBUG", "INFO"))
        parts.append("rerun with NCCL_DEBUG=INFO to see which interface NCCL picks (`NET/Socket : Using …`)")
    summary = parts[0][0].upper() + parts[0][1:] + ("; " + "; ".join(parts[1:]) if len(parts) > 1 else "")
    return Fix(summary=summary, edits=edits, alternatives=alternatives, arithmetic=arithmetic,
               facts_used=facts_used, notes=notes)


def _first_worker(ctx: RemedyContext) -> str | None:
    """The Ray worker node whose line shows the failure first: Ray prefixes only other nodes' actors with
    `ip=`, so a first line without it is the head's (None: the head, or not a Ray log)."""
    first = min(ctx.matches, key=lambda m: m.seq, default=None)
    return first.line.ip if first is not None and first.line.ip else None


def _cluster_node_fixes(ctx: RemedyContext) -> list[str]:
    """With a cluster snapshot: what to set on which node. Two nodes with one address: VLLM_HOST_IP set to
    each node's own (the address Ray registered it with), or unset; a socket interface that a node lacks:
    the one carrying that node's address."""
    from vllm_doctor.facts.cluster import missing_interfaces, nodes_from_facts, sharing_an_ip

    nodes = [n for n in nodes_from_facts(ctx.facts) if n.state == "ok"]
    if len(nodes) < 2:
        return []
    out = []
    if ctx.has_pattern("ray-unique-ip"):
        ray_ips = Counter(n.ip for n in nodes)
        for n in sharing_an_ip(nodes):
            if n.vars.get("VLLM_HOST_IP") == n.ip and ray_ips[n.ip] < 2:
                continue                  # its own address: the other node holds the copy
            if "VLLM_HOST_IP" in n.vars:
                own = f"VLLM_HOST_IP={n.ip}" if ray_ips[n.ip] < 2 else "VLLM_HOST_IP=<this node's own address>"
                out.append(f"on {n.label}: {own} (it has VLLM_HOST_IP={n.vars['VLLM_HOST_IP']}, another node's too)")
            else:
                other = next((ip for name, ip in n.interfaces.items()
                              if ip and ip != n.ip and not ip.startswith("127.") and not name.startswith(("docker", "veth", "br-"))), None)
                out.append(f"on {n.label}: restart Ray with --node-ip-address={other or '<its own address>'} and "
                           f"export VLLM_HOST_IP={other or 'the same address'} (Ray registered it as {n.ip}, "
                           "like another node)")
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        for n in nodes:
            value = n.vars.get(var)
            if value and missing_interfaces(var, value, n.interfaces):
                out.append(f"on {n.label}: {var}={n.own_interface or '<the interface with ' + n.ip + '>'} (it has "
                           f"{var}={value}, which is no interface there)")
    return out
