"""`No CUDA GPUs are available` raised in a Ray actor that is not vLLM's own worker: the node has GPUs, the actor
was given none.

Ray sets CUDA_VISIBLE_DEVICES to "" for an actor that asked for no GPU (python/ray/_private/worker.py: the
accelerator ids assigned, an empty list) unless RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set. A vLLM engine
built inside such an actor (Ray Data's `map_batches` without `num_gpus`, a `@ray.remote` class without it, an RL
framework's rollout actor) runs its rank-0 worker in that process, and torch finds no GPU there while vLLM's own
RayWorkerWrapper actors, which ask for theirs, get them (vllm#14413, vllm#14610, ray#51242). The variable Ray set
is the cause (cuda-visible-devices). In vLLM's own processes the rule's reading stands: a node, container or
driver without a usable GPU.
"""
from __future__ import annotations

import re

from vllm_doctor.findings import RefineContext
from vllm_doctor.refine.ray_placement import ray_executor

# The processes vLLM names itself (multiproc and Ray executors, V1's engine core and API server, data parallel)
VLLM_PROCESSES = re.compile(r"(?:APIServer|ApiServer|\w*EngineCore\w*|VllmWorker\w*|Worker(?:_\w+)?|RayWorker\w*)"
                            r"(?:[-_]\d+)?")


def in_foreign_actor(ctx: RefineContext) -> bool:
    """`No CUDA GPUs are available` printed by a Ray actor vLLM did not start, under Ray."""
    proc = ctx.match.printed.proc or ""
    return (ctx.match.pattern.name == "no-cuda-gpus" and bool(proc) and bool(ray_executor(ctx.facts))
            and not VLLM_PROCESSES.fullmatch(proc))
