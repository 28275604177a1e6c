"""Facts snapshots: save what the doctor learned on one machine, load it where the log is read.

Format: {"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {key: {"value", "source"}}}.
A `vllm collect-env` text file is accepted too. Loaded facts get source "snapshot".

A snapshot is outside input: a fact whose value has not the shape every reader of it expects (`gpu.devices`
a list of objects, `env.vars` an object, a matrix a list of lists) is left out with a notice, never passed
on to fail a report later. Numbers need no such care: every reader takes them through vllm_doctor.numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_doctor.numbers import json_loads, json_safe

from . import Facts

from .snapshot_format import (CLUSTER_KIND, KIND, SCHEMA_VERSION, SOURCE, SnapshotError,  # noqa: F401 - re-exported
                              facts_from_json, shaped)


def save_snapshot(facts: Facts) -> dict[str, Any]:
    """The snapshot document; strict JSON (a NaN or infinite value is written as null)."""
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "facts": json_safe(facts.to_json())}


def load_snapshot(path: str | Path, facts: Facts) -> list[str]:
    """Add the snapshot's facts (source "snapshot"); raise SnapshotError when the file is unusable.
    Returns a notice for the facts left out (a value of the wrong shape), if any."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SnapshotError(f"cannot read facts snapshot {path}: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json_loads(text)      # NaN, Infinity, 1e999 and 5000-digit numbers read as null
        except ValueError as exc:
            where = f" at line {exc.lineno} column {exc.colno}: {exc.msg}" if hasattr(exc, "lineno") else f": {exc}"
            raise SnapshotError(f"{path}: invalid JSON{where}") from None
        if isinstance(data, dict) and data.get("kind") == CLUSTER_KIND:
            from .cluster import load_cluster     # a cluster snapshot (facts --ray): one entry per node

            return load_cluster(data, path, facts)
        values = facts_from_json(data, path)
    else:
        from .collect_env import looks_like_collect_env, parse_collect_env   # its regexes compile only when needed

        if not looks_like_collect_env(text):
            raise SnapshotError(f"{path}: neither a facts snapshot (JSON) nor `vllm collect-env` output")
        values = parse_collect_env(text)
    dropped = []
    for key, value in values.items():
        kept = shaped(key, value)
        if kept is None and value is not None:
            dropped.append(key)
        facts.set(key, kept, SOURCE)
    if not dropped:
        return []
    return [f"{path}: facts of the wrong shape left out: {', '.join(sorted(dropped)[:8])}"
            + (f" and {len(dropped) - 8} more" if len(dropped) > 8 else "")]
