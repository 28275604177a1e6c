"""The launch of a vLLM server on this machine, from the process list: `health` joins a running server to the
command that started it (its -tp/-pp, its --max-num-seqs) and to the GPU selection in its environment, when
the user gives no --cmd. Read from /proc (Linux): the command line of every process, the environment only of
the server found (readable for the user's own processes). Nothing is changed, nothing is sent."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# what marks a vLLM API server's argv, and where its own arguments start
SERVE = ("serve",)                                        # `vllm serve M`, `python -m vllm.entrypoints.cli.main serve M`
API_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
ENV_KEPT = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    command: str                        # as the user would type it: `vllm serve M --port 8001 -tp 4`
    port: int
    environ: dict[str, str] = field(default_factory=dict)    # ENV_KEPT, where readable
    family: frozenset[int] = frozenset()     # the server and every process under it (engine cores, workers)


def vllm_argv(argv: list[str]) -> list[str] | None:
    """The `vllm serve …` (or `python -m vllm.entrypoints.openai.api_server …`) part of a process's argv, the
    launcher's own interpreter and flags dropped; None when it is no vLLM API server."""
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name == "vllm" and argv[i + 1:i + 2] == ["serve"]:
            return ["vllm", *argv[i + 1:]]
        if arg == "-m" and argv[i + 1:i + 2] and argv[i + 1] in API_MODULES:
            return ["python", "-m", *argv[i + 1:]]
        if arg == "-m" and argv[i + 1:i + 2] == ["vllm.entrypoints.cli.main"] and argv[i + 2:i + 3] == ["serve"]:
            return ["vllm", *argv[i + 2:]]
    return None


def _port(argv: list[str]) -> int:
    """The port the server's own arguments name (the command model reads `--port=N` and abbreviations too)."""
    from vllm_doctor.command import Command

    value = Command.parse(shlex.join(argv)).get("--port")
    return DEFAULT_PORT if value is None else int(value) if isinstance(value, str) and value.isdigit() else -1


def _read(path: Path) -> list[str]:
    try:
        return [p.decode("utf-8", "replace") for p in path.read_bytes().split(b"\0") if p]
    except OSError:          # gone since the listing, or not ours to read
        return []


def find_server(port: int, proc: Path = Path("/proc")) -> ServerProcess | None:
    """The vLLM API server listening on `port` by its own arguments (the oldest such process: the API server,
    not the engine cores it forked with the same argv); None when there is none or /proc is not there."""
    try:
        pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    except OSError:
        return None
    for pid in pids:
        argv = vllm_argv(_read(proc / str(pid) / "cmdline"))
        if argv is None or _port(argv) != port:
            continue
        env = dict(e.split("=", 1) for e in _read(proc / str(pid) / "environ") if "=" in e)
        return ServerProcess(pid, shlex.join(argv), port, {k: env[k] for k in ENV_KEPT if k in env},
                             _family(pid, pids, proc))
    return None


def _family(root: int, pids: list[int], proc: Path) -> frozenset[int]:
    """`root` and its descendants, by each process's parent in /proc/PID/stat (the field after the name, which
    may itself hold spaces and parentheses: read from the last ')')."""
    parent: dict[int, int] = {}
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text(errors="replace")
            parent[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    family, grew = {root}, True
    while grew:
        new = {pid for pid, ppid in parent.items() if ppid in family and pid not in family}
        family |= new
        grew = bool(new)
    return frozenset(family)
