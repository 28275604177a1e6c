"""Why Ray cannot place vLLM's placement group: too few GPUs, a driver address Ray does not know, or nothing said?

`ray status` pasted into the log (ray/autoscaler/_private/util.py format_info_string: `Total Usage:` lines
`0.0/1.0 GPU`, `Pending Demands:` lines `{'GPU': 1.0} * 2 (PACK): 1+ pending placement groups`) names both
sides of the count: the group is parallel-exceeds-gpus only where the cluster's GPUs are fewer than the group
asks for; with enough GPUs (or no total in the log) its pending line says nothing about why and the wait stays
the start-up stall it is.

vLLM pins its placement group's first bundle to the driver's node with the custom resource `node:<ip>`
(vllm/executor/ray_utils.py initialize_ray_cluster; `<ip>` is vllm.utils get_ip(): VLLM_HOST_IP when set, else
the address of the interface with the default route). Ray names each node's resource after the address the node
registered with (`ray start --node-ip-address`, else its own detection). When the two disagree, no node has
`node:<ip>` and the autoscaler reports the request unplaceable however many GPUs are free -- a network set-up
problem (nccl-network: VLLM_HOST_IP), not a count (docs/precedences.md, `pinned-ip-not-a-ray-node`).

Every vLLM that pins the bundle first checks that the driver's own Ray node (by node ID) has a GPU free ("Current
node has no GPU available" otherwise), so the pinned bundle alone being unplaceable means no node carries that
`node:` label. The evidence that it is an address Ray does not know: a pin that is no address at all (a host name:
Ray labels nodes by address; vllm#12670's `node:ec2-….compute.amazonaws.com`), a pin the paste hid (`node:<IP>`,
vllm#7815), or an address outside every address block of the Ray addresses the log shows (the cluster the driver
joined, the nodes' `ip=` prefixes: a public address against private ones, or two private blocks). Addresses of one
block prove nothing (a worker node of the same network, a node whose GPU Ray registered as something else) and keep
the rule's own reading, as does a log where vLLM's own count says the cluster has too few GPUs (its warning before
it asks Ray: then the count is the cause, whatever the pin).

The worker's own check of a node's share (`local_world_size (16) must be less than or equal to the number of visible
devices (8)`) is a count on the mp executor; under Ray it was vLLM's bug (vllm#28873): no cause of the user's.
"""
from __future__ import annotations

import ipaddress
import re

from vllm_doctor.facts.keys import ARGS_DISTRIBUTED_EXECUTOR_BACKEND, LOG_DISTRIBUTED_BACKEND
from vllm_doctor.findings import RefineContext

PINNED = re.compile(r"'node:([^'\n]{1,253})'")      # a paste's placeholder may hold blanks (`<MY ADDRESS>`)
# RFC 1918 blocks, CGNAT, link-local, loopback: one network's addresses share one of these
BLOCKS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                   "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"))
# one bundle shape of a pending group, with its count: `{'node:10.0.0.1': 0.001, 'GPU': 1.0} * 1`
SHAPE = re.compile(r"\{([^{}]{0,400})\} \* (\d{1,5})")
SHAPE_GPUS = re.compile(r"'GPU': (\d{1,4}(?:\.\d{1,4})?)")


def gpus_asked(shape: str) -> float:
    """The GPUs a pending group's bundles ask for, summed over its shapes."""
    total = 0.0
    for body, count in SHAPE.findall(shape or ""):
        gpu = SHAPE_GPUS.search(body)
        total += float(gpu.group(1)) * int(count) if gpu else 0.0
    return total


def pinned_address(message: str) -> str | None:
    """What a placement request pins its first bundle to (`'node:10.0.0.1': 0.001`): an address, a host name,
    or a placeholder a paste put there (`node:<IP>`)."""
    m = PINNED.search(message)
    return m.group(1) if m else None


# gpu_worker.py's check of one node's share of the layout against the devices the process sees
LOCAL_WORLD_PATTERNS = ("local-world-size", "dp-local-rank")


def classify(ctx: RefineContext) -> str | None:
    match = ctx.match
    if match.pattern.name in LOCAL_WORLD_PATTERNS:
        return _local_world(ctx)
    if match.pattern.name == "ray-status-pending":
        return _pending(ctx)
    if match.pattern.name != "autoscaler":
        return None
    pinned = pinned_address(match.line.message)
    if pinned is None or ctx.facts.get("log.ray_gpus_short"):
        return None
    if is_address(pinned):
        known = [ctx.facts.get("log.ray_address")] + list(_list(ctx.facts.get("log.node_ips")))
        scopes = {_scope(ip) for ip in known if ip} - {None}
        mine = _scope(pinned)
        return "nccl-network" if scopes and mine is not None and mine not in scopes else None
    return "nccl-network"          # a host name, or an address the paste hid: no node is labelled so


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _pending(ctx: RefineContext) -> str | None:
    """`ray status`'s pending group: a count problem only where the log also shows fewer GPUs in the cluster."""
    total = ctx.facts.get("log.ray_cluster_gpus")
    asked = gpus_asked(ctx.match.captures.get("shape") or "")
    if isinstance(total, (int, float)) and asked and total < asked:
        return None
    return "unrecognized"          # dropped: the pending line alone does not say why


def _scope(ip: str) -> str | None:
    """The address block an IPv4 address lies in ('public' outside the private ones); None: no IPv4 address."""
    try:
        addr = ipaddress.ip_address(str(ip))
    except ValueError:
        return None
    if addr.version != 4:
        return None
    return next((str(n) for n in BLOCKS if addr in n), "public")


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _local_world(ctx: RefineContext) -> str | None:
    """The worker's local-world-size check counts the devices one node's mp executor gives its ranks; under Ray
    the placement group places the workers and the check compared the whole world with one node's devices (a
    vLLM bug, vllm#28873): no count of the user's is wrong there."""
    if not ray_executor(ctx.facts):
        return None
    ctx.match.unsupported = (
        "The worker compared its local world size with the devices it sees while Ray placed the workers: vLLM's "
        "check counted the whole multi-node world against one node (vllm#28873); upgrade vLLM.")
    return "unrecognized"


def ray_executor(facts) -> bool:
    """The log (`Defaulting to use ray for distributed inference`) or the command says Ray runs the workers."""
    return "ray" in (str(facts.get(LOG_DISTRIBUTED_BACKEND) or ""),
                     str(facts.get(ARGS_DISTRIBUTED_EXECUTOR_BACKEND) or ""))
