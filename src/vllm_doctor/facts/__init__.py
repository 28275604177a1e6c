"""Facts: what the doctor knows about the model, the GPUs and the environment, each with its source.

When diagnosing a saved log, facts from the user and the log itself win over a snapshot, which wins over
what the model's config.json and this machine (NVML, environment) say.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

# Strongest first. A fact from a stronger source is never overwritten by a weaker one.
SOURCE_RANK = {"user": 0, "log": 1, "snapshot": 2, "config.json": 3, "nvml": 4, "env": 5, "default": 9}


@dataclass
class Fact:
    value: Any
    source: str


class Facts:
    """A flat map of dotted keys (see docs/DESIGN.md) to values with provenance."""

    def __init__(self) -> None:
        self._facts: dict[str, Fact] = {}
        self.conflicts: list[tuple[str, Fact, Fact]] = []  # (key, kept, rejected)
        # A log of several nodes: each node's own values (node as the log names it: an ip, pod/NAME, an NCCL
        # host, "driver"), the first per node. The flat map keeps the first any node said.
        self.by_node: dict[str, dict[str, Fact]] = {}
        self._node_of: dict[str, str] = {}     # flat key -> the node its value came from

    def set(self, key: str, value: Any, source: str, *, override: bool = False, node: str | None = None) -> None:
        if value is None:
            return
        if node is not None:
            self.by_node.setdefault(node, {}).setdefault(key, Fact(value, source))
            first = self._node_of.setdefault(key, node)
            if first != node and key in self._facts and not override:
                return          # another node's value: that node's fact, no conflict with the first's
        old = self._facts.get(key)
        if old is not None and not override:
            if SOURCE_RANK.get(source, 8) >= SOURCE_RANK.get(old.source, 8):
                if old.value != value and old.source != source:
                    self.conflicts.append((key, old, Fact(value, source)))
                return
            if old.value != value and old.source != source:
                self.conflicts.append((key, Fact(value, source), old))
        self._facts[key] = Fact(value, source)

    def get(self, key: str, default: Any = None) -> Any:
        fact = self._facts.get(key)
        return default if fact is None else fact.value

    def source(self, key: str) -> str | None:
        fact = self._facts.get(key)
        return None if fact is None else fact.source

    def __contains__(self, key: str) -> bool:
        return key in self._facts

    def items(self) -> Iterator[tuple[str, Fact]]:
        return iter(sorted(self._facts.items()))

    def with_prefix(self, prefix: str) -> dict[str, Any]:
        return {k: f.value for k, f in self._facts.items() if k.startswith(prefix)}

    def merge(self, other: "Facts") -> None:
        for key, fact in other._facts.items():
            self.set(key, fact.value, fact.source)

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {k: {"value": f.value, "source": f.source} for k, f in self.items()}
