"""Which node printed a line, and which node failed first, in a log that spans several machines.

A node is named by the strongest identity its lines carry: Ray's `ip=` prefix (actors on another node than
the driver), a `kubectl logs --prefix` pod, or NCCL's `hostname:pid:tid` prefix. In a Ray log the lines
without `ip=` are the driver's node (Ray names only the other nodes); an NCCL hostname seen on a line
with `ip=A` is node A. The first failing node is where the root cause's first line was printed: the
others' timeouts and broken pipes come after, from ranks that noticed. For a failure no rule names it is the
first error or crash line, where a line that names who died (events/deaths.py) counts for the victim.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vllm_doctor.events.logfacts import NCCL_HOST     # `host:pid:tid [dev] … NCCL INFO|WARN`
from vllm_doctor.facts.origin import LOOPBACK
from vllm_doctor.events.deaths import (ACTOR_DIED, ACTOR_FIELD, CRASH_WORDS, EXITING, FIELDS_WITHIN, PEER_GONE,
                                      RAY_OOM_NODE, RAY_OOM_TASK, RAY_TASK_ORIGIN, RAY_WORKER_DIED, ROOT_CAUSE,
                                      TABLE_FIELD, TORCHRUN_WORDS, XINF_HOME, XOSCAR_ORIGIN, Crash, exit_code,
                                      table_crash, victim)

DRIVER = "driver"
DRIVER_LABEL = "the driver's node"       # how reports name it (a Ray log's lines without `ip=`)
MAX_NODES = 512                 # a log naming more distinct nodes than this is not counted further
MAX_PROCESSES = 32              # per node: the processes named in the story (the rest are counted)


def process_of(line) -> tuple[str | None, int | None]:
    """The process that printed `line` and its torch.distributed rank, as its prefixes say:
    (`RayWorkerWrapper pid=1320`, None) for `(RayWorkerWrapper pid=1320, ip=A)`, (None, 8) for `[rank8]:`,
    (`VllmWorker pid=7`, 1) for `(VllmWorker rank=1 pid=7)`; (None, None) for a line without one."""
    process = None
    if line.pid is not None:
        process = f"{line.proc} pid={line.pid}" if line.proc else f"pid={line.pid}"
    elif line.local_rank is not None:                  # torchrun's `[default3]:`
        process = f"local_rank {line.local_rank}"
    elif "[address=" in line.message and (m := XOSCAR_ORIGIN.search(line.message)):
        process = f"pid={m.group(2)}"                  # the actor pool xoscar says raised it
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
    peer: bool = False      # `first` is a peer another node saw close its connection: its own failure is not here
    this_machine: str | None = None     # the node the doctor runs on, when its own facts are in the diagnosis

    def as_dict(self) -> dict[str, Any]:
        return {"failed_first": self.first, "undecided_with": self.tied, "process": self.first_process,
                "rank": self.first_rank,
                "rule": self.first_rule, "line": self.first_line,
                "followed": [{"node": n, "rule": r, "line": ln} for n, r, ln in self.followed],
                "nodes": self.per_node or [{"node": n} for n in self.nodes]}

    def mark_machine(self, node: str | None, machine: dict[str, Any]) -> str | None:
        """`node` is this machine (facts/origin.this_node): its entry gets `this_machine` and the GPU facts read
        here (`machine`). A notice when the failure started on another node: the facts read here are not
        that node's."""
        self.this_machine = node
        if node is None:
            return None
        for entry in self.per_node:
            if entry["node"] == node:
                entry["this_machine"] = True
                entry.setdefault("facts", {}).update(machine)
        if node == self.first:
            return None
        where = node if node == DRIVER_LABEL else f"node {node}"
        return (f"this machine is {where}: the GPUs and environment read here are its own, while the failure "
                f"started on {self.first}; run `vllm-doctor facts` there (or `vllm-doctor facts --ray` on the "
                "head) for that node's")

    def sentence(self) -> str:
        who = where_in_cluster(self.first_process, self.first_rank)
        text = f"node {self.first}{f' ({who})' if who else ''} failed first ({self.first_rule}, line {self.first_line})"
        return text + (f"; {self.after()}" if self.followed else "")

    def after(self) -> str:
        """What the other nodes did (the `-->` line already says where it started)."""
        if self.tied:
            return (f"the log cannot tell whether {self.first} or {', '.join(self.tied)} failed first: each printed "
                    f"{self.first_rule} in the same second")
        if self.peer and not self.followed:
            return "the node this log is from only saw it go: the peer's own log holds its failure"
        if not self.followed:
            others = len(self.nodes) - 1
            return f"no other node failed ({others} other node{'s' if others != 1 else ''} in the log)"
        return ", ".join(f"{n} followed with {r} (line {ln})" for n, r, ln in self.followed)


