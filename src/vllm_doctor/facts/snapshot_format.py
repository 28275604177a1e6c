"""The facts snapshot document's shape, read by both loaders (facts/snapshot.py for one machine,
facts/cluster.py for a cluster's nodes): what an entry must hold, and each fact's value kept only in the
shape its readers expect."""
from __future__ import annotations

from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KIND = "vllm-doctor-facts"
CLUSTER_KIND = "vllm-doctor-cluster"     # facts/cluster.py
SOURCE = "snapshot"


class SnapshotError(Exception):
    """A snapshot that cannot be used; the message is one line (the CLI exits 2 with it)."""


def facts_from_json(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SnapshotError(f"{path}: not a vllm-doctor facts snapshot (kind must be {KIND!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise SnapshotError(f"{path}: unsupported snapshot schema_version {data.get('schema_version')!r} "
                            f"(expected {SCHEMA_VERSION})")
    entries = data.get("facts")
    if not isinstance(entries, dict):
        raise SnapshotError(f"{path}: 'facts' must be an object of key -> {{value, source}}")
    out = {}
    for key, entry in entries.items():
        if not isinstance(entry, dict) or "value" not in entry:
            raise SnapshotError(f"{path}: fact {key!r} must be an object with a 'value'")
        out[key] = entry["value"]
    return out


def _objects(value: Any) -> list[dict] | None:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else None


def _device(dev: dict) -> dict:
    """A GPU entry with its nested lists (processes, MIG instances) kept only as lists of objects."""
    return {k: (_objects(v) or []) if k in ("processes", "mig_devices") else v for k, v in dev.items()}


def _matrix(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(row, list) for row in value)


def shaped(key: str, value: Any) -> Any:
    """The value as the readers of `key` expect it (cleaned of entries they cannot read), or None."""
    if key == "gpu.devices":
        devices = _objects(value)
        return None if devices is None else [_device(d) for d in devices]
    if key in ("env.vars", "env.versions", "doctor.machine_facts"):
        return value if isinstance(value, dict) else None
    if key == "gpu.visible":
        if not isinstance(value, dict):
            return None
        return {**value, "devices": _objects(value.get("devices")) or []}
    if key == "gpu.topology":
        return value if _matrix(value) else None
    if key == "gpu.p2p":
        if isinstance(value, dict):
            kept = {k: v for k, v in value.items() if _matrix(v)}
            return kept or None
        return value if _matrix(value) else None
    return value
