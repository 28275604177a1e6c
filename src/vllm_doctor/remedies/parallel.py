"""Remedies for the tensor/pipeline-parallel family.

Every remedy reads the numbers it needs from the evidence first (captures), then from the model
(``ctx.shape``), the launch arguments and the GPU count, computes the tensor-parallel sizes vLLM really
accepts (:mod:`vllm_doctor.vllm_math.parallel`), caps them by the GPUs known to exist, and proposes
`--tensor-parallel-size` (plus `--pipeline-parallel-size` where a pipeline layout is the better use of the
GPUs), with the arithmetic shown and the cost of each alternative.
"""
from __future__ import annotations

import re
from typing import Callable

from vllm_doctor.command.edits import SetFlag, SetModel
from vllm_doctor.facts import gpus
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.refine.ray_placement import gpus_asked
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.remedies.layouts import PP_FLAG, TP_FLAG, Setup, build_fix
from vllm_doctor.vllm_math import budget
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.vllm_math.sizing import LoadArgs, Sizing

DCP_FLAG = "--decode-context-parallel-size"
BACKEND_FLAG = "--distributed-executor-backend"

# facts_used names of the shape fields a parallel fix reports
USED_NAMES = {"heads": "attention_heads", "kv_heads": "kv_heads", "vocab": "vocab_size",
              "intermediate": "intermediate_size", "moe_intermediate": "moe_intermediate_size",
              "vision_heads": "vision_heads", "head_dim": "head_dim", "layers": "num_layers"}


# --------------------------------------------------------------------------- what is known

def _launch_value(ctx: RemedyContext, used: dict, name: str, capture: str, fact: str) -> int | None:
    """A number the log's message gives (`capture`), else the launch's (`ctx.arg`, or a fact), noted in `used`."""
    value = ctx.capture_int(capture)
    if value is not None:
        used[name] = f"{value} (log)"
        return value
    value = ctx.arg_int(name) if fact == f"args.{name}" else ctx.fact_int(fact)
    if value is not None:
        src = ctx.facts.source(fact)
        used[name] = f"{value} ({fact}, {src})" if src else f"{value} (--{name.replace('_', '-')})"
    return value


def gather(ctx: RemedyContext) -> Setup:
    shape = ctx.shape.with_values(heads=ctx.capture_int("heads"), kv_heads=ctx.capture_int("kv_heads"))
    used = {label: shape.describe(name) for name, label in USED_NAMES.items()
            if shape.source(name) not in (None, "derived")}
    if shape.quant_group:
        used["quant_group_size"] = shape.quant_group
    sizing = Sizing(shape, LoadArgs(ctx.arg("dtype"), None, ctx.arg("quantization")))
    weights = sizing.weights()
    tp = _launch_value(ctx, used, "tensor_parallel_size", "tp", "args.tensor_parallel_size")
    pp = _launch_value(ctx, used, "pipeline_parallel_size", "pp", "args.pipeline_parallel_size")
    count = _launch_value(ctx, used, "gpus", "gpus", "gpu.count")
    notes = []
    if count is not None and not pm.real_size(count):     # a snapshot claiming 10**12 GPUs: count unknown
        notes.append(pm.not_a_real_size("GPU count", count) + ": treated as unknown")
        count = None
    total = (gpus.total_gib(ctx.gpus[0]) if ctx.gpus else None) or ctx.fact_float("log.total_gpu_gib")
    # layouts are costed on a measured checkpoint only: an estimate would rank them on a guess
    per_node = ctx.fact_int("cluster.gpus_per_node")
    if per_node:
        used["gpus_per_node"] = f"{per_node} (cluster snapshot: the smallest GPU node)"
    return Setup(shape, tp or 1, tp is not None, pp or 1, ctx.arg_int("data_parallel_size") or 1, count,
                 int(total * pm.GIB) if total else None, None if weights.estimated else weights.bytes, used,
                 notes=notes, gpus_per_node=per_node or None, replicas=pm.dp_supported(ctx.version),
                 estimate=weights.bytes if weights.estimated else None, sizing=sizing,
                 launch=budget.Launch(0.0, utilization=ctx.arg_float("gpu_memory_utilization"), version=ctx.version,
                                      max_model_len=ctx.arg_int("max_model_len") or ctx.fact_int("log.max_model_len")))


