"""`vllm-doctor facts`: this machine's facts as a table, or as a snapshot (--format json)."""
from __future__ import annotations

import json

from vllm_doctor.facts import Facts


def render_facts_text(facts: Facts, notices: list[str], color: bool) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=None if color else 110,
                      highlight=False)
    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("fact", style="cyan")
    table.add_column("value")
    table.add_column("from", style="dim")
    for key, fact in facts.items():
        if key in ("gpu.devices", "gpu.p2p", "gpu.topology", "env.vars"):
            continue
        table.add_row(key, str(fact.value)[:120], fact.source)
    console.print(table)
    for dev in facts.get("gpu.devices") or []:
        total, used = dev.get("memory_total_mib") or 0, dev.get("memory_used_mib") or 0
        console.print(f"GPU {dev.get('index')}: {dev.get('name')}  {used:,}/{total:,} MiB used  "
                      f"cc {dev.get('compute_capability')}  {dev.get('pci_bus_id') or ''}")
        for proc in dev.get("processes") or []:
            console.print(f"    pid {proc.get('pid')} {proc.get('name') or ''} {proc.get('used_mib')} MiB")
    for name, value in sorted((facts.get("env.vars") or {}).items()):
        console.print(f"env {name}={value}")
    for notice in notices:
        console.print(notice, style="yellow")
    return buffer.getvalue()


def render_snapshot(facts: Facts) -> str:
    from vllm_doctor.facts.snapshot import save_snapshot

    return json.dumps(save_snapshot(facts), indent=2, default=str) + "\n"
