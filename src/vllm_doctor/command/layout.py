"""Where things are in a token list: env prefix, launcher, docker options, image, vLLM arguments."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from . import flags as F
from .lexer import Token

ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")   # `NAME=value` before the program
_NUM = re.compile(r"-\d+(\.\d+)?$|-\.\d+$")
PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")            # python, python3, python3.11
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
_WRAPPERS = {"nohup", "time", "exec", "nice", "stdbuf", "numactl", "taskset", "setsid", "unbuffer"}

# docker/podman `run` options that take a value; the rest are switches (-d, -it, --rm, --privileged ...)
DOCKER_VALUE = {
    "-e", "--env", "--env-file", "-p", "--publish", "-v", "--volume", "--mount", "--name", "--gpus", "--ipc",
    "--shm-size", "--runtime", "--entrypoint", "-w", "--workdir", "--network", "--net", "-u", "--user",
    "--device", "--ulimit", "--cpus", "-m", "--memory", "--memory-swap", "--platform", "--restart", "-l",
    "--label", "--add-host", "-h", "--hostname", "--cap-add", "--cap-drop", "--security-opt", "--pull",
    "--log-driver", "--log-opt", "--pid", "--uts", "--cgroupns", "--group-add", "--tmpfs", "--cpuset-cpus",
    "--cpuset-mems", "--cpu-shares", "-c", "--health-cmd", "--health-interval", "--health-retries",
    "--health-timeout", "--stop-signal", "--stop-timeout", "--network-alias", "--dns", "--mac-address",
    "--ip", "--label-file", "-a", "--attach", "--cidfile", "--oom-score-adj", "--storage-opt", "--sysctl",
    "--volumes-from", "--userns", "--isolation", "--annotation", "--pod", "--secret", "--hooks-dir",
    "--device-cgroup-rule", "--link", "--blkio-weight", "--kernel-memory", "--memory-reservation",
}
DOCKER_LONG = {"-e": "--env", "-p": "--publish", "-v": "--volume", "-w": "--workdir", "-u": "--user",
               "-m": "--memory", "-l": "--label", "-h": "--hostname", "-c": "--cpu-shares", "-a": "--attach",
               "--net": "--network"}
DOCKER_REPEATABLE = {"--env", "--publish", "--volume", "--mount", "--device", "--add-host", "--cap-add",
                     "--cap-drop", "--security-opt", "--ulimit", "--label", "--env-file", "--tmpfs",
                     "--group-add", "--dns", "--sysctl", "--volumes-from", "--log-opt"}


def docker_canonical(name: str) -> str:
    return DOCKER_LONG.get(name, name)


@dataclass
class Item:
    """One argument: a flag with its value tokens, or a positional (flag None)."""
    flag: str | None          # as written, without '=value'
    ftok: int                 # token index of the flag (or the positional)
    vtoks: list[int] = field(default_factory=list)
    inline: bool = False      # --flag=value in one token
    value: str | None = None  # None: a switch given without value


@dataclass
class Layout:
    shape: str                # serve | module | docker | compose | unknown
    env: list[int] = field(default_factory=list)       # NAME=V prefix tokens
    env_insert: int = 0
    docker: list[Item] | None = None
    image: int | None = None
    args_start: int = 0
    items: list[Item] = field(default_factory=list)
    launcher: str = ""        # serve | module | image | shell (unknown shape run by a shell or script)


def is_option(value: str) -> bool:
    return value.startswith("-") and len(value) > 1 and not _NUM.match(value)


def _base(v: str) -> str:
    return os.path.basename(v)


def _launcher_at(toks: list[Token], i: int) -> tuple[str, int] | None:
    """('serve'|'module', index of first serve argument) if a vLLM launcher starts at i."""
    v = [t.value for t in toks]
    if i + 1 < len(v) and _base(v[i]) == "vllm" and v[i + 1] == "serve":
        return "serve", i + 2
    if i < len(v) and PYTHON.match(_base(v[i])):
        j = i + 1
        while j < len(v) and v[j] != "-m" and v[j].startswith("-"):
            j += 1
        if j + 1 < len(v) and v[j] == "-m" and v[j + 1].startswith("vllm."):
            if v[j + 1] == "vllm.entrypoints.cli.main" and j + 2 < len(v) and v[j + 2] == "serve":
                return "serve", j + 3
            return "module", j + 2
    return None


def _prefix(toks: list[Token]) -> tuple[list[int], int, int]:
    """Env assignments and wrappers in front of the program: (env indices, insert index, program index)."""
    env, i, insert = [], 0, 0
    while i < len(toks):
        v = toks[i].value
        if ENV_ASSIGNMENT.match(v) and not v.startswith("-"):
            env.append(i)
            insert = i + 1
        elif v in ("env", "sudo") or v in _WRAPPERS:
            i += 1
            while i < len(toks) and toks[i].value.startswith("-"):
                i += 2 if toks[i].value in ("-u", "-g", "-n", "-C") else 1
            insert = max(insert, i) if v in ("env", "sudo") else insert
            continue
        else:
            break
        i += 1
    return env, insert, i


def parse_items(toks: list[Token], start: int, end: int | None = None) -> list[Item]:
    """Split vLLM arguments into flags with their values, the way argparse consumes them."""
    end = len(toks) if end is None else end
    items: list[Item] = []
    i = start
    while i < end:
        v = toks[i].value
        if v == "--":
            break
        if not is_option(v):
            items.append(Item(None, i, value=v))
            i += 1
            continue
        name, eq, inline = v.partition("=")
        if eq:
            items.append(Item(name, i, inline=True, value=inline))
            i += 1
            continue
        if re.fullmatch(r"-O\d+", name):
            items.append(Item("-O", i, inline=True, value=name[2:]))
            i += 1
            continue
        item = Item(name, i)
        i += 1
        if F.takes_value(name):
            while i < end and not is_option(toks[i].value):
                item.vtoks.append(i)
                i += 1
                if not F.is_multi_value(name):
                    break
            if item.vtoks:
                item.value = " ".join(toks[k].value for k in item.vtoks)
        items.append(item)
    return items


def _docker_items(toks: list[Token], start: int) -> tuple[list[Item], int | None]:
    items, i = [], start
    while i < len(toks):
        v = toks[i].value
        if not v.startswith("-") or v == "-":
            return items, i
        name, eq, inline = v.partition("=")
        if eq and name.startswith("--"):
            items.append(Item(name, i, inline=True, value=inline))
        elif name in DOCKER_VALUE and i + 1 < len(toks):
            items.append(Item(name, i, vtoks=[i + 1], value=toks[i + 1].value))
            i += 1
        elif len(v) > 2 and not v.startswith("--") and v[:2] in DOCKER_VALUE:   # -p8000:8000
            items.append(Item(v[:2], i, inline=True, value=v[2:]))
        else:
            items.append(Item(v, i))
        i += 1
    return items, None


def analyse(toks: list[Token], compose: bool = False) -> Layout:
    """Find the launch shape and the argument positions in a token list."""
    if compose:   # a compose command list: the image's entrypoint already runs the server
        found = _launcher_at(toks, 0)
        start = found[1] if found else 0
        return Layout("compose", args_start=start, items=parse_items(toks, start),
                      launcher=found[0] if found else "image")
    env, insert, i = _prefix(toks)
    lay = Layout("unknown", env=env, env_insert=insert)
    v = [t.value for t in toks]
    if i < len(v) and _base(v[i]) in ("docker", "podman", "nerdctl") :
        j = i + 1
        if j < len(v) and v[j] == "container":
            j += 1
        if j < len(v) and v[j] == "run":
            lay.shape = "docker"
            lay.docker, lay.image = _docker_items(toks, j + 1)
            if lay.image is None:
                lay.image = len(toks)
                lay.args_start = len(toks)
                return lay
            k = lay.image + 1
            found = _launcher_at(toks, k)
            entry = next((it.value for it in lay.docker if it.flag == "--entrypoint"), None)
            if found:
                k, lay.launcher = found[1], found[0]
            elif entry and _base(entry) == "vllm" and k < len(v) and v[k] == "serve":
                k, lay.launcher = k + 1, "serve"
            else:
                lay.launcher = "image"
            lay.args_start = k
            lay.items = parse_items(toks, k)
            return lay
    for j in range(i, len(toks)):   # vllm serve / python -m vllm... possibly behind `uv run`, `ray job submit --`
        found = _launcher_at(toks, j)
        if found:
            lay.shape, lay.args_start = found
            lay.launcher = found[0]
            lay.items = parse_items(toks, found[1])
            return lay
    if i < len(v) and (_base(v[i]) in _SHELLS or v[i].endswith(".sh")):
        lay.launcher = "shell"      # `bash start.sh`, `sh -c "..."`, `./serve.sh`: vLLM runs somewhere inside
    start = next((j for j in range(i, len(toks)) if is_option(v[j])), len(toks))
    lay.args_start = start
    lay.items = parse_items(toks, start)
    return lay
