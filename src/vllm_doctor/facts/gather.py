"""gather_facts: fill a Facts from a snapshot, the model's config and (live) this machine.

Sources are ranked by Facts itself (user > log > snapshot > config.json > nvml > env), so facts the log
already gave are never overwritten. Whether this machine's facts belong at all is decided once, as the fact
doctor.machine_facts (facts/origin.py): for a saved log by where it was written, otherwise by the caller.
A machine without NVML (or whose NVML lists no GPU) has an unknown GPU count, not zero GPUs: it never
contradicts the GPUs a log or command asks for.

A source that fails (a config.json of the wrong shape, an NVML that raises, an environment that cannot be
read) costs its own facts only, with a notice saying what was skipped: never the diagnosis.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from . import Facts
from .keys import DOCTOR_MACHINE_FACTS


def gather_facts(facts: Facts, *, model: str | None = None, online: bool = False, live: bool | None = True,
                 snapshot: str | None = None, environ: Mapping[str, str] | None = None,
                 nvml: Any = None, table: bool = False) -> list[str]:
    """Collect every fact source; returns one-line notices. SnapshotError propagates (a usage error).

    `live`: True uses this machine's GPUs and environment, False never; None (a saved log, neither --live
    nor --no-live) uses them only when facts.origin finds the log was written here. The decision is kept
    as the fact doctor.machine_facts, so the report can say which. NVML is probed only when its answer is
    used: it costs ~30 ms and a saved log from elsewhere never needs it. `table`: a popular model's shipped
    architecture stands in for a config.json that is nowhere here (check and plan: a command, no log)."""
    notices: list[str] = []
    if snapshot:
        from .snapshot import SnapshotError, load_snapshot

        try:
            notices += load_snapshot(snapshot, facts) or []
        except SnapshotError:
            raise
        except Exception as exc:  # noqa: BLE001 - a snapshot of a shape no check foresaw
            notices.append(_skipped(f"facts snapshot {snapshot}", exc))
    model = model or facts.get("args.model")   # logfacts stores vLLM's model_tag as args.model
    if model:
        from .model import load_model_facts

        try:
            notice = load_model_facts(str(model), facts, online=online, table=table)
        except Exception as exc:  # noqa: BLE001 - a config.json of a shape normalise did not foresee
            notice = _skipped(f"model facts of {str(model)[:200]!r}", exc)
        if notice:
            notices.append(notice)
    if live is False:
        facts.set(DOCTOR_MACHINE_FACTS, {"used": False, "reason": "--no-live"}, "user")
        return notices
    probe = _gpu_probe(nvml, environ)
    if live is None:
        from .origin import written_here

        try:
            origin = written_here(facts, lambda: probe()[0])
            here, reason = origin.here, origin.reason
        except Exception as exc:  # noqa: BLE001 - then this machine's facts are not used
            here, reason = False, _skipped("the check whether the log was written here", exc)
            notices.append(reason)
        facts.set(DOCTOR_MACHINE_FACTS, {"used": here, "reason": reason}, "env")
        if not here:
            return notices
    else:
        from .origin import used_reason

        facts.set(DOCTOR_MACHINE_FACTS, {"used": True, "reason": used_reason(facts)}, "user")
    from .env import collect_env_facts

    try:
        collect_env_facts(facts, environ)
    except Exception as exc:  # noqa: BLE001
        notices.append(_skipped("environment facts", exc))
    try:
        gpu, no_gpu = probe()
    except Exception as exc:  # noqa: BLE001 - an NVML binding that raises what it should not
        notices.append(_skipped("GPU facts (NVML)", exc))
        return notices
    facts.merge(gpu)
    notices.extend(n for n in (gpu.get("gpu.nvml_error"), no_gpu) if n)
    return notices


def _skipped(what: str, exc: BaseException) -> str:
    """The notice for a fact source that failed: what was skipped and why, on one line."""
    why = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{what} skipped ({type(exc).__name__}{': ' + why if why else ''})"


def _gpu_probe(nvml: Any, environ: Mapping[str, str] | None) -> Callable[[], tuple[Facts, str | None]]:
    """This machine's NVML facts and no-GPU notice, probed on the first call and kept."""
    from functools import cache

    @cache
    def probe() -> tuple[Facts, str | None]:
        from .nvml import collect_gpu_facts

        gpu = Facts()
        return gpu, collect_gpu_facts(gpu, nvml, environ=environ)

    return probe
