"""CUDA out of memory: while loading the weights (cuda-oom-load: 16-bit weights, more GPUs, quantize,
offload) and at run time (cuda-oom-runtime: act on the phase that failed; fragmentation -> expandable
segments). The phase comes from the refine hook (refine/oom_phase.py) or the traceback."""
from __future__ import annotations

from dataclasses import dataclass, field

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.events.phases import PHASE_FACT, PHASE_NAMES, classify_frames, classify_milestones
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import budget
from vllm_doctor.vllm_math import memory as mm

from .common import ALLOC_ENV, ALLOC_VALUE, GIB, TP, UTIL, capture_gib, compute_capability, cpu_offload, held_outside, \
    fmt_u, fp8_weights, free_gpu_text, gpu_count, gpu_index, is_fp32, layout, lead, listed_processes, other_processes, \
    present, significant, sizing, this_vllm, total_gib, tp_plan, utilization, weights_total_gib

_NO_KV_YET = ("a lower --gpu-memory-utilization or --max-model-len does not help: the KV cache does not "
              "exist yet when the weights are loaded")


# --------------------------------------------------------------------------- loading the weights

@dataclass
class _Load:
    total: float | None
    util: float
    tp: int
    pp: int
    weights: float | None                    # the whole model, GiB as loaded
    per_gpu: float | None
    budget: float | None                     # ~80 % of the share: room for activations + KV cache
    cc: tuple[int, int] | None
    count: int | None
    ranked: list[Alternative] = field(default_factory=list)
    arith: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _load_case(ctx: RemedyContext) -> _Load:
    total, (u, _), (tp, pp) = total_gib(ctx), utilization(ctx), layout(ctx)
    weights = weights_total_gib(ctx)
    # the room the memory model leaves the weights (what check and plan use); without a config, 80 %
    room = budget.room_for_weights(sizing(ctx), budget.Launch(total, tp, pp, u, ctx.version)) if total else None
    usable = room if room is not None else (0.8 * total * u if total else None)
    c = _Load(total, u, tp, pp, weights, weights / (tp * pp) if weights else None, usable, compute_capability(ctx),
              gpu_count(ctx))
    if c.per_gpu is not None and total:
        how = ("minus activations, non-torch memory and CUDA graphs (memory model)" if room is not None
               else "x ~0.8 (config unknown)")
        c.arith.append(f"weights {weights:.2f} GiB / (tp {tp} x pp {pp}) = {c.per_gpu:.2f} GiB per GPU; "
                       f"usable {total:.2f} GiB x {fmt_u(u)} {how} = {c.budget:.2f} GiB")
    if capture_gib(ctx, "tried_to_allocate") is not None and capture_gib(ctx, "free") is not None:
        c.arith.append(f"the failed request: {ctx.capture('tried_to_allocate')} with only {ctx.capture('free')} free")
    return c


def _free_first(ctx: RemedyContext, c: _Load) -> None:
    procs = other_processes(ctx)
    if (me := this_vllm(ctx, listed_processes(ctx))) is not None:
        c.arith.append(f"PID {me[0]} holds {me[1]:.2f} GiB, about the {me[2]:.2f} GiB PyTorch allocated plus its "
                       "CUDA context: that is this vLLM (a container's PyTorch lists itself under the host's PID)")
    if procs and significant(procs, c.total):
        c.arith.append(f"other processes hold {sum(p[1] or 0 for p in procs):.2f} GiB of GPU {gpu_index(ctx) or 0}")
        c.ranked.append(Alternative(f"Free the GPU first: {free_gpu_text(ctx, procs)}", [],
                                    "you must stop the other process"))
    elif (outside := held_outside(ctx)) is not None:
        c.arith.append(outside[1])
        c.ranked.append(_free_outside(ctx, outside[0]))


def _free_outside(ctx: RemedyContext, gib: float) -> Alternative:
    gpu = f"GPU {ctx.capture('gpu')}" if ctx.capture("gpu") else "the GPU"
    return Alternative(f"Free {gpu}: about {gib:.1f} GiB of it is held outside this vLLM process (another process "
                       f"or an earlier vLLM still running: `nvidia-smi`)", [], "you must stop the other process")


def _sixteen_bits(ctx: RemedyContext, c: _Load) -> None:
    """--dtype float doubles the weights: load them in 2 bytes."""
    if not is_fp32(ctx):
        return
    wb = ctx.shape.weight_bytes
    if wb:
        c.arith.append(f"--dtype float stores 4 bytes per parameter: {2 * wb / GIB:.2f} GiB instead of "
                       f"{wb / GIB:.2f} GiB in bfloat16/float16")
    target = "float16" if c.cc is not None and c.cc < (8, 0) else "auto"
    c.ranked.append(Alternative(f"Load the weights in 2 bytes: --dtype {target} (float32 doubles them)",
                                [SetFlag("--dtype", target)], "none for inference in practice"))
    if c.per_gpu:
        c.per_gpu /= 2
        c.weights = c.weights / 2 if c.weights else None


