"""Facts snapshots: save what the doctor learned on one machine, load it where the log is read.

Format: {"schema_version": 1, "kind": "vllm-doctor-facts", "facts": {key: {"value", "source"}}}.
A `vllm collect-env` text file is accepted too. Loaded facts get source "snapshot".
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import Facts

SCHEMA_VERSION = 1
KIND = "vllm-doctor-facts"
SOURCE = "snapshot"


class SnapshotError(Exception):
    """A snapshot that cannot be used; the message is one line (the CLI exits 2 with it)."""


def save_snapshot(facts: Facts) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "facts": facts.to_json()}


def _facts_from_json(data: Any, path: Path) -> dict[str, Any]:
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


def load_snapshot(path: str | Path, facts: Facts) -> None:
    """Add the snapshot's facts (source "snapshot"); raise SnapshotError when the file is unusable."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SnapshotError(f"cannot read facts snapshot {path}: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        values = _facts_from_json(data, path)
    else:
        from .collect_env import looks_like_collect_env, parse_collect_env   # its regexes compile only when needed

        if not looks_like_collect_env(text):
            raise SnapshotError(f"{path}: neither a facts snapshot (JSON) nor `vllm collect-env` output")
        values = parse_collect_env(text)
    for key, value in values.items():
        facts.set(key, value, SOURCE)
