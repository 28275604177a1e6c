"""Which node printed a line, and which node failed first, in a log that spans several machines.

A node is named by the strongest identity its lines carry: Ray's `ip=` prefix (actors on another node than
the driver), a `kubectl logs --prefix` pod, or NCCL's `hostname:pid:tid` prefix. In a Ray log the lines
without `ip=` are the driver's node (Ray names only the other nodes); an NCCL hostname seen on a line
with `ip=A` is node A. The first failing node is where the root cause's first line was printed: the
others' timeouts and broken pipes come after, from ranks that noticed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.events.logfacts import NCCL_HOST     # `host:pid:tid [dev] … NCCL INFO|WARN`

DRIVER = "driver"
DRIVER_LABEL = "the driver's node"       # how reports name it (a Ray log's lines without `ip=`)
MAX_NODES = 512                 # a log naming more distinct nodes than this is not counted further
# a process dying by a signal, as Python's faulthandler and Ray's/absl's signal handlers print it
CRASH_WORDS = ("*** SIG", "Fatal Python error", "Check failed")     # rules/_wrappers.toml makes them candidates
RAY_OOM_NODE = re.compile(r"Memory on the node \(IP: ([0-9A-Fa-f.:]{3,45})[,)]")   # Ray's OOM killer's message
MAX_PROCESSES = 32              # per node: the processes named in the story (the rest are counted)


def process_of(line) -> tuple[str | None, int | None]:
    """The process that printed `line` and its torch.distributed rank, as its prefixes say:
    (`RayWorkerWrapper pid=1320`, None) for `(RayWorkerWrapper pid=1320, ip=A)`, (None, 8) for `[rank8]:`,
    (`VllmWorker pid=7`, 1) for `(VllmWorker rank=1 pid=7)`; (None, None) for a line without one."""
    process = None
    if line.pid is not None:
        process = f"{line.proc} pid={line.pid}" if line.proc else f"pid={line.pid}"
    return process, line.rank


def where_in_cluster(process: str | None, rank: int | None) -> str:
    """`RayWorkerWrapper pid=1320, rank 8`; "" when neither is known."""
    return ", ".join(p for p in (process, f"rank {rank}" if rank is not None else None) if p)


@dataclass
class NodeStory:
    first: str                          # the node where the root cause was printed first
    first_rule: str
    first_line: int
    followed: list[tuple[str, str, int]] = field(default_factory=list)   # (node, rule or "error", line)
    nodes: list[str] = field(default_factory=list)                       # every node the log names
    first_process: str | None = None    # the process that printed it (`RayWorkerWrapper pid=1320`)
    first_rank: int | None = None       # its torch.distributed rank, when a prefix says it
    per_node: list[dict[str, Any]] = field(default_factory=list)         # {node, processes, lines, first_fatal}
    tied: list[str] = field(default_factory=list)      # nodes that printed the root cause in the same second

    def as_dict(self) -> dict[str, Any]:
        return {"failed_first": self.first, "undecided_with": self.tied, "process": self.first_process,
                "rank": self.first_rank,
                "rule": self.first_rule, "line": self.first_line,
                "followed": [{"node": n, "rule": r, "line": ln} for n, r, ln in self.followed],
                "nodes": self.per_node or [{"node": n} for n in self.nodes]}

    def sentence(self) -> str:
        who = where_in_cluster(self.first_process, self.first_rank)
        text = f"node {self.first}{f' ({who})' if who else ''} failed first ({self.first_rule}, line {self.first_line})"
        return text + (f"; {self.after()}" if self.followed else "")

    def after(self) -> str:
        """What the other nodes did (the `-->` line already says where it started)."""
        if self.tied:
            return (f"the log cannot tell whether {self.first} or {', '.join(self.tied)} failed first: each printed "
                    f"{self.first_rule} in the same second")
        if not self.followed:
            others = len(self.nodes) - 1
            return f"no other node failed ({others} other node{'s' if others != 1 else ''} in the log)"
        return ", ".join(f"{n} followed with {r} (line {ln})" for n, r, ln in self.followed)


class NodeTracker:
    def __init__(self) -> None:
        self.alias: dict[str, str] = {}      # NCCL hostname -> the ip= it was printed under
        self.seen: dict[str, int] = {}       # node -> lines
        self.driver_lines = 0                # lines with no node identity
        self.has_ips = False
        self._hostnames: set[str] = set()    # NCCL hostnames seen
        self.processes: dict[str | None, dict[str, None]] = {}   # raw node -> the processes seen there, in order
        self.crashes: list[tuple[int, str | None]] = []   # (seq, raw node) of the first error/crash line per node
        self._crashed: set[str | None] = set()              # ... the nodes in it

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

    def feed(self, line, seq: int = 0) -> None:
        node = crashed = self._raw_node(line)
        if "Memory on the node (IP:" in line.message and (m := RAY_OOM_NODE.search(line.message)):
            crashed = m.group(1)            # the node Ray's OOM killer killed on, whoever printed it
        if crashed not in self._crashed and len(self.crashes) < MAX_NODES and (
                line.level in ("ERROR", "CRITICAL") or any(w in line.message for w in CRASH_WORDS)):
            self._crashed.add(crashed)
            self.crashes.append((seq, crashed))
        if line.ip:
            self.has_ips = True
            m = NCCL_HOST.match(line.message) if "NCCL " in line.message else None
            if m and m.group(1) not in self.alias:
                self.alias[m.group(1)] = line.ip
        if node is None:
            self.driver_lines += 1
        elif node in self.seen or len(self.seen) < MAX_NODES:
            self.seen[node] = self.seen.get(node, 0) + 1
        if line.pid is not None and (node is None or node in self.seen):
            known = self.processes.setdefault(node, {})
            if len(known) < MAX_PROCESSES:
                known.setdefault(process_of(line)[0], None)

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

    def first_crash(self, after: int) -> str | None:
        """For a failure no rule names: the node whose error or crash line (ERROR/CRITICAL, a fatal signal) came
        first after `after`; a named node before the driver's (whose errors follow a remote crash), the driver's
        in a Ray log of several nodes, None on one machine."""
        crashed = [self._resolve(node) for seq, node in self.crashes if seq > after]
        named = [node for node in crashed if node != DRIVER]
        if named:        # the driver's own errors (ActorDiedError, a closed socket) follow a remote crash
            return named[0]
        # only unnamed lines: in a Ray log of several nodes they are the driver's; else one machine, no name
        return DRIVER_LABEL if crashed and self.has_ips else None

    def nodes(self) -> list[str]:
        named = [self._resolve(n) for n in self.seen]
        if self.has_ips and self.driver_lines:
            named.insert(0, DRIVER)
        return list(dict.fromkeys(named))

    def story(self, matches, root_rule: str, ready: int) -> NodeStory | None:
        """Per node, its first fatal match after the server was last ready. None when the log shows one
        machine: no node identity at all, or only the driver's lines."""
        first_by_node: dict[str, tuple[int, str, int]] = {}
        root_by_node: dict[str, tuple[int, Any]] = {}        # node -> its first root-cause line
        root: tuple[int, int, str] | None = None
        root_line = None
        for m in matches:
            if m.kind != "fatal" or m.seq <= ready:
                continue
            node = self.node_of(m.line)
            if node not in first_by_node or m.seq < first_by_node[node][0]:
                first_by_node[node] = (m.seq, m.rule_id, m.line.lineno)
            if m.rule_id == root_rule:
                if node not in root_by_node or m.seq < root_by_node[node][0]:
                    root_by_node[node] = (m.seq, m.line)
                if root is None or m.seq < root[0]:
                    root, root_line = (m.seq, m.line.lineno, node), m.line
        names = self.nodes()
        if root is None or (root[2] == DRIVER and len(first_by_node) < 2 and len(names) < 2):
            return None
        if not (self.has_ips or len(names) >= 2 or root[2] != DRIVER):
            return None
        followed = sorted((seq, node, rule, ln) for node, (seq, rule, ln) in first_by_node.items() if node != root[2])
        label = lambda n: DRIVER_LABEL if n == DRIVER else n  # noqa: E731
        order = list(dict.fromkeys([*names, *first_by_node]))
        process, rank = process_of(root_line)
        # Another node printed the root cause in the same second: the merged log's order (Ray forwards
        # its workers' lines late) cannot say which was first.
        stamp = root_line.stamp                 # the second its header says (sources/lines.py: any header)
        tied = [label(n) for n, (_, line) in root_by_node.items() if n != root[2] and stamp and line.stamp == stamp]
        return NodeStory(label(root[2]), root_rule, root[1], [(label(n), r, ln) for _, n, r, ln in followed],
                         [label(n) for n in order], process, rank, [self._entry(n, first_by_node, label) for n in order],
                         tied)

    def _entry(self, node: str, first_by_node: dict, label) -> dict[str, Any]:
        """One node of the story: the processes its lines name and its first fatal line (None: no failure)."""
        processes: dict[str, None] = {}
        for raw, seen in self.processes.items():
            if self._resolve(raw) == node:
                processes.update(seen)
        first = first_by_node.get(node)
        lines = sum(count for raw, count in self.seen.items() if self._resolve(raw) == node)
        if node == DRIVER:
            lines += self.driver_lines
        return {"node": label(node), "processes": [p for p in processes if p], "lines": lines,
                "first_fatal": {"rule": first[1], "line": first[2]} if first else None}