# --------------------------------------------------------------------------- building the fix

def _bound(k: Setup, fallback: int | None = None) -> int:
    """The number of GPUs a layout may use."""
    if k.gpus:
        k.arith.append(f"GPUs available: {k.gpus}")
        return k.gpus
    bound = fallback if fallback is not None else max(1, k.tp * k.pp)
    asked = "world size" if k.pp > 1 else TP_FLAG
    if not pm.real_size(bound):
        return k.guess_node(asked, bound)
    k.notes.append(f"GPU count unknown: assumed at most {bound} GPU(s) (the requested "
                 f"{asked}); pass --facts or run on the GPU host "
                 f"to check how many exist")
    return bound


def _explain_sizes(k: Setup, bound: int, heads: int | None) -> list[int]:
    valid, lines = pm.explain_tp_sizes(heads, bound, k.tp, **k.shape.tp_kwargs())
    k.arith += lines
    return valid


def _below_tp(k: Setup, bound: int) -> list[int]:
    return pm.powers_of_two(bound, below=k.tp if k.tp <= bound else None)


# --------------------------------------------------------------------------- remedies

def _rejected_heads(k: Setup, heads: int | None, what: str) -> str:
    vision = k.shape.vision_heads
    checked = heads if what != "vision-tower heads" else vision
    if checked and k.tp and checked % k.tp:
        k.arith.append(f"{what}: {checked} % {k.tp} = {checked % k.tp} -> {TP_FLAG} {k.tp} is rejected")
    elif vision and k.tp and vision % k.tp:
        what = "vision-tower heads"
        k.arith.append(f"vision-tower heads: {vision} % {k.tp} = {vision % k.tp} -> {TP_FLAG} {k.tp} is rejected")
    return what


def fix_tensor_parallel(ctx: RemedyContext) -> Fix | None:
    """Attention (or vision-tower) heads not divisible by --tensor-parallel-size."""
    k = gather(ctx)
    heads, vision, kv = k.shape.heads, k.shape.vision_heads, k.shape.kv_heads
    what = "attention heads"
    num, den = ctx.capture_int("numerator"), ctx.capture_int("denominator")   # relabelled `A is not divisible by B`
    if num and den:
        if not k.tp_known:
            k.tp, k.tp_known = den, True
        if vision and num == vision:
            what = "vision-tower heads"
        elif heads is None:
            heads, what = num, "heads"
    what = _rejected_heads(k, heads, what)
    bound = _bound(k)
    pp_ok = pm.pp_supported(ctx.version)
    if heads is None:
        k.notes.append("attention-head count unknown (no model config): proposing a power of two, which "
                     "almost every model accepts; pass --model DIR for an exact answer")
        return build_fix(k, k.rank(bound, None, pp_ok, sizes=_below_tp(k, bound)),
                      lambda t: f"power of two below {k.tp}")
    valid = _explain_sizes(k, bound, heads)
    sizes = None
    if k.shape.vocab is None and k.shape.intermediate is None:
        # only the heads are known: vocabulary and MLP sizes are almost always multiples of 64/128,
        # so powers of two are safe; 5 or 10 divide 40 heads but fail Llama-2-13B's 13824-wide MLP
        sizes = [t for t in valid if pm.is_power_of_two(t)]
        k.notes.append("vocabulary/MLP sizes unknown (no model config): only powers of two are proposed, "
                     "which those dimensions almost always divide; pass --model DIR for every valid size")
    plans = k.rank(bound, heads, pp_ok, exclude=(k.tp, k.pp), sizes=sizes)
    if not plans:
        return None
    if pp_ok:
        k.notes.append(f"{PP_FLAG} has no head constraint: it splits layers, not heads")

    def reason(t: int) -> str:
        txt = f"{heads} attention heads divide by {t}"
        if what == "vision-tower heads":
            txt += f", {vision} vision-tower heads too"
        if kv and kv != heads and (kv % t == 0 or t % kv == 0):
            txt += f"; {kv} KV heads OK"
        return txt

    return build_fix(k, plans, reason)


