"""One log line, decoded and understood: ANSI colour, process prefixes and logger headers stripped.

vLLM prints the same message under many wrappers (docs/reference/vllm-messages.md §1):
`(EngineCore pid=1) ERROR 12-01 00:37:45 [core.py:1510] ValueError: ...`, `[rank0]: ...`,
`(RayWorkerWrapper pid=3223, ip=10.0.0.2) ...`, `INFO 05-12 10:11:12 llm_engine.py:98] ...`.
Rules match on `Line.message`, the text with all of that removed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import regex

from vllm_doctor.numbers import parse_int

# CSI (colours, erase-line), OSC (titles, links) and two-byte escapes. The stdlib `re`: the same pattern,
# and its sub() is ~3x faster than regex's on these short lines (the TUI's log view cleans every line it
# shows with clean_text).
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A colour code whose ESC was written out as text: rsyslog's default ($EscapeControlCharactersOnReceive) writes it as
# `#` and its octal code (`#033[2m` in /var/log/messages); `cat -v`, `less` or a terminal's copy in caret notation
# (`^[[36m(RayWorkerWrapper pid=1, …)^[[0m`)
WRITTEN_ANSI = re.compile(r"(?:#033|\^\[)\[[0-9;?]*[ -/]*[@-~]")
# `(APIServer pid=1)`, `(Worker_TP1 pid=2)`, `(VllmWorker rank=0 pid=3)`, `(RayWorkerWrapper pid=4, ip=A)`,
# `(pid=5, ip=A)`. Ray may print the prefix twice when actors log through the driver.
PROC_PREFIX = regex.compile(
    r"\((?:(?P<proc>[A-Za-z_][^()=]*?)\s+)?(?:rank=(?P<rank>\d+)\s+)?pid=(?P<pid>\d+)"
    r"(?:,\s*ip=(?P<ip>[^)\s]+))?\)\s?")
# Ray's daemons forwarded to the driver: `(raylet)`, `(raylet, ip=A)` (a raylet's fatal check names its node)
RAY_DAEMON_PREFIX = regex.compile(r"\((?P<proc>raylet|gcs_server|dashboard_agent|autoscaler|monitor)"
                                  r"(?:,\s*ip=(?P<ip>[^)\s]+))?\)\s?")
# `kubectl logs --prefix`: `[pod/vllm-worker-0/vllm] …` (one pod per node in multi-node deployments)
KUBE_PREFIX = regex.compile(r"\[pod/(?P<pod>[\w.-]{1,253})/[\w.-]{1,63}\] ")
# `docker compose logs`: `vllm-1  | …`
COMPOSE_PREFIX = regex.compile(r"(?P<service>[\w.-]+)\s*\| ")
# a log viewer's own timestamp column before a bar (`2026-05-01 19:03:56.222 | WARNING 05-01 …`): no part of the line
VIEWER_STAMP = regex.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?\s{0,3}\| ")
# a launcher's own stamp and level around the child's line, before vLLM's process prefix (`2026-07-28 06:23:24 [ERROR]
# (APIServer pid=551960)   File …`): the level is the launcher's (stderr is its ERROR), not vLLM's, so it is dropped
LAUNCHER_STAMP = regex.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?\s{1,3}"
                               r"\[(?:DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL)\]\s{1,8}(?=\((?:\w{1,40}[ _])?pid=)")
RANK_PREFIX = regex.compile(r"\[rank(?P<rank>\d+)\]:\s?")
# torchrun's `--tee`: its role (`default`) and the worker's local rank (torch/distributed/elastic/tail_log.py)
TORCHRUN_PREFIX = regex.compile(r"\[default(?P<local>\d{1,5})\]:")
# vLLM logger header, with (0.8+) or without (<=0.7) brackets around file:line.
LOG_HEADER = regex.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? "
    r"(?:\[(?P<fileinfo>[^\]\s]+)\]|(?P<fileinfo2>[\w.\-]+:\d+)\])\s?")
# glog header of PyTorch's C++ side: `[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] `
GLOG_HEADER = regex.compile(r"\[(?P<glevel>[IWEF])(?P<gmonth>\d\d)(?P<gday>\d\d) (?P<gtime>\d\d:\d\d:\d\d)[\d.]* "
                            r"(?:\d+ )?[\w.\-]+:\d+\]\s?")
RAY_REPEATED = regex.compile(r"\s*\[repeated \d+x across cluster\]$")
GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
# Ray's C++ side (spdlog `[%Y-%m-%d %H:%M:%S,%e %L %P %t]`): `[2025-12-12 15:10:48,697 C 42791 42791] `; C is a
# failed RAY_CHECK, which aborts the process (raylet, core worker)
RAY_CPP_HEADER = regex.compile(r"\[\d{4}-(?P<rstamp>\d\d-\d\d \d\d:\d\d:\d\d),\d{3} (?P<rlevel>[TDIWEC]) (?P<rpid>\d+) \d+\]\s?")
RAY_CPP_LEVELS = {"T": "DEBUG", "D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "C": "CRITICAL"}
# LMCache's own formatter (lmcache/logging.py, coloured whatever the output): `[2025-05-17 09:10:17,149] LMCache ERROR:
# Failed to read … (fs_connector.py:106:lmcache.…)`
LMCACHE_HEADER = regex.compile(r"\[\d{4}-(?P<lstamp>\d\d-\d\d \d\d:\d\d:\d\d),\d{3}\] LMCache "
                               r"(?P<llevel>DEBUG|INFO|WARNING|ERROR|CRITICAL): ?")
# Python's logging as xinference (to 1.x) configures it, `%(asctime)s %(name)-12s %(process)d %(levelname)-8s`:
# `2025-04-15 10:15:22,015 xinference.core.worker 48577 ERROR    Failed to load model …`
PY_LOG_HEADER = regex.compile(r"\d{4}-(?P<pstamp>\d\d-\d\d \d\d:\d\d:\d\d),\d{3} [A-Za-z_][\w.]{0,100} +\d{1,10} "
                              r"(?P<plevel>DEBUG|INFO|WARNING|ERROR|CRITICAL) +")
# A logging config of the user's own in the common `%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d]`
# shape (VLLM_LOGGING_CONFIG_PATH, a wrapper's): `2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] …`
ASCTIME_HEADER = regex.compile(r"\d{4}-(?P<astamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d{1,6})? "
                               r"(?P<alevel>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?:\d{1,10} )?\[(?P<afile>[\w.\-]+:\d+)\]\s?")
# xinference 2.x's text formatter (deploy/utils.py TextFileFormatter), its `node:` the machine's host name:
# `2026-08-07T18:25:43.623Z ERROR xinference.core.worker pid:41 role:local address:0.0.0.0:26776 node:3d67e2e62a71 …`
XINF_HEADER = regex.compile(r"\d{4}-(?P<xdate>\d\d-\d\d)T(?P<xtime>\d\d:\d\d:\d\d)\.\d{3}Z "
                            r"(?P<xlevel>DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]{1,100} pid:\d{1,10} role:\S{0,40} "
                            r"address:\S{0,300} node:(?P<host>\S{1,253}) ?")


@dataclass(slots=True)
class Line:
    source: str
    lineno: int
    raw: str                 # decoded, ANSI and \r removed
    message: str             # raw without process prefix, rank prefix and logger header
    proc: str | None = None
    pid: int | None = None
    ip: str | None = None
    rank: int | None = None
    level: str | None = None
    fileinfo: str | None = None
    service: str | None = None   # `docker compose logs` service prefix (`vllm-1  | …` -> "vllm-1")
    pod: str | None = None       # `kubectl logs --prefix` pod (`[pod/vllm-0/vllm] …` -> "vllm-0")
    stamp: str | None = None     # the second its header says it was logged at, as "MM-DD hh:mm:ss" (any header)
    local_rank: int | None = None    # torchrun's `[default3]:` prefix: the worker's rank on its node
    host: str | None = None      # a launcher's header names the machine (xinference 2.x's `node:`)

    @property
    def proc_key(self) -> str:
        """Identifies the process that printed the line, to keep interleaved tracebacks apart."""
        if self.pid is not None:
            return f"{self.proc or ''}:{self.pid}:{self.ip or ''}"
        if self.rank is not None:
            return f"rank{self.rank}"
        if self.local_rank is not None:
            return f"local{self.local_rank}"
        return "main"


def clean_text(data: bytes | str) -> str:
    """One line's bytes (or text) as a person reads it; the one cleaner of the diagnosis and the TUI.

    Decoded as UTF-8 (invalid bytes replaced), trailing newlines dropped, ANSI escape sequences removed,
    then carriage returns resolved the way a terminal leaves the line: what follows the last `\\r` that
    is followed by visible text. A progress bar's frames (`10%\\r 50%\\r100%`) show as the last one; a
    CRLF ending (or any trailing `\\r`) is only a line ending; a blank frame (tqdm's `\\r   \\r` that
    clears the bar) does not hide the frame before it. Tabs are kept (the log view expands them)."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, (bytes, bytearray)) else data
    text = text.rstrip("\n")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    if "#033[" in text or "^[[" in text:
        text = WRITTEN_ANSI.sub("", text)
    if text.endswith("^M"):                          # a CR in caret notation (`cat -v`, an editor's paste)
        text = text[:-2]
    if "\r" in text:
        text = text.rstrip("\r")                     # CRLF (the usual case): a line ending
        if "\r" in text:
            last = text.rpartition("\r")[2]
            if last.strip():
                text = last                          # progress frames: `...\rlast frame`
            else:
                parts = [p for p in text.split("\r") if p.strip()]
                text = parts[-1] if parts else ""
        elif text.isspace():
            text = ""
    return text


