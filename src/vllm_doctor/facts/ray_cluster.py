"""`facts --ray`: the node probe on every alive node of a running Ray cluster, through Ray itself.

Ray is imported here only (the optional extra vllm-doctor[ray]). One task per alive node, pinned with
node-affinity scheduling (soft=False: never run a node's probe elsewhere), zero CPUs so a cluster whose CPUs
are all taken by vLLM's actors still answers, no retries. All tasks share one deadline: a node that has
not answered by then is "unreachable", a node that died during the probe is "unreachable" with Ray's
reason, and a node Ray lists as dead is "dead". The doctor's own package travels with the tasks
(runtime_env py_modules), so a node needs only what vLLM already needs (regex, transformers, nvidia-ml-py).
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from .cluster import cluster_document
from .origin import LOOPBACK

DEFAULT_TIMEOUT_S = 30.0


class ClusterError(Exception):
    """The cluster cannot be probed at all (no Ray, no cluster at the address); one line, exit 2."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1][:200]}" if text else type(exc).__name__


def _reachable(target: str, timeout_s: float) -> None:
    """An explicit host:port must accept a TCP connection: ray.init retries an address where nothing listens
    for minutes, which a command-line tool must not."""
    import socket

    if target == "auto":
        return                      # Ray finds the local cluster itself, and says so at once when there is none
    host, _, port = target.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"{target} is not a Ray address (HOST:PORT, ray://HOST:PORT or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(f"cannot connect to a Ray cluster at {target}: {exc.strerror or exc} "
                           f"(is `ray start --head` running there?)") from None


@contextmanager
def _as_given(target: str):
    """A cluster started on loopback (`ray start --head --node-ip-address 127.0.0.1`) is reached on loopback,
    and this driver joins it there: Ray would swap 127.0.0.1 for this host's interface address, where nothing
    of that cluster listens (ray.init then waits for minutes). Yields the driver's node IP (None: Ray's own)."""
    host = target.removeprefix("ray://").rpartition(":")[0].strip("[]")
    if not host.startswith(LOOPBACK) or host == "0.0.0.0":
        yield None
        return
    import ray._private.services as services

    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda h: h
    try:
        yield "127.0.0.1" if host == "localhost" else host
    finally:
        services.resolve_ip_for_localhost = resolve


def gather_cluster(address: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S, model: str | None = None,
                   probe: Callable[..., dict] | None = None, ship_package: bool = True) -> dict[str, Any]:
    """The cluster snapshot document. `probe(model)` runs on each node (default: node_probe.probe_node)."""
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise ClusterError("facts --ray needs Ray on this machine: pip install 'vllm-doctor[ray]'") from None
    from .node_probe import probe_node

    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    _reachable(target, min(timeout_s, 10.0))
    runtime_env = {"py_modules": [str(Path(__file__).resolve().parents[1])]} if ship_package else None
    try:
        with _as_given(target) as node_ip:
            ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False, runtime_env=runtime_env,
                     _node_ip_address=node_ip)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, or Ray's own errors for a bad address
        raise ClusterError(f"cannot connect to a Ray cluster at {target}: {_first_line(exc)}") from None
    try:
        driver = ray.get_runtime_context().get_node_id()
        listed = ray.nodes()
        task = ray.remote(num_cpus=0, max_retries=0)(probe or probe_node)
        refs = {}
        for node in listed:
            if node.get("Alive"):
                strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
                refs[node["NodeID"]] = task.options(scheduling_strategy=strategy).remote(model)
        ready, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        done = set(ready)
        entries = []
        for node in listed:
            node_id = node["NodeID"]
            entry = {"node_id": node_id, "ip": node.get("NodeManagerAddress", ""), "driver": node_id == driver,
                     "resources": {k: v for k, v in (node.get("Resources") or {}).items()
                                   if not k.startswith("node:")},
                     "state": "dead", "why": "Ray lists the node as dead", "snapshot": None}
            ref = refs.get(node_id)
            if ref is not None and ref in done:
                try:
                    entry.update(state="ok", why="", snapshot=ray.get(ref, timeout=1))
                except Exception as exc:  # noqa: BLE001 - the node died mid-probe, or the probe failed there
                    entry.update(state="unreachable", why=f"the probe failed there: {_first_line(exc)}")
            elif ref is not None:
                entry.update(state="unreachable", why=f"no answer within {timeout_s:g} s")
            entries.append(entry)
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a task on a node that is gone cannot be cancelled
                pass
        return cluster_document(target, timeout_s, entries)
    finally:
        ray.shutdown()
