"""The facts probe of one node: what `vllm-doctor facts` gathers, plus the network and the model path.

Runs wherever it is called: on this machine, or as one Ray task pinned to each node of a cluster
(facts/ray_cluster.py). Returns a facts snapshot document (facts/snapshot.py), so a node's answer is read
by the same code as a snapshot saved by hand.
"""
from __future__ import annotations

import os
from typing import Any

LOCAL_PREFIXES = ("/", "./", "../", "~")


def model_present(model: str) -> tuple[bool, str]:
    """Whether this node can load `model` without the network: a local path that exists, or a hub id whose
    config.json is in this node's Hugging Face cache. (present, where it looked)."""
    path = os.path.expanduser(model)
    if os.path.exists(path):               # vLLM too takes an existing path before a hub id
        return True, os.path.abspath(path)
    if model.startswith(LOCAL_PREFIXES):
        return False, path
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        return False, "huggingface_hub is not installed on this node"
    try:
        found = try_to_load_from_cache(model, "config.json")
    except Exception as exc:  # noqa: BLE001 - an id the hub library refuses (bad characters)
        return False, f"not a model id: {str(exc).splitlines()[0][:120]}"
    return isinstance(found, str), f"the Hugging Face cache {HF_HUB_CACHE}"


def probe_node(model: str | None = None) -> dict[str, Any]:
    """This node's facts snapshot: GPUs (NVML), driver, environment, versions, /dev/shm, network, and
    whether `model` is here. Never raises for a fact source that fails (gather_facts notes it)."""
    from . import Facts
    from .gather import gather_facts
    from .network import collect_network_facts
    from .snapshot import save_snapshot

    facts = Facts()
    notices = gather_facts(facts, live=True)
    try:
        collect_network_facts(facts)
    except OSError as exc:
        notices.append(f"network facts skipped ({exc})")
    if model:
        present, where = model_present(model)
        facts.set("node.model_present", {"model": model, "present": present, "where": where}, "env")
    if notices:
        facts.set("node.notices", notices, "env")
    return save_snapshot(facts)
