"""Reading `gpu.devices` entries: the one place that knows their keys.

The facts layer writes each GPU as {index, name, memory_total_mib, memory_used_mib, memory_free_mib,
compute_capability "8.0", processes [{pid, name, used_mib}], ...} (NVML, snapshots, collect-env).
Remedies, `check` and `plan` read sizes and capabilities through these helpers only.
"""
from __future__ import annotations

from typing import Any

from vllm_doctor.numbers import as_float, as_int, parse_int

MIB_PER_GIB = 1024


def devices(facts: Any) -> list[dict]:
    devs = facts.get("gpu.devices") if facts is not None else None
    return [d for d in devs if isinstance(d, dict)] if isinstance(devs, list) else []


def total_gib(device: dict) -> float | None:
    mib = as_float(device.get("memory_total_mib"))
    return None if mib is None else mib / MIB_PER_GIB


def used_gib(device: dict) -> float | None:
    mib = as_float(device.get("memory_used_mib"))
    return None if mib is None else mib / MIB_PER_GIB


def free_gib(device: dict) -> float | None:
    mib = as_float(device.get("memory_free_mib"))
    if mib is None:
        total, used = as_float(device.get("memory_total_mib")), as_float(device.get("memory_used_mib"))
        mib = None if total is None or used is None else total - used
    return None if mib is None else mib / MIB_PER_GIB


def compute_capability(device: dict) -> tuple[int, int] | None:
    cc = device.get("compute_capability")
    if isinstance(cc, (list, tuple)) and len(cc) == 2:
        major, minor = as_int(cc[0]), as_int(cc[1])
    else:
        parts = str(cc or "").split(".")
        major, minor = (parse_int(parts[0]), parse_int(parts[1])) if len(parts) == 2 else (None, None)
    return (major, minor) if major is not None and minor is not None and major >= 0 and minor >= 0 else None


def processes(device: dict) -> list[tuple[int, float | None, str]]:
    """(pid, GiB held, name) of the processes NVML saw on the GPU."""
    out = []
    procs = device.get("processes")
    for proc in procs if isinstance(procs, list) else []:
        pid = as_int(proc.get("pid")) if isinstance(proc, dict) else None
        if pid is not None:
            used = as_float(proc.get("used_mib"))
            out.append((pid, None if used is None else used / MIB_PER_GIB, str(proc.get("name") or "")))
    return out
