"""Reading `gpu.devices` entries: the one place that knows their keys.

The facts layer writes each GPU as {index, name, memory_total_mib, memory_used_mib, memory_free_mib,
compute_capability "8.0", processes [{pid, name, used_mib}], ...} (NVML, snapshots, collect-env).
Remedies, `check` and `plan` read sizes and capabilities through these helpers only.
"""
from __future__ import annotations

from typing import Any

from vllm_doctor.numbers import as_float

MIB_PER_GIB = 1024


def devices(facts: Any) -> list[dict]:
    devs = facts.get("gpu.devices") if facts is not None else None
    return [d for d in devs if isinstance(d, dict)] if isinstance(devs, list) else []


def total_gib(device: dict) -> float | None:
    mib = as_float(device.get("memory_total_mib"))
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
        return int(cc[0]), int(cc[1])
    parts = str(cc or "").split(".")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return None


def processes(device: dict) -> list[tuple[int, float | None, str]]:
    """(pid, GiB held, name) of the processes NVML saw on the GPU."""
    out = []
    for proc in device.get("processes") or []:
        if isinstance(proc, dict) and proc.get("pid") is not None:
            used = as_float(proc.get("used_mib"))
            out.append((int(proc["pid"]), None if used is None else used / MIB_PER_GIB, proc.get("name") or ""))
    return out
