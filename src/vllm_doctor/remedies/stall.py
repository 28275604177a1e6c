"""Remedy for a start-up that stopped in a waiting state: name the phase reached and rerun with evidence."""
from __future__ import annotations

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.events.phases import PHASE_NAMES, classify_milestones
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.numbers import stamp_seconds
from vllm_doctor.remedies.context import RemedyContext

def phase_reached(milestones) -> str:
    """The start-up phase the milestones place a wait in (events/phases.py, the same reading as the OOM's)."""
    phase = classify_milestones(set(milestones or ()))
    if phase is None:
        return "engine start-up, before any weight was loaded (device and communicator set-up, or a download)"
    return "API server start-up, after the engine was ready" if phase == "serving" else PHASE_NAMES[phase]


def fix_stalled(ctx: RemedyContext) -> Fix:
    wait = max((m for m in ctx.matches if m.promoted), key=lambda m: m.seq, default=ctx.matches[-1])
    phase = phase_reached(wait.milestones)
    edits = [SetEnv("VLLM_LOGGING_LEVEL", "DEBUG")]
    if (ctx.world_size or 1) > 1 or wait.pattern.name in ("shm-broadcast-wait", "placement-group-wait"):
        edits.append(SetEnv("NCCL_DEBUG", "INFO"))
    alternatives = []
    if wait.pattern.name == "placement-group-wait":
        summary = ("Run `ray status`: Ray cannot place the workers yet (a node has not joined, or its GPUs are "
                   "held by another job); then rerun with debug logging if the resources are there")
    elif wait.pattern.name == "shm-broadcast-wait":
        summary = ("A worker stopped answering the engine: rerun with debug logging to see which rank hangs and "
                   "where (a long torch.compile or weight load ends by itself; a hung collective does not)")
        alternatives.append(Alternative("If start-up is only slow (CUDA-graph capture), check without it: "
                                        "--enforce-eager", [SetFlag("--enforce-eager")], "slower decoding"))
    else:
        summary = (f"The engine process never reported ready (last phase seen: {phase}): rerun with debug logging "
                   "to see what it waits on")
    return Fix(summary, edits, alternatives=alternatives, facts_used={"phase": phase}, arithmetic=_waited(ctx, wait))


def _waited(ctx: RemedyContext, last) -> list[str]:
    """What the log shows of the wait: its last line, how often it was printed and over how long (the headers'
    seconds), and that nothing moved start-up on after it."""
    waits = [m for m in ctx.matches if m.pattern.name == last.pattern.name]
    first = waits[0]
    span = ""
    if first.line.stamp and last.line.stamp and first is not last:
        start, end = stamp_seconds(first.line.stamp), stamp_seconds(last.line.stamp)
        span = f" over {end - start:.0f} s" if start is not None and end is not None and end >= start else ""
    times = f"{len(waits)} times{span}, " if len(waits) > 1 else ""
    return [f"the log ends waiting (line {last.line.lineno}, {times}no start-up milestone after it): "
            f"{last.line.message.strip()[:120]}"]