def parse_line(data: bytes | str, source: str = "", lineno: int = 0) -> Line:
    raw = clean_text(data)
    line = Line(source=source, lineno=lineno, raw=raw, message=raw)
    rest = raw
    if rest[:1] == "`" and "`(" in rest[:4]:      # a paste's Markdown quote left before a Ray prefix: `` `(RayWorker… ``
        rest = rest.lstrip("`")
    if rest.startswith("[pod/"):
        m = KUBE_PREFIX.match(rest)
        if m:
            line.pod = m.group("pod")
            rest = rest[m.end():]
    if rest[:2] == "20" and (m := VIEWER_STAMP.match(rest) or LAUNCHER_STAMP.match(rest)):
        rest = rest[m.end():]
    elif rest[:1] in " \xa0|" and (row := rest.lstrip(" \xa0"))[:4] == "| 20" and (m := VIEWER_STAMP.match(row, 2)):
        rest = row[m.end():]                         # the same column as a pasted table row: ` | 2025-…Z | `
    m = COMPOSE_PREFIX.match(rest)
    if m and m.end() < 60:
        line.service = m.group("service")
        rest = rest[m.end():]
    for _ in range(4):  # prefixes can nest: `(RayWorkerWrapper pid=1, ip=A) [rank1]: ...`
        m = PROC_PREFIX.match(rest)
        if m:
            line.proc = (m.group("proc") or "").strip() or line.proc
            line.pid = parse_int(m.group("pid"))      # None: more digits than any pid has
            line.ip = m.group("ip") or line.ip
            if m.group("rank"):
                line.rank = parse_int(m.group("rank"))
            rest = rest[m.end():]
            continue
        m = RANK_PREFIX.match(rest)
        if m:
            line.rank = parse_int(m.group("rank"))
            rest = rest[m.end():]
            continue
        m = TORCHRUN_PREFIX.match(rest) if rest[:8] == "[default" else None
        if m:
            line.local_rank = parse_int(m.group("local"))
            rest = rest[m.end():]
            continue
        m = RAY_DAEMON_PREFIX.match(rest) if rest[:2] in ("(r", "(g", "(d", "(a", "(m") else None
        if m:
            line.proc, line.pid = m.group("proc"), None     # the pid before it was the forwarding process's
            line.ip = m.group("ip") or line.ip
            rest = rest[m.end():]
            continue
        break
    m = LOG_HEADER.match(rest)
    if m is None and rest[:1] != "[" and " " in rest[:40]:
        # an optional VLLM_LOGGING_PREFIX may stand before the header
        m2 = LOG_HEADER.search(rest, 0, 80)
        m = m2 if m2 is not None and m2.start() < 40 else None
    if m:
        line.level = "WARNING" if m.group("level") == "WARN" else m.group("level")
        line.fileinfo = m.group("fileinfo") or m.group("fileinfo2")
        line.stamp = m.group("stamp")
        rest = rest[m.end():]
    else:
        m = GLOG_HEADER.match(rest)
        if m:
            line.level = GLOG_LEVELS[m.group("glevel")]
            line.stamp = f"{m.group('gmonth')}-{m.group('gday')} {m.group('gtime')}"
            rest = rest[m.end():]
        elif rest[:3] == "[20" and (m := RAY_CPP_HEADER.match(rest)):
            line.level, line.stamp = RAY_CPP_LEVELS[m.group("rlevel")], m.group("rstamp")
            if line.pid is None:            # a daemon's prefix names no pid: its header does (`C 42791 42791`)
                line.pid = parse_int(m.group("rpid"))
            rest = rest[m.end():]
        elif rest[:3] == "[20" and (m := LMCACHE_HEADER.match(rest)):
            line.level, line.stamp = m.group("llevel"), m.group("lstamp")
            rest = rest[m.end():]
        elif rest[:2] == "20" and (m := PY_LOG_HEADER.match(rest)):
            line.level, line.stamp = m.group("plevel"), m.group("pstamp")
            rest = rest[m.end():]
        elif rest[:2] == "20" and (m := ASCTIME_HEADER.match(rest)):
            line.level, line.stamp, line.fileinfo = m.group("alevel"), m.group("astamp"), m.group("afile")
            rest = rest[m.end():]
        elif rest[:2] == "20" and (m := XINF_HEADER.match(rest)):
            line.level, line.host = m.group("xlevel"), m.group("host")
            line.stamp = f"{m.group('xdate')} {m.group('xtime')}"
            rest = rest[m.end():]
    if rest.endswith("across cluster]"):        # Ray's log dedup: `msg [repeated 7x across cluster]`
        rest = RAY_REPEATED.sub("", rest)
    line.message = rest
    return line
