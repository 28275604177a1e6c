"""Was this saved log written on this machine? Only then do this machine's GPUs and environment belong in
its diagnosis.

Someone else's log read on a laptop must not pick up the laptop's NVML error, container flag, /dev/shm size
or installed transformers: those would change the fix (and on a GPU box even the rule). The test, in order,
stops at the first sign found:
  1. a host name the log prints (NCCL's `host:pid:tid [rank] NCCL INFO` prefix) is this machine's name;
  2. a node IP the log prints (Ray's `ip=` prefix, NCCL's bootstrap interface) is one of this machine's
     addresses (loopback never counts: every machine has it);
  3. the model argument is an absolute path that exists here (a hub id proves nothing);
  4. the GPUs the log lists (a pasted `vllm collect-env`) have the same model names and count as NVML's here.
No sign: the log is treated as written elsewhere. `--live` and `--no-live` override the test; the pipe, `run`
and `--follow` read output produced here and always use this machine's facts, and so do `check`, `plan` and
`facts`, which have no log: this machine is their target (`used_reason` says which case applies).
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple

from . import Facts

LOOPBACK = ("127.", "0.0.0.0", "::1", "localhost")     # addresses every machine has: they name no machine



class Origin(NamedTuple):     # a NamedTuple: a frozen dataclass costs ~1 ms to create at import
    here: bool
    reason: str


def local_addresses() -> set[str]:
    """This machine's IPv4 addresses, without DNS (a resolver could hang): the kernel's routing table."""
    addresses: set[str] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii", errors="replace") as f:
            previous = ""
            for line in f:
                if "/32 host LOCAL" in line:
                    parts = previous.split()
                    if parts:
                        addresses.add(parts[-1])
                previous = line
    except OSError:
        pass
    return {a for a in addresses if not a.startswith(LOOPBACK)}


def _gpu_names(devices) -> list[str]:
    names = []
    for device in devices or []:
        if isinstance(device, dict) and device.get("name"):
            names.append(" ".join(str(device["name"]).replace("NVIDIA ", "").split()).lower())
    return sorted(names)


def written_here(log: Facts, machine_gpus: Facts | Callable[[], Facts], hostname: str | None = None,
                 addresses: set[str] | None = None) -> Origin:
    """The test of the module docstring. `log` holds the facts read from the log (source "log"),
    `machine_gpus` what NVML says of this machine, or a function that asks it (called only for test 4)."""
    names = log.get("log.hostnames") or []
    if names:
        host = (hostname if hostname is not None else _hostname()).lower()
        for name in names:
            if host and str(name).lower() in (host, host.split(".")[0]):
                return Origin(True, f"the log names this host ({name})")
    ips = {ip for ip in (log.get("log.node_ips") or []) if not str(ip).startswith(LOOPBACK)}
    if ips:
        mine = addresses if addresses is not None else local_addresses()
        shared = sorted(ips & mine)
        if shared:
            return Origin(True, f"the log names this machine's address {shared[0]}")
    model = log.get("args.model")
    if log.source("args.model") == "log" and isinstance(model, str) and model.startswith("/") \
            and model.rstrip("/").count("/") >= 2 and os.path.exists(model):
        return Origin(True, f"the model path {model} exists here")
    theirs = _gpu_names(log.get("gpu.devices")) if log.source("gpu.devices") == "log" else []
    if theirs:
        machine = machine_gpus() if callable(machine_gpus) else machine_gpus
        if theirs == _gpu_names(machine.get("gpu.devices")):
            return Origin(True, f"the log lists this machine's GPUs ({len(theirs)} x {theirs[0]})")
    return Origin(False, "nothing in the log says it was written on this machine")


def this_node(facts: Facts, nodes: list[str], driver_label: str, hostname: str | None = None,
              addresses: set[str] | None = None) -> str | None:
    """Which node of a log of several this machine is, when its facts are in the diagnosis
    (doctor.machine_facts used): the node named by this host's name or one of its addresses; else the driver's
    node, whose output a saved Ray log is (its lines carry no `ip=`). None: this machine's facts are not used."""
    if not (facts.get("doctor.machine_facts") or {}).get("used"):
        return None
    host = (hostname if hostname is not None else _hostname()).lower()
    mine = addresses if addresses is not None else local_addresses()
    for node in nodes:
        name = str(node).lower()
        if name in mine or (host and name in (host, host.split(".")[0])):
            return node
    return driver_label if driver_label in nodes else None


def _hostname() -> str:
    import socket            # ~3 ms, and only a log that names hosts needs it

    return socket.gethostname()


def used_reason(facts: Facts) -> str:
    """Why this machine's facts belong, when the caller asked for them: a server whose output is read as it
    runs (doctor.live), a command with no log at all (check, plan, facts: nothing was written elsewhere), or a
    saved log the user vouched for with --live."""
    if facts.get("doctor.live"):
        return "the server runs on this machine (pipe, run or --follow)"
    if not any(fact.source == "log" for _, fact in facts.items()):
        return "the command runs on this machine"
    return "--live"
