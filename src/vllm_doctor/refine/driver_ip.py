"""Ray's autoscaler cannot place vLLM's first bundle: too few GPUs, or a driver address Ray does not know?

vLLM pins its placement group's first bundle to the driver's node with the custom resource `node:<ip>`
(vllm/executor/ray_utils.py initialize_ray_cluster; `<ip>` is vllm.utils get_ip(): VLLM_HOST_IP when set, else
the address of the interface with the default route). Ray names each node's resource after the address the node
registered with (`ray start --node-ip-address`, else its own detection). When the two disagree, no node has
`node:<ip>` and the autoscaler reports the request unplaceable however many GPUs are free -- a network set-up
problem (nccl-network: VLLM_HOST_IP), not a count (docs/precedences.md, `pinned-ip-not-a-ray-node`).

The evidence is the address scope: the pinned address and every Ray address the log shows (the cluster the
driver joined, the nodes' `ip=` prefixes) lie in different address blocks (a public address against private
ones, or two different private blocks). Addresses of one block prove nothing (a worker node of the same
network, the head without a free GPU) and keep the rule's own reading.
"""
from __future__ import annotations

import ipaddress
import re

from vllm_doctor.findings import RefineContext

PINNED = re.compile(r"'node:(\d{1,3}(?:\.\d{1,3}){3})'")
# RFC 1918 blocks, CGNAT, link-local, loopback: one network's addresses share one of these
BLOCKS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                   "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"))


def classify(ctx: RefineContext) -> str | None:
    match = ctx.match
    if match.pattern.name != "autoscaler":
        return None
    pinned = PINNED.search(match.line.message)
    if pinned is None:
        return None
    known = [ctx.facts.get("log.ray_address")] + list(_list(ctx.facts.get("log.node_ips")))
    scopes = {_scope(ip) for ip in known if ip} - {None}
    mine = _scope(pinned.group(1))
    if not scopes or mine is None or mine in scopes:
        return None
    return "nccl-network"


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
