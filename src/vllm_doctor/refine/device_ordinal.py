"""`invalid device ordinal`: a CUDA_VISIBLE_DEVICES problem (the rule's own), or more ranks than GPUs?"""
from __future__ import annotations

from vllm_doctor.findings import RefineContext
from vllm_doctor.numbers import as_int


def classify(ctx: RefineContext) -> str | None:
    """`invalid device ordinal`: CUDA_VISIBLE_DEVICES problem, or simply more ranks than GPUs?"""
    if ctx.match.pattern.name != "invalid-device-ordinal":
        return None
    facts = ctx.facts
    visible = facts.get("gpu.visible")
    visible = visible if isinstance(visible, dict) else {}      # a snapshot's junk value says nothing
    if visible.get("invalid") or visible.get("duplicates"):
        return None  # keep: the variable names GPUs that do not exist
    cvd_set = (bool(visible.get("set")) or "CUDA_VISIBLE_DEVICES=" in str(facts.get("launch.command") or "")
               or "CUDA_VISIBLE_DEVICES" in _mapping(facts.get("env.vars")))
    tp, pp = (as_int(facts.get(key)) or 1 for key in ("args.tensor_parallel_size", "args.pipeline_parallel_size"))
    ranks = tp * pp
    physical = as_int(facts.get("gpu.physical_count"))
    if cvd_set:
        if physical is not None and ranks > physical:
            return "parallel-exceeds-gpus"  # not enough GPUs even if all were visible
        return None
    return "parallel-exceeds-gpus" if ranks > 1 else None


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}
