"""gather_facts: fill a Facts from a snapshot, the model's config and (live) this machine.

Sources are ranked by Facts itself (user > log > snapshot > config.json > nvml > env), so facts the log
already gave are never overwritten. One case is handled here: a log that asks for several GPUs read on
a machine with none was written elsewhere, so this machine's GPU facts are kept out (and the clash is
recorded in facts.conflicts) instead of making remedies reason about the wrong machine.
"""
from __future__ import annotations

from typing import Any, Mapping

from . import Fact, Facts
from .env import collect_env_facts
from .model import load_model_facts
from .keys import DOCTOR_MACHINE_FACTS
from .nvml import collect_gpu_facts
from .origin import written_here
from .snapshot import load_snapshot

CLAIM_SOURCES = ("user", "log", "snapshot")


def _requested_gpus(facts: Facts) -> tuple[int, str] | None:
    """GPUs the log/user/snapshot asks for (tp × pp, or gpu.count), with the source that said so."""
    keys = ("args.tensor_parallel_size", "args.pipeline_parallel_size")
    claimed = [k for k in keys + ("gpu.count",) if facts.source(k) in CLAIM_SOURCES]
    if not claimed:
        return None
    if "gpu.count" in claimed:
        return int(facts.get("gpu.count")), facts.source("gpu.count")
    world = 1
    for key in keys:
        try:
            world *= int(facts.get(key, 1))
        except (TypeError, ValueError):
            pass
    return world, facts.source(claimed[0])


def _merge_gpu_facts(facts: Facts, live: Facts, notices: list[str]) -> None:
    live_count = 0 if "gpu.nvml_error" in live else int(live.get("gpu.count", 0))
    requested = _requested_gpus(facts)
    if requested and requested[0] > 1 and live_count == 0:
        count, source = requested
        facts.conflicts.append(("gpu.count", Fact(count, source), Fact(live_count, "nvml")))
        notices.append(f"the {source} asks for {count} GPUs but this machine has none: "
                       "its GPU facts were left out (the log was written elsewhere)")
        return
    if "gpu.nvml_error" in live:
        notices.append(live.get("gpu.nvml_error"))
    facts.merge(live)


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
    collect_gpu_facts(gpu, nvml, environ=environ)
    if live is None:
        origin = written_here(facts, gpu)
        facts.set(DOCTOR_MACHINE_FACTS, {"used": origin.here, "reason": origin.reason}, "env")
        if not origin.here:
            return notices
    else:
        facts.set(DOCTOR_MACHINE_FACTS, {"used": True, "reason": "output produced here, or --live"}, "user")
    collect_env_facts(facts, environ)
    _merge_gpu_facts(facts, gpu, notices)
    return notices