def _kv_from_divide(ctx: RemedyContext, k: Setup) -> None:
    """`A is not divisible by B` relabelled to the KV-heads rule: which number is K and which is tp."""
    num, den = ctx.capture_int("numerator"), ctx.capture_int("denominator")
    if not (num and den):
        return
    kv = k.shape.kv_heads
    if k.tp_known and num == k.tp and den != k.tp:
        k.shape = k.shape.with_values(kv_heads=kv or den)   # `tp is not divisible by K`: the replication branch
    elif k.tp_known and den == k.tp:
        k.shape = k.shape.with_values(kv_heads=kv or num)   # `K is not divisible by tp`
    elif kv and den == kv:
        k.tp = num
    else:                                                   # nothing else known: divide(K, tp) is the usual order
        k.shape, k.tp = k.shape.with_values(kv_heads=kv or num), den


def fix_kv_heads(ctx: RemedyContext) -> Fix | None:
    """KV heads incompatible with --tensor-parallel-size (or the DCP variants)."""
    k = gather(ctx)
    _kv_from_divide(ctx, k)
    if any("Decode context parallel" in t or "decode-context-parallel-size" in t for t in ctx.lines):
        return _fix_dcp(ctx, k)
    kv, t, heads = k.shape.kv_heads, k.tp, k.shape.heads
    if not kv:
        k.notes.append("KV-head count unknown (bare AssertionError, no model config): proposing powers "
                     "of two; pass --model DIR for an exact answer")
    elif kv >= t:
        k.arith.append(f"KV heads: {kv} % {t} = {kv % t} (K >= tp: KV heads are split, so tp must divide {kv})")
    else:
        k.arith.append(f"KV heads: {t} % {kv} = {t % kv} (K < tp: each rank holds a replica, so tp must be a "
                          f"multiple of {kv})")
    bound = _bound(k)
    pp_ok = pm.pp_supported(ctx.version)
    if heads is None and kv is None:
        return build_fix(k, k.rank(bound, None, pp_ok, sizes=_below_tp(k, bound)),
                      lambda x: "power of two")
    if heads is None:
        # without the head count, only the KV rule can be checked
        k.notes.append("attention-head count unknown: checked KV heads only")
        plans = k.rank(bound, None, pp_ok, exclude=(k.tp, k.pp),
                       sizes=[x for x in range(1, bound + 1) if kv % x == 0 or x % kv == 0])
    else:
        _explain_sizes(k, bound, heads)
        plans = k.rank(bound, heads, pp_ok, exclude=(k.tp, k.pp))

    def reason(x: int) -> str:
        if not kv:
            return "power of two"
        if kv % x == 0:
            return f"{kv} KV heads split {kv // x} per GPU"
        return f"{x} is a multiple of {kv} KV heads: each replicated {x // kv}x"

    return build_fix(k, plans, reason)


def _fix_dcp(ctx: RemedyContext, k: Setup) -> Fix:
    kv, t = k.shape.kv_heads, k.tp
    max_dcp, dcp = ctx.capture_int("max_dcp"), ctx.capture_int("dcp")
    alts: list[Alternative] = []
    if max_dcp and dcp:
        k.arith.append(f"max decode-context-parallel size = tp // KV heads = {t} // {kv} = {max_dcp}"
                          if kv else f"max decode-context-parallel size = {max_dcp}")
        summary = f"Use {DCP_FLAG} {max_dcp} (at most tp // KV heads = {max_dcp}; {dcp} was requested)"
        edits = [SetFlag(DCP_FLAG, str(max_dcp))]
        alts.append(Alternative(f"Use {DCP_FLAG} 1", [SetFlag(DCP_FLAG, "1")],
                                cost="no decode context parallelism: the KV cache is replicated across TP ranks"))
    else:
        if kv:
            k.arith.append(f"decode context parallelism needs tp > KV heads: {t} <= {kv}")
        summary = f"Use {DCP_FLAG} 1 (decode context parallelism needs tp > {kv or 'the'} KV heads)"
        edits = [SetFlag(DCP_FLAG, "1")]
        if kv and k.gpus:
            bigger = [x for x in pm.valid_tp_sizes(k.shape.heads, max_tp=k.gpus, **k.shape.tp_kwargs()) if x > kv]
            if bigger:
                alts.append(Alternative(f"Use {TP_FLAG} {bigger[0]} (> {kv} KV heads)",
                                        [SetFlag(TP_FLAG, str(bigger[0]))],
                                        cost=f"uses {bigger[0]} GPUs; KV heads replicated"))
    return Fix(summary=summary, edits=edits, alternatives=alts, arithmetic=k.arith, facts_used=dict(k.used),
               notes=k.notes)


