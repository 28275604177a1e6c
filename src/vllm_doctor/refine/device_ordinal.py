"""`invalid device ordinal`: a CUDA_VISIBLE_DEVICES problem (the rule's own), or more ranks than GPUs?"""
from __future__ import annotations

from vllm_doctor.findings import RefineContext


def classify(ctx: RefineContext) -> str | None:
    """`invalid device ordinal`: CUDA_VISIBLE_DEVICES problem, or simply more ranks than GPUs?"""
    match = getattr(ctx, "match", None)
    pat = getattr(match, "pattern", None)
    if str(getattr(pat, "name", pat) or "") != "invalid-device-ordinal":
        return None
    facts = getattr(ctx, "facts", None)
    get = (lambda k: facts.get(k)) if facts is not None else (lambda k: None)
    visible = get("gpu.visible") or {}
    launch = str(get("launch.command") or "")
    env_vars = get("env.vars") or {}
    cvd_set = bool(visible.get("set")) or "CUDA_VISIBLE_DEVICES=" in launch or "CUDA_VISIBLE_DEVICES" in env_vars
    if visible.get("invalid") or visible.get("duplicates"):
        return None  # keep: the variable names GPUs that do not exist
    try:
        tp = int(get("args.tensor_parallel_size") or 1)
        pp = int(get("args.pipeline_parallel_size") or 1)
    except (TypeError, ValueError):
        tp, pp = 1, 1
    physical = get("gpu.physical_count")
    if cvd_set:
        if physical is not None and tp * pp > int(physical):
            return "parallel-exceeds-gpus"  # not enough GPUs even if all were visible
        return None
    if tp * pp > 1:
        return "parallel-exceeds-gpus"
    return None
