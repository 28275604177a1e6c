"""`health`'s memory side: each GPU of a running server's group against what vLLM's memory model lets the
server hold there. From 0.9.1 a start needs `total x --gpu-memory-utilization` free and then fills exactly that
budget (weights, activation peak, non-torch memory and, from 0.20.0, CUDA graphs; the KV cache takes the
rest); outside it are only the CUDA context made before the budget was measured and, before 0.20.0, the CUDA
graphs captured after the KV cache. V0 fills the same budget without looking at others' memory. So a GPU of
the group holding clearly more than that is shared with something the server does not count: another server,
a leftover process of an earlier run. That memory is the next start's: vLLM 0.9.1+ then refuses to start
(free memory below the budget). 0.7-0.9.0 counted others' memory inside the budget (its KV cache shrank
instead), so the excess shows only from 0.9.1 and before 0.7. A size given with --kv-cache-memory-bytes replaces
the budget: then the memory model's own share is the prediction (the model's weights per rank from its config,
plus the KV cache /metrics says the engine holds, in bytes per token from the same config), judged only where
the config is here. That share is also said beside the budget, so the user sees what the budget holds."""
from __future__ import annotations

from vllm_doctor.checks.coverage import Prediction
from vllm_doctor.checks.health_gpus import group_of, layout_size
from vllm_doctor.command.versions import at_least
from vllm_doctor.facts import Facts, gpus
from vllm_doctor.facts.server_metrics import Figures
from vllm_doctor.vllm_math.memory import GIB, default_utilization

CONTEXT_GIB = 1.0       # the CUDA context and allocator slack a rank holds outside its budget
GRAPHS_GIB = 5.0        # CUDA graphs outside the budget (before 0.20.0): the largest capture seen took 4.7 GiB
MIN_SHARE = 0.02        # an excess below this part of the GPU is rounding, whatever the allowances
# outside weights and KV cache when no budget bounds the rank (--kv-cache-memory-bytes): the activation peak the
# allocator keeps, NCCL and custom all-reduce buffers (the memory model's non-torch share with TP, 1.9 GiB)
UNBUDGETED_GIB = 3.0


def _utilization(figures: Figures, command, version: str | None) -> tuple[float, str]:
    """The server's budget fraction and where it was read: its own cache info, else the launch, else the default."""
    if figures.utilization is not None:
        return figures.utilization, "the server's cache info"
    value = command.get("--gpu-memory-utilization") if command is not None else None
    try:
        if value is not None and 0 < float(value) <= 1:
            return float(value), "the launch"
    except (TypeError, ValueError):
        pass
    return default_utilization(version), f"vLLM {version or 'latest'}'s default"


def _allowance(command, version: str | None, environ: dict[str, str]) -> float:
    eager = command is not None and command.get("--enforce-eager") is not None
    graphs_inside = version is not None and at_least(version, "0.20.0") and \
        environ.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0"
    return CONTEXT_GIB + (0.0 if eager or graphs_inside else GRAPHS_GIB)


def _counted_others(version: str | None) -> bool:
    """0.7-0.9.0 sized the KV cache from the memory free after others took theirs: no excess can show."""
    return version is not None and at_least(version, "0.7.0") and not at_least(version, "0.9.1")


def model_share(facts: Facts, figures: Figures, tp: int, pp: int) -> tuple[float, float] | None:
    """(weights, KV cache) of one rank in GiB by the memory model: the config's weights over tp x pp, and the
    engine's KV tokens (/metrics' cache info) at the config's bytes per token on one GPU. None without the
    config or the cache's size, and for hybrid models (sliding-window or linear layers: their per-token cost
    is not one number)."""
    from vllm_doctor.vllm_math.sizing import Sizing

    sizing = Sizing.from_facts(facts)
    shape = sizing.shape
    if figures.kv_tokens is None or shape.sliding_layers or shape.linear_layers or shape.sliding_window:
        return None
    weights, per_token = sizing.weights(), sizing.kv_per_token(tp, pp)
    if not weights.bytes or per_token is None:
        return None
    return weights.bytes / GIB / (tp * pp), figures.kv_tokens * per_token.bytes / GIB


def rank_share(command, facts: Facts, figures: Figures) -> tuple[float, float] | None:
    """model_share for the launch's layout (its -tp and -pp); None without a launch."""
    if command is None:
        return None
    return model_share(facts, figures, layout_size(command, "--tensor-parallel-size"),
                       layout_size(command, "--pipeline-parallel-size"))


def over_budget(command, facts: Facts, environ: dict[str, str] | None, figures: Figures, version: str | None,
                server_pids: frozenset[int] = frozenset()) -> list[Prediction]:
    """The GPUs of the group holding more than the server's budget and its allowances, as the line the rule
    reads; the processes NVML lists there that are not the server's named (only when NVML lists one of the
    server's own, so both sides number processes alike: a container's PIDs are not the host's)."""
    found = group_of(command, facts, environ or {})
    if found is None or _counted_others(version):
        return []
    group, layout = found
    env = {**(environ or {}), **(command.env if command is not None else {})}
    u, said = _utilization(figures, command, version)
    allowance = _allowance(command, version, env)
    share = rank_share(command, facts, figures)
    sized = figures.kv_memory_bytes is not None          # a KV size instead of the budget: the model's share bounds it
    if sized:
        if share is None:
            return []
        allowance += UNBUDGETED_GIB
    over = []
    for d in group:
        total, used = gpus.total_gib(d), gpus.used_gib(d)
        if total is None or used is None:
            continue
        budget = sum(share) if sized and share else total * u
        excess = used - budget
        if excess > allowance and excess > MIN_SHARE * total:
            over.append((d, total, used, excess, budget))
    if not over:
        return []
    d, total, used, excess, budget = max(over, key=lambda o: o[3])
    how = (f"weights {share[0]:.1f} + KV cache {share[1]:.1f} GiB, --kv-cache-memory-bytes" if sized and share
           else f"{u:g} x {total:.1f} GiB, {said}")
    line = (f"vllm-doctor health: GPU {','.join(str(o[0]['index']) for o in over)} of the server's {len(group)} "
            f"({layout} on GPUs {','.join(str(g['index']) for g in group)}) "
            f"{'holds' if len(over) == 1 else 'hold up to'} {used:.1f} GiB, {excess:.1f} GiB more than the "
            f"server's budget of {budget:.1f} GiB ({how})")
    if share is not None and not sized:
        line += f"; the model's weights {share[0]:.1f} GiB and KV cache {share[1]:.1f} GiB of it"
    others = _others(d, server_pids)
    if others:
        line += "; not the server's: " + ", ".join(f"pid {pid} ({name or 'unnamed'}) {gib:.1f} GiB"
                                                    for pid, gib, name in others)
    return [Prediction("server-memory-unexplained", line, confidence="high" if others else "medium")]


def _others(device: dict, server_pids: frozenset[int]) -> list[tuple[int, float, str]]:
    procs = [(pid, gib, name) for pid, gib, name in gpus.processes(device) if gib is not None]
    if not server_pids or not any(pid in server_pids for pid, _, _ in procs):
        return []
    return sorted(((pid, gib, name) for pid, gib, name in procs if pid not in server_pids), key=lambda p: -p[1])[:3]