def _split(plan: tuple[int, str, list[str]]) -> Alternative:
    t, cost, _ = plan
    return Alternative(f"Split the weights over {t} GPUs: --tensor-parallel-size {t}", [SetFlag(TP, str(t))], cost)


def _fp8_that_fits(ctx: RemedyContext, c: _Load) -> Alternative | None:
    """fp8 weights (half the 16-bit bytes), over as many GPUs as they then need when one is not enough; none
    when no GPU count in reach makes them fit."""
    fp8 = fp8_weights(ctx, c.per_gpu)
    if fp8 is None or c.per_gpu is None or c.budget is None or c.per_gpu / 2 <= c.budget:
        return fp8
    plan = tp_plan(ctx, c.weights / 2 if c.weights else None, c.budget)
    if plan is None or c.weights / 2 / (plan[0] * c.pp) > c.budget:
        c.notes.append(f"fp8 weights not offered: {c.per_gpu / 2:.2f} GiB per GPU > {c.budget:.2f} GiB usable, and "
                       f"no GPU count in reach makes them fit")
        return None
    t, cost, lines = plan
    c.arith += [f"fp8 weights {c.per_gpu / 2:.2f} GiB per GPU > {c.budget:.2f} GiB usable: also split them", *lines]
    split = fp8_weights(ctx, c.weights / (t * c.pp))       # its cost says the weights per GPU at that size
    return Alternative(split.summary.replace(": --quantization fp8", f" and split them over {t} GPUs: --quantization "
                                             f"fp8 --tensor-parallel-size {t}"),
                       [*split.edits, SetFlag(TP, str(t))], f"{split.cost}; {cost}")


def fix_oom_load(ctx: RemedyContext) -> Fix | None:
    """cuda-oom-load: the weights do not fit per GPU -> bf16 instead of fp32, more GPUs, quantize, offload."""
    c = _load_case(ctx)
    _free_first(ctx, c)
    launched, launched_per_gpu = c.weights, c.per_gpu     # the alternatives after --dtype auto keep the dtype
    _sixteen_bits(ctx, c)
    world = c.tp * c.pp
    plan = tp_plan(ctx, launched, c.budget) if c.count is None or c.count > world else None
    if plan and (c.count is not None or not c.ranked):
        c.arith.extend(plan[2])
        if c.count and c.count > world:
            c.notes.append(f"{c.count} GPUs are present but only {world} used")
        c.ranked.append(_split(plan))
    if not (c.per_gpu is not None and c.budget is not None and c.per_gpu <= c.budget):
        fp8 = _fp8_that_fits(ctx, c)
        if fp8:
            c.ranked.append(fp8)
        elif c.cc is not None and c.cc < (8, 9):
            c.notes.append(f"compute capability {c.cc[0]}.{c.cc[1]} < 8.9: no fp8 weights; use a pre-quantized "
                           f"AWQ/GPTQ checkpoint of this model instead")
        c.ranked.append(cpu_offload(launched_per_gpu, c.budget))
    if plan and c.count is None and not any(a.edits and a.edits[0] == SetFlag(TP, str(plan[0])) for a in c.ranked):
        c.ranked.append(_split(plan))
    if not c.ranked:
        return None
    primary, rest, summary = lead(c.ranked)
    c.notes.append(_NO_KV_YET)
    facts = {"total_gib": c.total, "gpu_memory_utilization": c.util, "tensor_parallel_size": c.tp,
             "pipeline_parallel_size": c.pp, "weights_total_gib": weights_total_gib(ctx), "gpu_count": c.count,
             "compute_capability": ".".join(map(str, c.cc)) if c.cc else None}
    return Fix(summary, primary.edits, rest, c.arith, present(facts), c.notes)


# --------------------------------------------------------------------------- at run time

def phase_of(ctx: RemedyContext) -> str | None:
    """Where the OOM hit: the sampler warm-up, the traceback's frames, the refine hook's fact, the milestones."""
    if ctx.capture("warmup") or ctx.capture("num_reqs"):
        return "sampler"
    for m in ctx.matches:
        frames = list(getattr(m.traceback, "frames", None) or [])
        got = frames and classify_frames([f.func or "" for f in frames], [f.file or "" for f in frames])
        if got:
            return got
    got = ctx.fact(PHASE_FACT)
    return str(got) if got else classify_milestones(ctx.matches[0].milestones if ctx.matches else None)