def _shape_dim(s: ModelShape, num: int) -> str | None:
    if s.vocab and num in (s.vocab, pm.padded_vocab(s.vocab)):
        return "padded vocabulary" if num != s.vocab else "vocabulary"
    if s.intermediate and num == s.intermediate:
        return "intermediate_size"
    if s.moe_intermediate and num == s.moe_intermediate:
        return "moe_intermediate_size"
    if s.heads and s.head_dim and num == s.heads * s.head_dim:
        return "hidden size"
    return None


def _failing_dim(ctx: RemedyContext, k: Setup) -> tuple[list[int] | None, Callable]:
    """The dimension the evidence names; the tp sizes that divide it (None: nothing named) and why."""
    num, den = ctx.capture_int("numerator"), ctx.capture_int("denominator")
    n_part, group = ctx.capture_int("size_per_partition"), ctx.capture_int("group")
    heads_ok = lambda t: not k.shape.heads or k.shape.heads % t == 0  # noqa: E731
    if num and den:
        if not k.tp_known:
            k.tp, k.tp_known = den, True
        dim = _shape_dim(k.shape, num) or "a sharded dimension"
        if dim == "padded vocabulary" or (dim == "a sharded dimension" and num > 10000):
            dim_txt = f"{dim} {num}" if k.shape.vocab is None else f"vocabulary {k.shape.vocab} padded to {num}"
        else:
            dim_txt = f"{dim} {num}"
        k.arith.append(f"{dim_txt}: {num} % {den} = {num % den} -> tp={den} cannot shard it")
        return (lambda bound: [t for t in range(1, bound + 1) if num % t == 0 and heads_ok(t)]), \
            (lambda t: f"{num} % {t} = 0")
    if n_part and group:
        full = n_part * max(k.tp, 1)
        side = "output" if ctx.capture("dim") == "n" else "input"     # fp8 block_n / Marlin tile_n: an output dim
        k.arith.append(f"{side} size per partition {n_part} % group/tile {group} = {n_part % group}"
                          + (f" (full {side} {full} = {n_part} x tp {k.tp})" if k.tp > 1 else ""))
        return (lambda bound: [t for t in range(1, bound + 1) if full % t == 0 and (full // t) % group == 0
                               and heads_ok(t)]), (lambda t: f"{full}/{t} = {full // t}, a multiple of {group}")
    return None, (lambda t: f"smaller shards, tp {t} < {k.tp}")


def _pad_alternative(ctx: RemedyContext, k: Setup) -> list[Alternative]:
    """A quantization group (or Marlin's k tile) that straddles ranks along the input dimension: the
    checkpoint's owners pad that dimension with zeros to a multiple of group x tp before quantizing (Qwen's
    GPTQ releases: 29568 -> 29696 for tp 8), which keeps the tp asked for; zero rows and columns leave the
    MLP's output unchanged. Offered beside the layouts, never as the command: it needs a new checkpoint."""
    n_part, group = ctx.capture_int("size_per_partition"), ctx.capture_int("group")
    if not (n_part and group and k.tp > 1 and ctx.capture("dim") != "n"):
        return []
    full, step = n_part * k.tp, group * k.tp
    padded = -(-full // step) * step
    model = str(ctx.arg("model") or "").rstrip("/")
    copy = f"./{model.rsplit('/', 1)[-1]}-padded" if model else None
    return [Alternative(f"Keep {TP_FLAG} {k.tp} with a checkpoint padded to {padded} along that dimension (zeros "
                        f"added before quantizing, a multiple of group {group} x tp {k.tp}, as Qwen pads its own GPTQ "
                        f"releases: {padded} = {padded // step} x {step})" + (f", saved as {copy}" if copy else ""),
                        [SetModel(copy)] if copy else [], cost="re-quantizing the model from its 16-bit weights")]


def fix_shape(ctx: RemedyContext) -> Fix | None:
    """Another sharded dimension (padded vocab, MLP, quantization groups, Marlin tiles) does not divide."""
    k = gather(ctx)
    dividing, why = _failing_dim(ctx, k)
    extra: list[Alternative] = _pad_alternative(ctx, k)
    # Marlin's tiles are Marlin's alone; a GPTQ group that straddles ranks fails the plain kernels as well
    # (gptq.py: "The input size is not aligned with the quantized weight shape"), whatever vLLM's hint says
    straddles = any("not divisible by group_size" in t for t in ctx.lines)
    if not straddles and any("min_thread" in t or "Marlin" in t or "--quantization gptq" in t for t in ctx.lines):
        extra.append(Alternative("Load the checkpoint with the plain GPTQ kernels (--quantization gptq)",
                                 [SetFlag("--quantization", "gptq")],
                                 cost="slower kernels than Marlin; does not help if groups straddle ranks"))
    bound = _bound(k)
    pp_ok = pm.pp_supported(ctx.version)
    s = k.shape
    if s.heads is not None and (s.vocab or s.intermediate or s.quant_group or s.moe_intermediate):
        _explain_sizes(k, bound, s.heads)
        return build_fix(k, k.rank(bound, s.heads, pp_ok, exclude=(k.tp, k.pp)),
                      lambda t: f"every sharded dimension divides by {t}", extra)
    # only the evidence: keep what divides the failing dimension
    sizes = dividing(bound) if dividing else _below_tp(k, bound)
    sizes = [t for t in sizes if pm.is_power_of_two(t) or (s.heads and s.heads % t == 0)]
    k.notes.append("model config unknown: only the failing dimension was checked; pass --model DIR to "
                 "check every sharded dimension")
    return build_fix(k, k.rank(bound, None, pp_ok, exclude=(k.tp, k.pp), sizes=sizes), why, extra)


def fix_pp_unsupported(ctx: RemedyContext) -> Fix | None:
    """Pipeline parallelism is not supported for this model/version: drop it, use tensor parallel."""
    k = gather(ctx)
    heads = k.shape.heads
    world = max(1, k.tp * k.pp)
    if ctx.has_pattern("sync-engine") and k.pp <= 1:       # the log does not say the layout: the entrypoint is it
        return Fix(summary="Run pipeline parallel through the server (`vllm serve` with the same "
                           f"{PP_FLAG}): the offline LLM class's engine does not run it in vLLM 0.5.1-0.10.2; or give "
                           "the same GPUs to tensor_parallel_size instead", edits=[],
                   arithmetic=["pipeline_parallel_size > 1 with V0's synchronous engine (the LLM class)"],
                   notes=["The check is the entrypoint's, not the model's: V0's LLMEngine.step refuses any "
                          "pipeline_parallel_size > 1; AsyncLLMEngine (the OpenAI server) runs it."])
    k.arith.append(f"requested world size: tp {k.tp} x pp {k.pp} = {world}")
    bound = _bound(k, fallback=world)
    if heads is None:
        k.notes.append("attention-head count unknown: proposing the largest power of two that fits; "
                     "pass --model DIR for an exact answer")
        plans = k.rank(bound, None, pp_supported=False, sizes=pm.powers_of_two(bound))
        reason = lambda t: f"tensor parallel only, {t} GPUs"  # noqa: E731
    else:
        _explain_sizes(k, bound, heads)
        plans = k.rank(bound, heads, pp_supported=False)
        reason = lambda t: f"tensor parallel only; {heads} heads divide by {t}"  # noqa: E731
    k.pp = max(k.pp, 2)  # make sure the edits drop the flag
    if ctx.has_pattern("sync-engine"):
        alternative = Alternative(f"Keep {PP_FLAG}: serve with `vllm serve` (AsyncLLMEngine) instead of the offline "
                                  "LLM class, which runs pipeline parallel only through it before the V1 engine",
                                  [], cost="an HTTP server and client instead of the LLM class")
    else:
        alternative = Alternative("Upgrade vLLM (0.6.3+ supports pipeline parallel for every model implementing "
                                  "SupportsPP)", [], cost="a new vLLM version; check the model supports PP")
    fix = build_fix(k, plans, reason, [alternative])
    if fix is not None:
        fix.summary += f"; drop {PP_FLAG}"
    return fix


def _gpu_bound(ctx: RemedyContext, k: Setup, world: int) -> int:
    """How many GPUs (or, on the CPU backend, NUMA nodes) the layout may use."""
    numa = ctx.capture("numa_nodes")
    if numa:
        # CPU backend: every worker binds its OpenMP threads to its own NUMA node
        nodes = len(re.findall(r"\d+", str(numa)))
        k.arith.append(f"NUMA nodes available: {nodes} {numa} < {world} CPU workers")
        k.notes.append("CPU backend: each worker needs its own NUMA node with VLLM_CPU_OMP_THREADS_BIND=auto; "
                     "binding cores by hand (VLLM_CPU_OMP_THREADS_BIND='0-7|8-15') lifts that limit")
        return max(1, nodes)
    if k.gpus:
        k.arith.append(f"GPUs available: {k.gpus} < {world}")
        return k.gpus
    ray_gpus = ctx.fact_float("log.ray_cluster_gpus")
    if ray_gpus is not None and ctx.has_pattern("ray-status-pending"):
        k.arith.append(f"GPUs in the Ray cluster (`ray status`): {ray_gpus:g} < {world}")
        k.notes.append("Ray counts only the GPUs each node registered: a GPU node that joined with --num-gpus 0, "
                       "from a container without GPUs, or with its GPU under another resource name adds none "
                       "(`ray status -v` and `ray list nodes` show each node's resources)")
        return max(1, int(ray_gpus))
    if not pm.real_size(world):
        return k.guess_node("world size", world)
    bound = pm.powers_of_two(max(1, world - 1))[-1]
    k.notes.append(f"GPU count not in the log or facts: assumed {bound} (the largest power of two "
                 f"below the world size {world}); pass --facts or run on the GPU host")
    return bound


def fix_exceeds_gpus(ctx: RemedyContext) -> Fix | None:
    """tp x pp (x dp) is larger than the GPUs available."""
    k = gather(ctx)
    logged = ctx.capture_int("world_size") or int(gpus_asked(ctx.capture("shape") or ""))
    world = logged or max(1, k.tp * k.pp * k.dp)
    if logged and not k.tp_known and k.pp == 1:
        k.tp = world
    if k.tp * k.pp * k.dp == world:
        k.arith.append(f"world size = tp {k.tp} x pp {k.pp}" + (f" x dp {k.dp}" if k.dp > 1 else "") + f" = {world}")
    else:
        k.arith.append(f"world size = {world}")
    extra = [Alternative(f"Keep the layout and span several nodes: start a Ray cluster and add {BACKEND_FLAG} ray",
                         [SetFlag(BACKEND_FLAG, "ray")],
                         cost=f"needs a Ray cluster with {world} GPUs in total and a fast interconnect between nodes")]
    bound = _gpu_bound(ctx, k, world)
    if k.dp > 1:
        k.notes.append(f"data parallel size {k.dp} multiplies the GPUs needed; lower "
                     f"--data-parallel-size first if replicas are what you wanted")
    heads = k.shape.heads
    if heads is None:
        # divisors of the requested tp passed the same divisibility checks the requested tp did
        k.notes.append("attention-head count unknown: proposing divisors of the requested "
                     f"{TP_FLAG} {k.tp}, which satisfy the same head/vocab checks")
        plans = k.rank(bound, None, pm.pp_supported(ctx.version), exclude=(k.tp, k.pp),
                       sizes=pm.divisors(k.tp) if k.tp > 1 else pm.powers_of_two(bound))
        reason = lambda t: f"world size {t} fits {bound} GPUs"  # noqa: E731
    else:
        _explain_sizes(k, bound, heads)
        plans = k.rank(bound, heads, pm.pp_supported(ctx.version), exclude=(k.tp, k.pp))
        reason = lambda t: f"fits {bound} GPUs; {heads} heads divide by {t}"  # noqa: E731
    return build_fix(k, [p for p in plans if p.world <= bound], reason, extra)