class NodeTracker:
    def __init__(self) -> None:
        self.alias: dict[str, str] = {}      # NCCL hostname -> the ip= it was printed under
        self.last_node: str = DRIVER         # the raw node of the line fed last (DRIVER: no node identity)
        self.seen: dict[str, int] = {}       # node -> lines
        self.driver_lines = 0                # lines with no node identity
        self.has_ips = False
        self._hostnames: set[str] = set()    # NCCL hostnames seen
        self._pools: set[str] = set()        # the addresses xoscar's tags say an error was raised at
        self._home: set[str] = set()         # ... and the ones xinference says this log's pools run at
        self._last_host: tuple[str, int, str] | None = None   # (source, line number, host) of the last header host
        self.processes: dict[str | None, dict[str, None]] = {}   # raw node -> the processes seen there, in order
        self.crashes: list[Crash] = []          # the first error/crash line per node, in order
        self._crashed: set[str | None] = set()  # ... the nodes in it
        self._by_node: dict[str, dict] = {}     # raw node -> its facts (Facts.by_node), for the story
        self.first_process: Crash | None = None  # the first process that died or erred, on any node
        self.first_victim: Crash | None = None   # the first process a death line names (DEATH)
        self.peers_gone: list[tuple[int, Any]] = []   # (seq, line) of connections a remote peer closed
        self.exiting = 0                        # seq of PyTorch's exit-time warning (EXITING)
        self._actor: tuple[int, Any, dict[str, str]] | None = None   # an ActorDiedError's fields being read
        self._table: tuple[int, Any, dict[str, str]] | None = None   # torchrun's root-cause table being read

    def _raw_node(self, line) -> str | None:
        if line.ip:
            return line.ip
        if line.pod:
            return f"pod/{line.pod}"
        if line.host:
            return line.host
        if "[address=" in line.message and (m := XOSCAR_ORIGIN.search(line.message)):
            self._pools.add(m.group(1))
            return m.group(1)
        if "NCCL " in line.message:
            m = NCCL_HOST.match(line.message)
            if m:
                self._hostnames.add(m.group(1))
                return m.group(1)
        return None

    def feed(self, line, seq: int = 0) -> None:
        if line.host is not None:
            self._last_host = (line.source, line.lineno, line.host)
        elif line.level is None and self._last_host and self._last_host[:2] == (line.source, line.lineno - 1):
            # a header's record goes on without one (its traceback): the same machine's
            line.host = self._last_host[2]
            self._last_host = (line.source, line.lineno, line.host)
        node = crashed = self._raw_node(line)
        self.last_node = DRIVER if node is None else node     # whose facts the line's are (resolved in story())
        message = line.message
        printer, rank = process_of(line)
        process = printer
        if "Memory on the node (IP:" in message and (m := RAY_OOM_NODE.search(message)):
            crashed = m.group(1)            # the node Ray's OOM killer killed on, whoever printed it
            task = RAY_OOM_TASK.search(message)
            process, rank = (f"{task.group(1)} pid={task.group(2)}" if task else None), None
        in_actor = self._actor is not None and self._read_actor(line, seq)    # a line of the error's message
        if self._table is not None:
            self._read_table(line, seq)
        if ROOT_CAUSE in message:
            self._table = (seq, line, {})
        if ACTOR_DIED in message:           # the actor's own lines follow: recorded once they are read
            self._actor = (seq, line, {})
        elif (named := victim(line)) is not None:
            process, rank = self._victim(line, node, named)
            if self.first_victim is None:
                self.first_victim = Crash(seq, crashed, process, rank, line.lineno, source=line.source,
                                          exit_code=exit_code(message), verdict=TORCHRUN_WORDS in message)
        elif "() (pid=" in message and (m := RAY_TASK_ORIGIN.search(message)):
            self._crash(Crash(seq, m.group(3), f"{m.group(1)} pid={m.group(2)}", None, line.lineno))
        elif "Worker PID: " in message and (m := RAY_WORKER_DIED.search(message)):
            named_as = self._known_as(m.group(1), pid=m.group(2)) or f"pid={m.group(2)}"
            self._crash(Crash(seq, m.group(1), named_as, None, line.lineno))
        if ACTOR_DIED not in message and not in_actor and (
                line.level in ("ERROR", "CRITICAL") or any(w in message for w in CRASH_WORDS)):
            self._crash(Crash(seq, crashed, process, rank, line.lineno))
        if "onnection" in message and (m := PEER_GONE.search(message)):
            peer = m.group("c10d") or m.group("peer")
            if not self.exiting and len(self.peers_gone) < MAX_NODES:
                self.peers_gone.append((seq, line))
            if not peer.startswith(LOOPBACK) and not self.exiting:
                self._crash(Crash(seq, peer, None, None, line.lineno, peer=True))
        if "Xinference " in message and (m := XINF_HOME.search(message)):
            self._home.add(m.group(1))
        if EXITING in message and not self.exiting:
            self.exiting = seq
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
                known.setdefault(printer, None)

    @property
    def busy(self) -> bool:
        """Reading an ActorDiedError's fields or torchrun's table: every line is wanted (they carry no literal)."""
        return self._actor is not None or self._table is not None

    def _crash(self, crash: Crash) -> None:
        if self.first_process is None and not crash.peer:
            self.first_process = crash
        if crash.node not in self._crashed and len(self.crashes) < MAX_NODES:
            self._crashed.add(crash.node)
            self.crashes.append(crash)

    def _known_as(self, node: str | None, name: str | None = None, pid: str | None = None) -> str | None:
        """A process as the node's own line prefixes named it, by its name (`VllmWorker-1` -> `VllmWorker-1
        pid=16759`) or its pid (442 -> `RayWorkerWrapper pid=442`); None unless exactly one fits."""
        known = [p for p in self.processes.get(node, {})
                 if p and (p.startswith(f"{name} pid=") if name else p.endswith(f" pid={pid}"))]
        return known[0] if len(known) == 1 else None

    def _victim(self, line, node: str | None, named: tuple[str, int | None]) -> tuple[str, int | None]:
        """The process a death line names (deaths.victim), with its pid where its own lines gave one, and
        its engine in a data-parallel log (each engine has its own VllmWorker-0 ...)."""
        process, rank = named
        if " pid=" not in process:
            process = self._known_as(node, name=process) or process
        engines = {p.split(" ", 1)[0] for p in self.processes.get(node, {}) if p and p.startswith("EngineCore_DP")}
        if process.startswith("VllmWorker") and len(engines) > 1 and line.proc in engines:
            process += f" of {line.proc}"
        return process, rank

    def _read_actor(self, line, seq: int) -> bool:
        """The fields after an ActorDiedError's first line: the actor's pid and node name the victim. Whether
        `line` was one of them."""
        start, first, fields = self._actor
        m = ACTOR_FIELD.match(line.message)
        if m:
            fields[m.group(1)] = m.group(2)
        if not m or seq - start >= FIELDS_WITHIN or "ip" in fields:
            self.flush()
        return m is not None

    def _read_table(self, line, seq: int) -> None:
        """The fields of torchrun's root-cause table (deaths.ROOT_CAUSE): the failure its agent observed first.
        It names the worker's global rank and exit code; the line before it (TORCHRUN_FAILED), when the log
        has it, named the same worker by its local rank and became first_victim."""
        start, first, fields = self._table
        m = TABLE_FIELD.match(line.message)
        if m and m.group(1) and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2).strip()
        if m is not None and "exitcode" not in fields and seq - start < FIELDS_WITHIN:
            return
        self._table = None
        found = table_crash(fields)
        if found is None:
            return
        process, rank, code = found
        seen = self.first_victim
        if seen is None or seen.process == process:
            at = seen or Crash(start, None, process, rank, first.lineno, source=first.source)
            self.first_victim = replace(at, rank=rank, exit_code=code, verdict=True)

    def flush(self) -> None:
        """Record an ActorDiedError whose fields were being read (the log may end inside them)."""
        if self._table is not None:
            self._read_table(self._table[1], self._table[0] + FIELDS_WITHIN)
        if self._actor is None:
            return
        start, first, fields = self._actor
        self._actor = None
        process, rank = process_of(first)
        if "pid" in fields:
            process = f"{fields.get('class_name', 'actor')} pid={fields['pid']}"
        self._crash(Crash(start, fields.get("ip") or self._raw_node(first), process, rank if "pid" not in fields
                          else None, first.lineno))

    def node_of(self, line) -> str:
        return self._resolve(self._raw_node(line))

    def _resolve(self, node: str | None) -> str:
        """Called once the log is read: an NCCL hostname never printed under `ip=` in a Ray log is the
        driver's own node (Ray names only the others)."""
        if node is None:
            return DRIVER
        if node in self._pools and (not self._home or node in self._home or node.startswith(LOOPBACK)):
            return DRIVER       # xoscar's tag names this log's own machine, or the log does not say which that is
        if self.has_ips and not node.startswith("pod/") and node in self._hostnames and node not in self.alias:
            return DRIVER
        return self.alias.get(node, node)

    def first_crash(self, after: int) -> Crash | None:
        """For a failure no rule names, where it started (after `after`): the node whose error or crash line
        (ERROR/CRITICAL, a fatal signal, a death that names its victim, a peer that closed) came first, a named
        node before the driver's (whose errors follow a remote crash), the driver's in a Ray log of several
        nodes; with the process and rank that line names. On one machine only a death line's victim (a
        process's first ERROR line may only report another's crash: the finding's evidence says where)."""
        self.flush()
        crashes = sorted((c for c in self.crashes if c.seq > after), key=lambda c: c.seq)
        named = [c for c in crashes if self._resolve(c.node) != DRIVER]
        if named:        # the driver's own errors (ActorDiedError, a closed socket) follow a remote crash
            return replace(named[0], node=self._resolve(named[0].node))
        first = self.first_process if self.first_process and self.first_process.seq > after else None
        # only unnamed lines: in a Ray log of several nodes they are the driver's; on one machine the finding's
        # own evidence says where (a process's first ERROR line may only report another's crash)
        if first is not None and self.has_ips:
            return Crash(first.seq, DRIVER_LABEL, first.process, first.rank, first.lineno)
        # one machine: a process that died, named by the one that noticed (its own lines stop with it)
        victim = self.first_victim
        return victim if victim is not None and victim.seq > after and not self.has_ips else None

    def nodes(self) -> list[str]:
        named = [self._resolve(n) for n in self.seen]
        remote_pool = any(self._resolve(n) != DRIVER for n in self._pools)     # another machine's, by its tag
        if (self.has_ips or remote_pool) and self.driver_lines:
            named.insert(0, DRIVER)
        return list(dict.fromkeys(named))

    def story(self, matches, root_rule: str, ready: int, by_node=None) -> NodeStory | None:
        """Per node, its first fatal match after the server was last ready. None when the log shows one
        machine: no node identity at all, or only the driver's lines. `by_node`: raw node -> the facts its
        lines gave (Facts.by_node), told per node."""
        self._by_node = by_node or {}
        first_by_node: dict[str, tuple[int, str, int]] = {}
        root_by_node: dict[str, tuple[int, Any]] = {}        # node -> its first root-cause line
        root: tuple[int, int, str] | None = None
        root_line = None
        for m in matches:
            if m.kind != "fatal" or m.seq <= ready:
                continue
            printed = m.printed          # an exception line pasted without Ray's prefix: its traceback's start
            node = self.node_of(printed)
            if node not in first_by_node or m.seq < first_by_node[node][0]:
                first_by_node[node] = (m.seq, m.rule_id, m.line.lineno)
            if m.rule_id == root_rule:
                if node not in root_by_node or m.seq < root_by_node[node][0]:
                    root_by_node[node] = (m.seq, m.line)
                if root is None or m.seq < root[0]:
                    root, root_line = (m.seq, m.line.lineno, node), printed
        names = self.nodes()
        if root is None or (root[2] == DRIVER and len(first_by_node) < 2 and len(names) < 2):
            return None
        if not (self.has_ips or len(names) >= 2):     # one host's name (NCCL's prefix, one pod): one machine
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

    def where_it_started(self, root, matches, ready: int, by_node=None) -> NodeStory | None:
        """The root finding's story (None on one machine). A rule's: where its lines were printed first; a
        failure no rule names: its first crash line's (first_crash), whose node, process and rank (and what
        its exit code means) become the finding's facts and notes. `root`: a findings.Finding."""
        if root.rule != "unrecognized":
            story = self.story(matches, root.rule, ready, by_node)
            if story is not None:
                root.facts["failed_first_on"] = story.first
            return story
        crash = self.first_crash(ready)
        evidence = root.evidence[0] if root.evidence else None
        if crash is None or crash.node is None and evidence is not None and not crash.verdict and (
                crash.source == evidence.source and crash.lineno > evidence.lineno):
            return None     # one machine: the failure the finding cites came before the death it caused
        root.facts.update(crash.facts())
        root.notes += crash.notes()
        if (killed := crash.killed()) is not None:     # what the short report's `because:` says first
            root.explanation = f"{killed}. {root.explanation}"
        return self.crash_story(crash, ready, by_node)

    def crash_story(self, crash: Crash, ready: int, by_node=None) -> NodeStory | None:
        """The story of a failure no rule names, in a log of several nodes: `crash` (first_crash) is where it
        started; each other node's first error or crash line follows. None on one machine."""
        self._by_node = by_node or {}
        names = self.nodes()
        if crash.node is None or len(names) < 2 and not (self.has_ips or crash.peer):
            return None
        first = DRIVER if crash.node == DRIVER_LABEL else crash.node
        first_by_node: dict[str, tuple[int, str, int]] = {}
        for c in sorted(self.crashes, key=lambda c: c.seq):
            node = self._resolve(c.node)
            if c.seq > ready and node not in first_by_node:
                first_by_node[node] = (c.seq, "unrecognized", c.lineno)
        first_by_node[first] = (crash.seq, "unrecognized", crash.lineno)
        label = lambda n: DRIVER_LABEL if n == DRIVER else n  # noqa: E731
        followed = sorted((seq, n, rule, ln) for n, (seq, rule, ln) in first_by_node.items() if n != first)
        order = list(dict.fromkeys([*names, *first_by_node]))
        return NodeStory(label(first), "unrecognized", crash.lineno, [(label(n), r, ln) for _, n, r, ln in followed],
                         [label(n) for n in order], crash.process, crash.rank,
                         [self._entry(n, first_by_node, label) for n in order], peer=crash.peer)

    def _entry(self, node: str, first_by_node: dict, label) -> dict[str, Any]:
        """One node of the story: the processes its lines name, what its lines said (its facts) and its first
        fatal line (None: no failure)."""
        facts: dict[str, Any] = {}
        for raw, said in self._by_node.items():
            if self._resolve(None if raw == DRIVER else raw) == node:
                for key, fact in said.items():
                    facts.setdefault(key, fact.value)
        processes: dict[str, None] = {}
        for raw, seen in self.processes.items():
            if self._resolve(raw) == node:
                processes.update(seen)
        first = first_by_node.get(node)
        lines = sum(count for raw, count in self.seen.items() if self._resolve(raw) == node)
        if node == DRIVER:
            lines += self.driver_lines
        return {"node": label(node), "processes": [p for p in processes if p], "lines": lines,
                "facts": dict(sorted(facts.items())),
                "first_fatal": {"rule": first[1], "line": first[2]} if first else None}
