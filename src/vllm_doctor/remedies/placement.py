"""Where a fix's change belongs when the failure started on another machine than the one that launched.

The corrected command is the head's (or the leader's): its variables reach a remote process only when
something carries them there.
- A Ray worker inherits the environment of the raylet its node started (`ray start`), plus what vLLM copies
  from the head (vllm/ray/ray_env.py): vLLM's own VLLM_* variables and HF_TOKEN (0.8+, vllm#14099), and
  from early 2026 also NCCL_*, UCX_*, HF_*, LMCACHE_* (vllm#34383). Anything else set on the head's
  `vllm serve` never reaches the worker; set on the node before `ray start`, it does in every release.
  VLLM_HOST_IP and CUDA_VISIBLE_DEVICES are per worker: never copied.
- A pod (LeaderWorkerSet, StatefulSet) has its own env and container options in its spec.
- Any other node (a multi-node `--headless` launch, torchrun) runs its own command.
A container option (`--shm-size`) is the container's on that node in every case.
"""
from __future__ import annotations

from vllm_doctor.command.edits import DockerOption, SetEnv
from vllm_doctor.events.nodes import DRIVER_LABEL

COPIED_BY_EVERY_RELEASE = ("VLLM_", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
COPIED_SINCE_2026 = ("NCCL_", "UCX_", "HF_", "HUGGING_FACE_", "LMCACHE_")
PER_WORKER = ("VLLM_HOST_IP", "VLLM_HOST_PORT", "CUDA_VISIBLE_DEVICES")
# what a rerun should print on every rank, not only where the failure was noticed first
DIAGNOSTIC = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "VLLM_LOGGING_LEVEL")


def _reaches_ray_worker(name: str) -> bool:
    return name.startswith(COPIED_BY_EVERY_RELEASE) and name not in PER_WORKER


def node_instruction(edits, node: str, ray: bool) -> str | None:
    """What to do on `node` (where the failure started) so that the fix's edits reach it; None when the head's
    command carries them all. `ray`: the log is a Ray cluster's (its actors' `ip=` prefixes)."""
    env = [e for e in edits if isinstance(e, SetEnv) and not (ray and _reaches_ray_worker(e.name))]
    docker = [e for e in edits if isinstance(e, DockerOption)]
    if not env and not docker:
        return None
    assign = " ".join(f"{e.name}={e.value}" for e in env)
    parts = []
    if node.startswith("pod/"):
        if env:
            parts.append(f"set {assign} in the env of {node}'s container (its pod template), not only the leader's")
        if docker:
            parts.append(f"give {node}'s pod the same " + ", ".join(e.name for e in docker)
                         + " (for /dev/shm: an emptyDir with medium: Memory mounted there)")
    else:
        where = "every node" if env and all(e.name in DIAGNOSTIC for e in env) else f"node {node}, where it failed"
        if env and ray:
            never = [e.name for e in env if not e.name.startswith(COPIED_SINCE_2026)]
            recent = [e.name for e in env if e.name not in never]
            said = (f"vLLM does not copy {', '.join(never)} from the head to its Ray workers"
                    + (f" ({', '.join(recent)} only since early 2026)" if recent else "") if never else
                    "vLLM copies such variables from the head to its Ray workers only since early 2026")
            parts.append(f"on {where}, set {assign} where Ray starts (`ray stop`, then "
                         f"`{assign} ray start --address=<head-ip>:6379`): {said}")
        elif env:
            parts.append(f"on {where}, set {assign} in that node's own launch")
        if docker:
            parts.append(f"on {where}, give its container the same " + ", ".join(
                f"{e.name} {e.value}" if e.value else e.name for e in docker) + " (its own `docker run`)")
    return "; ".join(parts)


def place_on_node(finding, story, ray: bool) -> None:
    """Say in the root finding's fix where its change belongs when its failure started on a node other than
    the launching one (events/nodes.py's story); the network remedy says it itself (its `worker_node`)."""
    fix = finding.fix
    if (story is None or story.peer or fix is None or "worker_node" in fix.facts_used
            or story.first == DRIVER_LABEL):
        return
    said = node_instruction(fix.edits, story.first, ray)
    if said:
        fix.summary = f"{fix.summary}; {said}"
        fix.facts_used["failed_node"] = story.first