def _lower_util(ctx: RemedyContext, total: float | None, u: float, arith: list[str]) -> Alternative:
    """At least 0.05 lower, more if the failed request is bigger than that; a utilization the user raised
    above vLLM's default goes back at least to the default, whose headroom CUDA graphs and activations were
    sized for."""
    tried, free = capture_gib(ctx, "tried_to_allocate"), capture_gib(ctx, "free")
    step = 0.05
    if total and tried is not None:
        step = max(step, mm.ceil_to(max(0.0, tried - (free or 0)) / total + 0.01))
    new_u = max(0.1, mm.floor_to(u - step))
    default = mm.default_utilization(ctx.version)
    raised = _raised_util(ctx)
    if raised and new_u > default:
        new_u = default
    if total:
        back = " (vLLM's default; you raised it)" if raised and new_u == default else ""
        arith.append(f"--gpu-memory-utilization {fmt_u(u)} -> {fmt_u(new_u)}{back} leaves {(u - new_u) * total:.2f} "
                     f"GiB ({fmt_u(u - new_u)} x {total:.2f} GiB) outside the KV cache")
    return Alternative(f"Leave more room outside the KV cache: --gpu-memory-utilization {fmt_u(new_u)}",
                       [SetFlag(UTIL, fmt_u(new_u))], "a smaller KV cache: fewer concurrent requests")


def _own_limit(ctx: RemedyContext, total: float | None, u: float, arith: list[str]) -> Alternative | None:
    """PyTorch (2.12+) refused the request against the process's own cap, PYTORCH_CUDA_ALLOC_CONF's
    per_process_memory_fraction with throw_on_cudamalloc_oom: vLLM sizes its KV cache as a share of the whole
    GPU (--gpu-memory-utilization), so a cap below that share fails however much memory is free."""
    if not ctx.has_pattern("torch-oom-preemptive", "torch-oom-preemptive-raise"):
        return None
    pct = ctx.capture_float("limit_percent")
    if pct is None:
        return Alternative("Lift PyTorch's own cap: per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF above "
                           f"--gpu-memory-utilization {fmt_u(u)}, or drop throw_on_cudamalloc_oom", [],
                           "the log does not say the cap's value")
    cap = pct / 100
    new_u = max(0.1, mm.floor_to(min(u, cap) - 0.03))
    limit = f"{pct:g}% of {ctx.capture('total')}" if ctx.capture("total") else f"{pct:g}%"
    arith.append(f"PyTorch's cap (per_process_memory_fraction): {limit}; requested {ctx.capture('tried_to_allocate')} "
                 f"with {ctx.capture('allocated') or '?'} already allocated; --gpu-memory-utilization {fmt_u(u)} "
                 f"asks for {fmt_u(u)} of the GPU" + (f" ({u * total:.2f} GiB)" if total else ""))
    return Alternative(f"Keep vLLM under PyTorch's cap of {pct:g}%: --gpu-memory-utilization {fmt_u(new_u)} (or raise "
                       f"per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF)", [SetFlag(UTIL, fmt_u(new_u))],
                       "a smaller KV cache: fewer concurrent requests")


def _raised_util(ctx: RemedyContext) -> bool:
    """The user set --gpu-memory-utilization above vLLM's default: the knob to turn back first."""
    u, user_set = utilization(ctx)
    return user_set and u > mm.default_utilization(ctx.version) + 1e-9


