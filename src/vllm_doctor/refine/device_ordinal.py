"""`invalid device ordinal`: a CUDA_VISIBLE_DEVICES problem (the rule's own), more ranks than GPUs, or a device
some other code chose inside a process Ray placed?

The rule's cause is the user's variable, so the rule holds only where the log, the command or the environment
shows it (docs/precedences.md, `ordinal-needs-the-variable`). Ray gives each actor its own CUDA_VISIBLE_DEVICES
(one GPU per actor, renumbered from 0); a device index taken from the global rank inside such a process (LMCache's
connector used `global_rank` as the device id, LMCache#814/#971) fails the same way while the user set nothing.
"""
from __future__ import annotations

from vllm_doctor.findings import RefineContext
from vllm_doctor.numbers import as_int

# A frame of these packages chose the device: a KV connector, not vLLM's worker set-up
CONNECTOR_PATHS = ("/lmcache/", "/kv_transfer/", "/kv_connector/")


def classify(ctx: RefineContext) -> str | None:
    """`invalid device ordinal`: CUDA_VISIBLE_DEVICES problem, or simply more ranks than GPUs?"""
    match = ctx.match
    if match.pattern.name != "invalid-device-ordinal":
        return None
    facts = ctx.facts
    visible = facts.get("gpu.visible")
    visible = visible if isinstance(visible, dict) else {}      # a snapshot's junk value says nothing
    if visible.get("invalid") or visible.get("duplicates"):
        return None  # keep: the variable names GPUs that do not exist
    cvd_set = (bool(visible.get("set")) or "CUDA_VISIBLE_DEVICES=" in str(facts.get("launch.command") or "")
               or "CUDA_VISIBLE_DEVICES" in _mapping(facts.get("env.vars")) or facts.get("log.cvd_set_in_code") is not None)
    tp, pp = (as_int(facts.get(key)) or 1 for key in ("args.tensor_parallel_size", "args.pipeline_parallel_size"))
    ranks = tp * pp
    physical = as_int(facts.get("gpu.physical_count"))
    if cvd_set:
        if physical is not None and ranks > physical:
            return "parallel-exceeds-gpus"  # not enough GPUs even if all were visible
        return None
    where, by_ray = _placed_by(ctx)
    if where:
        match.unsupported = (
            f"The device was asked for {where}, and nothing in the log sets CUDA_VISIBLE_DEVICES"
            + (": Ray gives each actor its own CUDA_VISIBLE_DEVICES, numbered from 0, so the index came from code "
               "that counted GPUs another way (a global rank used as the device index), not from a variable the "
               "user set." if by_ray else
               ": the index came from that code (a global rank used as the device index), not from a variable "
               "the user set.") + " The frames name that code.")
        return "unrecognized"
    if ranks > 1:
        return "parallel-exceeds-gpus"
    match.unsupported = ("nothing in the log or the command shows CUDA_VISIBLE_DEVICES: check what the process "
                         "was given (`echo $CUDA_VISIBLE_DEVICES` where it starts) and which `cuda:N` the code asks for")
    return None


def _placed_by(ctx: RefineContext) -> tuple[str, bool]:
    """Where the log shows that a KV connector chose the device or Ray placed the failing process: how to say
    it, and whether Ray was there."""
    files = [f.file for f in ctx.traceback.frames] if ctx.traceback is not None else []
    proc = ctx.match.line.proc or ""
    by_ray = (proc.startswith("Ray") or proc.endswith("Actor") or any("/ray/" in f for f in files)
              or str(ctx.facts.get("args.distributed_executor_backend") or "") == "ray")
    if any(part in f for f in files for part in CONNECTOR_PATHS):
        return "in a KV connector's code" + (f" inside a Ray actor ({proc})" if by_ray and proc else ""), by_ray
    if by_ray:
        return f"in a process Ray placed ({proc or 'a Ray task'})", True
    return "", False


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}
