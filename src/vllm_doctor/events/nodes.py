"""Which node printed a line, and which node failed first, in a log that spans several machines.

A node is named by the strongest identity its lines carry: Ray's `ip=` prefix (actors on another node than
the driver), a `kubectl logs --prefix` pod, or NCCL's `hostname:pid:tid` prefix. In a Ray log the lines
without `ip=` are the driver's node (Ray names only the other nodes); an NCCL hostname seen on a line
with `ip=A` is node A. The first failing node is where the root cause's first line was printed: the
others' timeouts and broken pipes come after, from ranks that noticed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.events.logfacts import NCCL_HOST     # `host:pid:tid [dev] … NCCL INFO|WARN`

DRIVER = "driver"
MAX_NODES = 512                 # a log naming more distinct nodes than this is not counted further


@dataclass
class NodeStory:
    first: str                          # the node where the root cause was printed first
    first_rule: str
    first_line: int
    followed: list[tuple[str, str, int]] = field(default_factory=list)   # (node, rule or "error", line)
    nodes: list[str] = field(default_factory=list)                       # every node the log names

    def as_dict(self) -> dict[str, Any]:
        return {"failed_first": self.first, "rule": self.first_rule, "line": self.first_line,
                "followed": [{"node": n, "rule": r, "line": ln} for n, r, ln in self.followed],
                "nodes": self.nodes}

    def sentence(self) -> str:
        text = f"node {self.first} failed first ({self.first_rule}, line {self.first_line})"
        if self.followed:
            text += "; " + ", ".join(f"{n} followed with {r} (line {ln})" for n, r, ln in self.followed)
        return text


class NodeTracker:
    def __init__(self) -> None:
        self.alias: dict[str, str] = {}      # NCCL hostname -> the ip= it was printed under
        self.seen: dict[str, int] = {}       # node -> lines
        self.driver_lines = 0                # lines with no node identity
        self.has_ips = False
        self._hostnames: set[str] = set()    # NCCL hostnames seen

    def _raw_node(self, line) -> str | None:
        if line.ip:
            return line.ip
        if line.pod:
            return f"pod/{line.pod}"
        if "NCCL " in line.message:
            m = NCCL_HOST.match(line.message)
            if m:
                self._hostnames.add(m.group(1))
                return m.group(1)
        return None

    def feed(self, line) -> None:
        node = self._raw_node(line)
        if line.ip:
            self.has_ips = True
            m = NCCL_HOST.match(line.message) if "NCCL " in line.message else None
            if m and m.group(1) not in self.alias:
                self.alias[m.group(1)] = line.ip
        if node is None:
            self.driver_lines += 1
        elif node in self.seen or len(self.seen) < MAX_NODES:
            self.seen[node] = self.seen.get(node, 0) + 1

    def node_of(self, line) -> str:
        return self._resolve(self._raw_node(line))

    def _resolve(self, node: str | None) -> str:
        """Called once the log is read: an NCCL hostname never printed under `ip=` in a Ray log is the
        driver's own node (Ray names only the others)."""
        if node is None:
            return DRIVER
        if self.has_ips and not node.startswith("pod/") and node in self._hostnames and node not in self.alias:
            return DRIVER
        return self.alias.get(node, node)

    def nodes(self) -> list[str]:
        named = [self._resolve(n) for n in self.seen]
        if self.has_ips and self.driver_lines:
            named.insert(0, DRIVER)
        return list(dict.fromkeys(named))

    def story(self, matches, root_rule: str, ready: int) -> NodeStory | None:
        """Per node, its first fatal match after the server was last ready. None when the log shows one
        machine: no node identity at all, or only the driver's lines."""
        first_by_node: dict[str, tuple[int, str, int]] = {}
        root: tuple[int, int, str] | None = None
        for m in matches:
            if m.kind != "fatal" or m.seq <= ready:
                continue
            node = self.node_of(m.line)
            if node not in first_by_node or m.seq < first_by_node[node][0]:
                first_by_node[node] = (m.seq, m.rule_id, m.line.lineno)
            if m.rule_id == root_rule and (root is None or m.seq < root[0]):
                root = (m.seq, m.line.lineno, node)
        names = self.nodes()
        if root is None or (root[2] == DRIVER and len(first_by_node) < 2 and len(names) < 2):
            return None
        if not (self.has_ips or len(names) >= 2 or root[2] != DRIVER):
            return None
        followed = sorted((seq, node, rule, ln) for node, (seq, rule, ln) in first_by_node.items() if node != root[2])
        label = lambda n: "the driver's node" if n == DRIVER else n  # noqa: E731
        named = [label(n) for n in dict.fromkeys([*names, *first_by_node])]
        return NodeStory(label(root[2]), root_rule, root[1], [(label(n), r, ln) for _, n, r, ln in followed], named)