def _fewer_seqs(ctx: RemedyContext, arith: list[str]) -> Alternative:
    seqs = ctx.capture_float("num_reqs") or ctx.arg_float("max_num_seqs")
    given = seqs is not None
    seqs = int(seqs or 256)
    new = max(1, seqs // 2)
    if given or ctx.capture("num_reqs"):
        arith.append(f"--max-num-seqs {seqs} -> {new}")
    return Alternative(f"Fewer sequences per batch: --max-num-seqs {new}", [SetFlag("--max-num-seqs", str(new))],
                       "fewer concurrent requests (lower throughput); smaller sampler warm-up and CUDA graphs")


def _smaller_chunks(ctx: RemedyContext, arith: list[str]) -> Alternative | None:
    mbt = ctx.arg_float("max_num_batched_tokens")
    if not mbt:
        return None
    new = max(256, int(mbt // 2) // 256 * 256)
    arith.append(f"--max-num-batched-tokens {int(mbt)} -> {new} roughly halves the activation peak")
    return Alternative(f"Smaller prefill chunks: --max-num-batched-tokens {new}",
                       [SetFlag("--max-num-batched-tokens", str(new))], "slower first token for long prompts")


def _fragmentation(ctx: RemedyContext, arith: list[str]) -> Alternative | None:
    """Reserved-but-unallocated memory at least the failed request: expandable segments."""
    tried, reserved = capture_gib(ctx, "tried_to_allocate"), capture_gib(ctx, "reserved_unallocated")
    if not reserved or reserved <= 0:
        return None
    if not ((tried is not None and reserved >= tried and reserved >= 0.5) or reserved >= 1.0):
        return None
    arith.append(f"reserved but unallocated {ctx.capture('reserved_unallocated')} >= the failed "
                 f"{ctx.capture('tried_to_allocate') or 'request'}: fragmentation")
    return Alternative(f"Reduce fragmentation: {ALLOC_ENV}={ALLOC_VALUE}", [SetEnv(ALLOC_ENV, ALLOC_VALUE)],
                       "none known")


def _by_phase(ctx: RemedyContext, phase: str | None, alts: dict[str, Alternative | None],
              ranked: list[Alternative], notes: list[str]) -> None:
    util, seqs, mbt, eager = alts["util"], alts["seqs"], alts["mbt"], alts["eager"]
    if phase == "graph":
        # the utilization the user raised left CUDA graphs no room: undo that before a slower mode
        ranked += [util, eager, seqs] if _raised_util(ctx) else [eager, util, seqs]
    elif phase == "sampler":
        ranked += [seqs, util]
    elif phase == "profile":
        ranked += [a for a in (mbt, seqs, util) if a]
        if not mbt:
            notes.append("the activation peak grows with --max-num-batched-tokens (and, without chunked "
                         "prefill, with --max-model-len)")
    elif phase == "kv_alloc":
        ranked += [util, seqs]
    elif phase == "init":
        # the card was full before vLLM allocated anything: no flag of vLLM's makes room
        if not ranked:
            gpu = f"GPU {ctx.capture('gpu')}" if ctx.capture("gpu") else "the GPU"
            ranked.append(Alternative(f"Free {gpu}: it was already nearly full before vLLM allocated anything - "
                                      "another process or an earlier vLLM still holds it (`nvidia-smi`)", [],
                                      "you must stop the other process"))
        notes.append("lowering --gpu-memory-utilization or --max-num-seqs does not help here: those only size "
                     "what vLLM allocates later")
    else:  # serving or unknown
        ranked += [util, seqs] + ([mbt] if mbt else []) + [eager]


def fix_oom_runtime(ctx: RemedyContext) -> Fix | None:
    """cuda-oom-runtime: act on the phase that failed; fragmentation -> expandable segments."""
    phase, total, (u, _) = phase_of(ctx), total_gib(ctx), utilization(ctx)
    procs = other_processes(ctx)
    tried, free = capture_gib(ctx, "tried_to_allocate"), capture_gib(ctx, "free")
    arith: list[str] = []
    notes = [f"the OOM happened during {PHASE_NAMES.get(phase, phase)}"] if phase else [
        "phase unknown: the log shows no start-up phase before the OOM. The fixes assume it came after the "
        "weights loaded; if they were still loading, the weights do not fit: spread them over more GPUs "
        "(--tensor-parallel-size) or use a quantized checkpoint"]
    if tried is not None and free is not None:
        arith.append(f"requested {ctx.capture('tried_to_allocate')} with {ctx.capture('free')} free "
                     f"on GPU {ctx.capture('gpu') or 0} of {ctx.capture('total') or '?'}")
    own = _own_limit(ctx, total, u, arith)
    alts = {"util": _lower_util(ctx, total, u, arith), "seqs": _fewer_seqs(ctx, arith),
            "mbt": _smaller_chunks(ctx, arith),
            "eager": Alternative("Skip CUDA graphs: --enforce-eager", [SetFlag("--enforce-eager")],
                                 "slower decoding (no CUDA graphs)")}
    frag = _fragmentation(ctx, arith)
    ranked: list[Alternative] = []
    if own is not None:
        ranked.append(own)
    elif procs and significant(procs, total):
        ranked.append(Alternative(f"Free the GPU: {free_gpu_text(ctx, procs)}", [], "you must stop the other process"))
    elif (outside := held_outside(ctx)) is not None:
        arith.append(outside[1])
        ranked.append(_free_outside(ctx, outside[0]))
    if frag and phase != "sampler":
        ranked.append(frag)
    _by_phase(ctx, phase, alts, ranked, notes)
    if frag and frag not in ranked:
        ranked.append(frag)
    primary, rest, summary = lead(ranked)
    used = {"phase": phase or "unknown", "total_gib": total, "gpu_memory_utilization": u, "tried_to_allocate_gib": tried,
            "free_gib": free, "reserved_unallocated_gib": capture_gib(ctx, "reserved_unallocated")}
    fix = Fix(summary, primary.edits, rest, arith, present(used), notes)
    if primary is frag:
        fix.facts_used["env"] = {ALLOC_ENV: ALLOC_VALUE}
    return fix
