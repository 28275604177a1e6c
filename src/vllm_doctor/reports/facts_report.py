"""`vllm-doctor facts`: this machine's facts as a table, or as a snapshot (--format json).

The table is for a person: sizes in GiB (facts keep bytes or MiB, as NVML and the kernel give them),
GPUs one line each. The snapshot keeps the raw values: `--facts` reads them back.
"""
from __future__ import annotations

import json
from typing import Any

from vllm_doctor.facts import Facts

GIB = 1 << 30
MIB = 1 << 20
# fact-key endings whose number is a size, and the bytes one unit of it is
SIZE_SUFFIXES = {"_bytes": 1, "_mib": MIB, "_gib": GIB}
SHOWN_APART = ("gpu.devices", "gpu.p2p", "gpu.topology", "env.vars")   # printed after the table, or not at all
VALUE_WIDTH = 120


def size_text(nbytes: float) -> str:
    """79.6 GiB; a size below 1 GiB in MiB, so a 64 MiB /dev/shm does not read as 0.1 GiB."""
    if nbytes and abs(nbytes) < GIB:
        return f"{nbytes / MIB:.0f} MiB"
    return f"{nbytes / GIB:.1f} GiB"


def _unit(key: str) -> int | None:
    for suffix, unit in SIZE_SUFFIXES.items():
        if key.endswith(suffix):
            return unit
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _visible(value: dict) -> str:
    if not value.get("set"):
        return "all GPUs (CUDA_VISIBLE_DEVICES not set)"
    shown = [str(d.get("physical_index")) for d in value.get("devices") or []]
    text = f"GPU {', '.join(shown)}" if shown else "no GPU"
    extra = [f"{k}: {', '.join(map(str, value[k]))}" for k in ("invalid", "ignored", "duplicates") if value.get(k)]
    return f"{text} (CUDA_VISIBLE_DEVICES={value.get('raw')!r}" + "".join(f"; {e}" for e in extra) + ")"


def fact_text(key: str, value: Any) -> str:
    """One fact's value as a person reads it."""
    unit = _unit(key)
    if unit and _number(value):
        return size_text(value * unit)
    if key == "doctor.machine_facts" and isinstance(value, dict):
        used = "used" if value.get("used") else "not used"
        return f"{used}: {value['reason']}" if value.get("reason") else used
    if key == "gpu.visible" and isinstance(value, dict):
        return _visible(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _mib(value: Any) -> str:
    """GPU memory (NVML's MiB) always in GiB, so one line never mixes units."""
    return f"{value / 1024:.1f} GiB" if _number(value) else "?"


def gpu_lines(dev: dict) -> list[str]:
    """One line per GPU (memory in GiB), then its processes and MIG instances indented."""
    memory = ""
    if _number(dev.get("memory_total_mib")):
        memory = f"{_mib(dev.get('memory_used_mib'))} used of {_mib(dev['memory_total_mib'])}"
        if _number(dev.get("memory_free_mib")):
            memory += f", {_mib(dev['memory_free_mib'])} free"
    parts = [f"GPU {dev.get('index')}: {dev.get('name') or dev.get('error') or '?'}", memory,
             f"cc {dev['compute_capability']}" if dev.get("compute_capability") else "", dev.get("pci_bus_id") or ""]
    lines = ["  ".join(p for p in parts if p)]
    for proc in dev.get("processes") or []:
        used = f" {_mib(proc['used_mib'])}" if _number(proc.get("used_mib")) else ""
        lines.append(f"    pid {proc.get('pid')} {proc.get('name') or '(exited)'}{used}")
    for mig in dev.get("mig_devices") or []:
        total = f" {_mib(mig['memory_total_mib'])}" if _number(mig.get("memory_total_mib")) else ""
        lines.append(f"    MIG {mig.get('name') or mig.get('uuid') or mig.get('index')}{total}")
    return lines


def render_facts_text(facts: Facts, notices: list[str], color: bool, width: int = 100) -> str:
    """The facts as a table at `width` columns (the terminal's: long values wrap in their column), then the GPUs,
    the variables and the notices, wrapped."""
    import io
    import textwrap

    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width, highlight=False)
    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("fact", style="cyan")
    table.add_column("value")
    table.add_column("from", style="dim")
    for key, fact in facts.items():
        if key in SHOWN_APART or (isinstance(fact.value, str) and fact.value in notices):
            continue    # a fact that is also a notice (gpu.nvml_error) is said once, below
        table.add_row(key, fact_text(key, fact.value)[:VALUE_WIDTH], fact.source)
    console.print(table)
    for dev in facts.get("gpu.devices") or []:
        for line in gpu_lines(dev):
            console.print(line, soft_wrap=True)
    for name, value in sorted((facts.get("env.vars") or {}).items()):
        console.print(f"env {name}={value}")
    for notice in notices:
        for part in textwrap.wrap(notice, width=width, subsequent_indent="  ", break_on_hyphens=False,
                                  break_long_words=False) or [notice]:
            console.print(part, style="yellow", soft_wrap=True)
    return buffer.getvalue()


def render_snapshot(facts: Facts) -> str:
    from vllm_doctor.facts.snapshot import save_snapshot

    return json.dumps(save_snapshot(facts), indent=2, default=str) + "\n"
