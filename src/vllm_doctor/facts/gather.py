"""gather_facts: fill a Facts from a snapshot, the model's config and (live) this machine.

Sources are ranked by Facts itself (user > log > snapshot > config.json > nvml > env), so facts the log
already gave are never overwritten. Whether this machine's facts belong at all is decided once, as the fact
doctor.machine_facts (facts/origin.py): for a saved log by where it was written, otherwise by the caller.
A machine without NVML (or whose NVML lists no GPU) has an unknown GPU count, not zero GPUs: it never
contradicts the GPUs a log or command asks for.
"""
from __future__ import annotations

from typing import Any, Mapping

from . import Facts
from .env import collect_env_facts
from .model import load_model_facts
from .keys import DOCTOR_MACHINE_FACTS
from .nvml import collect_gpu_facts
from .origin import used_reason, written_here
from .snapshot import load_snapshot

def gather_facts(facts: Facts, *, model: str | None = None, online: bool = False, live: bool | None = True,
                 snapshot: str | None = None, environ: Mapping[str, str] | None = None,
                 nvml: Any = None) -> list[str]:
    """Collect every fact source; returns one-line notices. SnapshotError propagates (a usage error).

    `live`: True uses this machine's GPUs and environment, False never; None (a saved log, neither --live
    nor --no-live) uses them only when facts.origin finds the log was written here. The decision is kept
    as the fact doctor.machine_facts, so the report can say which."""
    notices: list[str] = []
    if snapshot:
        load_snapshot(snapshot, facts)
    model = model or facts.get("args.model")   # logfacts stores vLLM's model_tag as args.model
    if model:
        notice = load_model_facts(str(model), facts, online=online)
        if notice:
            notices.append(notice)
    if live is False:
        facts.set(DOCTOR_MACHINE_FACTS, {"used": False, "reason": "--no-live"}, "user")
        return notices
    gpu = Facts()
    no_gpu = collect_gpu_facts(gpu, nvml, environ=environ)
    if live is None:
        origin = written_here(facts, gpu)
        facts.set(DOCTOR_MACHINE_FACTS, {"used": origin.here, "reason": origin.reason}, "env")
        if not origin.here:
            return notices
    else:
        facts.set(DOCTOR_MACHINE_FACTS, {"used": True, "reason": used_reason(facts)}, "user")
    collect_env_facts(facts, environ)
    facts.merge(gpu)
    notices.extend(n for n in (gpu.get("gpu.nvml_error"), no_gpu) if n)
    return notices
