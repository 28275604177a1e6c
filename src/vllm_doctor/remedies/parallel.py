"""Remedies for the tensor/pipeline-parallel family, and the refine hook for `A is not divisible by B`.

Every remedy gathers the numbers it needs from the evidence first (captures), then from the facts
(model config, launch args, GPU count), computes the tensor-parallel sizes vLLM really accepts
(``parallel_math``), caps them by the GPUs known to exist, and proposes `--tensor-parallel-size`
(plus `--pipeline-parallel-size` where a pipeline layout is the better use of the GPUs), with the
arithmetic shown and the cost of each alternative.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.command.edits import RemoveFlag, SetFlag
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.remedies.base import Alternative, Fix
from vllm_doctor.facts import gpus
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.numbers import as_int as _to_int
from vllm_doctor.vllm_math.sizing import LoadArgs, Sizing

TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
DCP_FLAG = "--decode-context-parallel-size"
BACKEND_FLAG = "--distributed-executor-backend"

KV_RULE = "tp-kv-heads-indivisible"
SHAPE_RULE = "tp-shape-indivisible"
HEADS_RULE = "tp-heads-indivisible"



# --------------------------------------------------------------------------- gathering


def _all_captures(ctx) -> dict[str, str]:
    """ctx.captures, completed by later matches' captures (first value of each name wins)."""
    out: dict[str, str] = dict(ctx.captures or {})
    for m in ctx.matches or []:
        caps = getattr(m, "captures", None) or {}
        for k, v in caps.items():
            if v is not None and k not in out:
                out[k] = v
    return out


def _evidence_text(ctx) -> str:
    parts = []
    for m in ctx.matches or []:
        line = getattr(m, "line", None)
        parts.append(str(getattr(line, "message", None) or getattr(line, "raw", None) or line or ""))
    return "\n".join(parts)


def _fact(ctx, key: str) -> Any:
    try:
        return ctx.facts.get(key) if ctx.facts is not None else None
    except Exception:  # noqa: BLE001 - a broken facts object must not kill the remedy
        return None


def _cmd_int(ctx, flag: str) -> int | None:
    cmd = ctx.command
    if cmd is None:
        return None
    try:
        return _to_int(cmd.get(flag))
    except Exception:  # noqa: BLE001
        return None


@dataclass
class Known:
    shape: ModelShape = field(default_factory=ModelShape)   # the model, with the log's numbers in
    weight_bytes: int | None = None
    gpu_mem: int | None = None
    gpus: int | None = None
    tp: int = 1
    tp_known: bool = False
    pp: int = 1
    dp: int = 1
    used: dict[str, Any] = field(default_factory=dict)

    # the shape's fields under the names the remedies use
    heads = property(lambda self: self.shape.heads)
    kv = property(lambda self: self.shape.kv_heads)
    vocab = property(lambda self: self.shape.vocab)
    intermediate = property(lambda self: self.shape.intermediate)
    moe_intermediate = property(lambda self: self.shape.moe_intermediate)
    quant_group = property(lambda self: self.shape.quant_group)
    vision_heads = property(lambda self: self.shape.vision_heads)
    head_dim = property(lambda self: self.shape.head_dim)
    layers = property(lambda self: self.shape.layers)
    use_mla = property(lambda self: self.shape.use_mla)

    def set(self, **values: Any) -> None:
        self.shape = self.shape.with_values(**values)

    def math_kwargs(self) -> dict[str, Any]:
        return self.shape.tp_kwargs()


# facts_used names of the shape fields a parallel fix reports
USED_NAMES = {"heads": "attention_heads", "kv_heads": "kv_heads", "vocab": "vocab_size",
              "intermediate": "intermediate_size", "moe_intermediate": "moe_intermediate_size",
              "vision_heads": "vision_heads", "head_dim": "head_dim", "layers": "num_layers"}


def gather(ctx) -> Known:
    caps = _all_captures(ctx)
    shape = ModelShape.from_facts(ctx.facts).with_values(heads=_to_int(caps.get("heads")),
                                                           kv_heads=_to_int(caps.get("kv_heads")))
    k = Known(shape=shape)
    for name, label in USED_NAMES.items():
        if shape.source(name) not in (None, "derived"):
            k.used[label] = shape.describe(name)
    if shape.quant_group:
        k.used["quant_group_size"] = shape.quant_group
    weights = Sizing(shape, LoadArgs.from_facts(ctx.facts)).weights()
    # layouts are costed on a measured checkpoint only: an estimate would rank them on a guess
    k.weight_bytes = None if weights.estimated else weights.bytes
    k.gpu_mem = _gpu_mem(ctx)

    def pick(name: str, cap: str, fact_key: str) -> int | None:
        v = _to_int(caps.get(cap))
        if v is not None:
            k.used[name] = f"{v} (log)"
            return v
        v = _to_int(_fact(ctx, fact_key))
        if v is not None:
            src = ctx.facts.source(fact_key) if hasattr(ctx.facts, "source") else None
            k.used[name] = f"{v} ({fact_key}{', ' + src if src else ''})"
        return v

    tp = pick("tensor_parallel_size", "tp", "args.tensor_parallel_size")
    tp = tp or _cmd_int(ctx, TP_FLAG)
    k.tp_known = tp is not None
    k.tp = tp or 1
    pp = pick("pipeline_parallel_size", "pp", "args.pipeline_parallel_size")
    k.pp = pp or _cmd_int(ctx, PP_FLAG) or 1
    k.dp = _to_int(_fact(ctx, "args.data_parallel_size")) or 1
    k.gpus = pick("gpus", "gpus", "gpu.count")
    return k


def _gpu_mem(ctx) -> int | None:
    devices = gpus.devices(ctx.facts)
    total = gpus.total_gib(devices[0]) if devices else None
    if total:
        return int(total * pm.GIB)
    gib = _fact(ctx, "log.total_gpu_gib")
    try:
        return int(float(gib) * pm.GIB) if gib else None
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- building the fix

def _layout_flags(tp: int, pp: int) -> str:
    return f"{TP_FLAG} {tp}" + (f" {PP_FLAG} {pp}" if pp > 1 else "")


def _layout_edits(tp: int, pp: int, old_pp: int) -> list:
    edits: list = [SetFlag(TP_FLAG, str(tp))]
    if pp > 1:
        edits.append(SetFlag(PP_FLAG, str(pp)))
    elif old_pp > 1:
        edits.append(RemoveFlag(PP_FLAG))
    return edits


def _bound(k: Known, notes: list[str], arithmetic: list[str], fallback: int | None = None) -> int:
    """The number of GPUs a layout may use."""
    if k.gpus:
        arithmetic.append(f"GPUs available: {k.gpus}")
        return k.gpus
    bound = fallback if fallback is not None else max(1, k.tp * k.pp)
    notes.append(f"GPU count unknown: assumed at most {bound} GPU(s) (the requested "
                 f"{'world size' if k.pp > 1 else TP_FLAG}); pass --facts or run on the GPU host "
                 f"to check how many exist")
    return bound


def _explain_sizes(k: Known, bound: int, arithmetic: list[str], heads: int | None) -> list[int]:
    kw = k.math_kwargs()
    if heads:
        arithmetic.append(f"divisors of {heads} attention heads: "
                          + ", ".join(str(d) for d in pm.divisors(heads)))
    valid = pm.valid_tp_sizes(heads, max_tp=bound, **kw)
    for t in range(2, bound + 1):
        if t in valid:
            continue
        why = pm.why_invalid(t, heads, **kw)
        if why and (heads is None or heads % t == 0 or t == k.tp):
            arithmetic.append(f"tp={t} fails: " + "; ".join(why))
    arithmetic.append(f"valid {TP_FLAG} values up to {bound}: " + ", ".join(map(str, valid)))
    return valid


def _build(k: Known, plans: list[pm.Plan], reason: str, arithmetic: list[str], notes: list[str],
           extra_alternatives: list[Alternative] | None = None) -> Fix | None:
    if not plans:
        return None
    best = plans[0]
    summary = f"Use {_layout_flags(best.tp, best.pp)} ({reason(best.tp)})"
    if best.pp > 1:
        summary += f"; {best.pp} pipeline stages use all {best.world} GPUs"
    elif best.idle:
        summary += f"; {best.idle} of {best.gpus} GPUs stay idle"
    alts: list[Alternative] = []
    for p in plans[1:4]:
        alts.append(Alternative(summary=f"Use {_layout_flags(p.tp, p.pp)}",
                                edits=_layout_edits(p.tp, p.pp, k.pp),
                                cost="; ".join(p.costs) or "none"))
    alts.extend(extra_alternatives or [])
    for p in plans[:4]:
        arithmetic.append(f"tp={p.tp} pp={p.pp}: uses {p.world} GPU(s)"
                          + (f"; {'; '.join(p.costs)}" if p.costs else ""))
    if best.costs:
        notes.append("cost of the proposed layout: " + "; ".join(best.costs))
    edits = _layout_edits(best.tp, best.pp, k.pp)
    if best.pp == 1 and any(p.pp > 1 for p in plans[1:4]):
        # say pp=1 explicitly: the alternatives below use pipeline stages, the primary does not
        edits = [e for e in edits if getattr(e, "flag", None) != PP_FLAG] + [SetFlag(PP_FLAG, "1")]
    return Fix(summary=summary, edits=edits, alternatives=alts,
               arithmetic=arithmetic, facts_used=dict(k.used), notes=notes)


def _guess_sizes(limit: int, below: int | None = None) -> list[int]:
    """Powers of two up to limit (and below ``below``): what almost every model accepts."""
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    if below is not None:
        out = [t for t in out if t < below] or [1]
    return out


def _plans_from_sizes(k: Known, sizes: list[int], bound: int, pp_supported: bool = True,
                      exclude: tuple[int, int] | None = None) -> list[pm.Plan]:
    """Rank layouts for an explicit list of tp sizes (used when the model config is unknown)."""
    plans: list[pm.Plan] = []
    for t in sizes:
        if t > bound:
            continue
        pps = [1]
        if pp_supported and bound // t > 1 and t * (bound // t) == bound:
            pps.append(bound // t)
        for pp in pps:
            if exclude is not None and (t, pp) == exclude:
                continue
            costs, per, fits = pm.plan_costs(t, pp, bound, k.kv, k.use_mla, k.weight_bytes,
                                             k.gpu_mem, k.layers)
            plans.append(pm.Plan(t, pp, bound, per, fits, costs))
    plans.sort(key=lambda p: (p.fits is False, bound > 2 and p.idle * 2 >= bound, p.pp > 1, -p.tp,
                              not pm.is_power_of_two(p.tp)))
    return plans


def _rank(k: Known, bound: int, heads: int | None, pp_supported: bool = True,
          exclude: tuple[int, int] | None = None) -> list[pm.Plan]:
    return pm.rank_plans(bound, heads, weight_bytes=k.weight_bytes, gpu_mem_bytes=k.gpu_mem,
                         pp_supported=pp_supported, num_layers=k.layers, use_mla=k.use_mla,
                         exclude=exclude, **k.math_kwargs())


def _pp_supported(ctx) -> bool:
    return pm.pp_supported(_fact(ctx, "vllm.version"))


# --------------------------------------------------------------------------- remedies

def fix_tensor_parallel(ctx) -> Fix | None:
    """Attention (or vision-tower) heads not divisible by --tensor-parallel-size."""
    k = gather(ctx)
    caps = _all_captures(ctx)
    arithmetic: list[str] = []
    notes: list[str] = []
    heads = k.heads
    what = "attention heads"
    # relabelled `A is not divisible by B` (QKV heads or the vision tower)
    num, den = _to_int(caps.get("numerator")), _to_int(caps.get("denominator"))
    if num and den:
        if not k.tp_known:
            k.tp, k.tp_known = den, True
        if k.vision_heads and num == k.vision_heads:
            what = "vision-tower heads"
        elif heads is None:
            heads = num
            what = "heads"
    checked = heads if what != "vision-tower heads" else k.vision_heads
    if checked and k.tp and checked % k.tp:
        arithmetic.append(f"{what}: {checked} % {k.tp} = {checked % k.tp} -> "
                          f"{TP_FLAG} {k.tp} is rejected")
    elif k.vision_heads and k.tp and k.vision_heads % k.tp:
        what = "vision-tower heads"
        arithmetic.append(f"vision-tower heads: {k.vision_heads} % {k.tp} = {k.vision_heads % k.tp}"
                          f" -> {TP_FLAG} {k.tp} is rejected")
    bound = _bound(k, notes, arithmetic)
    pp_ok = _pp_supported(ctx)
    if heads is None:
        notes.append("attention-head count unknown (no model config): proposing a power of two, which "
                     "almost every model accepts; pass --model DIR for an exact answer")
        plans = _plans_from_sizes(k, _guess_sizes(bound, below=k.tp if k.tp <= bound else None),
                                  bound, pp_ok)
        return _build(k, plans, lambda t: f"power of two below {k.tp}", arithmetic, notes)
    valid = _explain_sizes(k, bound, arithmetic, heads)
    if k.vocab is None and k.intermediate is None:
        # only the heads are known: vocabulary and MLP sizes are almost always multiples of 64/128,
        # so powers of two are safe; 5 or 10 divide 40 heads but fail Llama-2-13B's 13824-wide MLP
        safe = [t for t in valid if pm.is_power_of_two(t)]
        notes.append("vocabulary/MLP sizes unknown (no model config): only powers of two are proposed, "
                     "which those dimensions almost always divide; pass --model DIR for every valid size")
        plans = _plans_from_sizes(k, safe, bound, pp_ok, exclude=(k.tp, k.pp))
    else:
        plans = _rank(k, bound, heads, pp_ok, exclude=(k.tp, k.pp))
    if not plans:
        return None
    if pp_ok:
        notes.append(f"{PP_FLAG} has no head constraint: it splits layers, not heads")

    def reason(t: int) -> str:
        txt = f"{heads} attention heads divide by {t}"
        if what == "vision-tower heads":
            txt += f", {k.vision_heads} vision-tower heads too"
        if k.kv and k.kv != heads:
            txt += f"; {k.kv} KV heads OK" if (k.kv % t == 0 or t % k.kv == 0) else ""
        return txt

    return _build(k, plans, reason, arithmetic, notes)


def fix_kv_heads(ctx) -> Fix | None:
    """KV heads incompatible with --tensor-parallel-size (or the DCP variants)."""
    k = gather(ctx)
    caps = _all_captures(ctx)
    arithmetic: list[str] = []
    notes: list[str] = []
    text = _evidence_text(ctx)
    num, den = _to_int(caps.get("numerator")), _to_int(caps.get("denominator"))
    if num and den:
        if k.tp_known and num == k.tp and den != k.tp:
            k.set(kv_heads=k.kv or den)   # `tp is not divisible by K`: the replication branch
        elif k.tp_known and den == k.tp:
            k.set(kv_heads=k.kv or num)   # `K is not divisible by tp`
        elif k.kv and den == k.kv:
            k.tp = num
        else:                           # nothing else known: divide(K, tp) is the usual order
            k.set(kv_heads=k.kv or num)
            k.tp = den

    if "Decode context parallel" in text or "decode-context-parallel-size" in text:
        return _fix_dcp(ctx, k, caps, arithmetic, notes)

    kv, t = k.kv, k.tp
    if kv:
        if kv >= t:
            arithmetic.append(f"KV heads: {kv} % {t} = {kv % t} (K >= tp: KV heads are split, so tp "
                              f"must divide {kv})")
        else:
            arithmetic.append(f"KV heads: {t} % {kv} = {t % kv} (K < tp: each rank holds a replica, so "
                              f"tp must be a multiple of {kv})")
    else:
        notes.append("KV-head count unknown (bare AssertionError, no model config): proposing powers "
                     "of two; pass --model DIR for an exact answer")
    bound = _bound(k, notes, arithmetic)
    pp_ok = _pp_supported(ctx)
    heads = k.heads
    if heads is None and kv is None:
        plans = _plans_from_sizes(k, _guess_sizes(bound, below=t if t <= bound else None), bound, pp_ok)
        return _build(k, plans, lambda x: "power of two", arithmetic, notes)
    if heads is None:
        # without the head count, only the KV rule can be checked
        sizes = [x for x in range(1, bound + 1) if kv % x == 0 or x % kv == 0]
        notes.append("attention-head count unknown: checked KV heads only")
        plans = _plans_from_sizes(k, sizes, bound, pp_ok, exclude=(k.tp, k.pp))
    else:
        _explain_sizes(k, bound, arithmetic, heads)
        plans = _rank(k, bound, heads, pp_ok, exclude=(k.tp, k.pp))

    def reason(x: int) -> str:
        if not kv:
            return "power of two"
        if kv % x == 0:
            return f"{kv} KV heads split {kv // x} per GPU"
        return f"{x} is a multiple of {kv} KV heads: each replicated {x // kv}x"

    return _build(k, plans, reason, arithmetic, notes)


def _fix_dcp(ctx, k: Known, caps: dict, arithmetic: list[str], notes: list[str]) -> Fix:
    kv, t = k.kv, k.tp
    max_dcp = _to_int(caps.get("max_dcp"))
    dcp = _to_int(caps.get("dcp"))
    alts: list[Alternative] = []
    if max_dcp and dcp:
        arithmetic.append(f"max decode-context-parallel size = tp // KV heads = {t} // {kv} = {max_dcp}"
                          if kv else f"max decode-context-parallel size = {max_dcp}")
        summary = f"Use {DCP_FLAG} {max_dcp} (at most tp // KV heads = {max_dcp}; {dcp} was requested)"
        edits = [SetFlag(DCP_FLAG, str(max_dcp))]
        alts.append(Alternative(f"Use {DCP_FLAG} 1", [SetFlag(DCP_FLAG, "1")],
                                cost="no decode context parallelism: the KV cache is replicated across "
                                     "TP ranks"))
    else:
        if kv:
            arithmetic.append(f"decode context parallelism needs tp > KV heads: {t} <= {kv}")
        summary = f"Use {DCP_FLAG} 1 (decode context parallelism needs tp > {kv or 'the'} KV heads)"
        edits = [SetFlag(DCP_FLAG, "1")]
        gpus = k.gpus
        if kv and gpus:
            bigger = [x for x in pm.valid_tp_sizes(k.heads, max_tp=gpus, **k.math_kwargs()) if x > kv]
            if bigger:
                alts.append(Alternative(f"Use {TP_FLAG} {bigger[0]} (> {kv} KV heads)",
                                        [SetFlag(TP_FLAG, str(bigger[0]))],
                                        cost=f"uses {bigger[0]} GPUs; KV heads replicated"))
    return Fix(summary=summary, edits=edits, alternatives=alts, arithmetic=arithmetic,
               facts_used=dict(k.used), notes=notes)


def _shape_dim(k: Known, num: int) -> str | None:
    if k.vocab and num in (k.vocab, pm.padded_vocab(k.vocab)):
        return "padded vocabulary" if num != k.vocab else "vocabulary"
    if k.intermediate and num == k.intermediate:
        return "intermediate_size"
    if k.moe_intermediate and num == k.moe_intermediate:
        return "moe_intermediate_size"
    if k.heads and k.head_dim and num == k.heads * k.head_dim:
        return "hidden size"
    return None


def fix_shape(ctx) -> Fix | None:
    """Another sharded dimension (padded vocab, MLP, quantization groups, Marlin tiles) does not divide."""
    k = gather(ctx)
    caps = _all_captures(ctx)
    arithmetic: list[str] = []
    notes: list[str] = []
    text = _evidence_text(ctx)
    num, den = _to_int(caps.get("numerator")), _to_int(caps.get("denominator"))
    n_part, group = _to_int(caps.get("size_per_partition")), _to_int(caps.get("group"))
    extra: list[Alternative] = []
    if num and den:
        if not k.tp_known:
            k.tp, k.tp_known = den, True
        dim = _shape_dim(k, num) or "a sharded dimension"
        if dim == "padded vocabulary" or (dim == "a sharded dimension" and num > 10000):
            dim_txt = f"{dim} {num}" if k.vocab is None else f"vocabulary {k.vocab} padded to {num}"
        else:
            dim_txt = f"{dim} {num}"
        arithmetic.append(f"{dim_txt}: {num} % {den} = {num % den} -> tp={den} cannot shard it")
    elif n_part and group:
        full = n_part * max(k.tp, 1)
        arithmetic.append(f"input size per partition {n_part} % group/tile {group} = {n_part % group}"
                          + (f" (full input {full} = {n_part} x tp {k.tp})" if k.tp > 1 else ""))
    if "min_thread" in text or "Marlin" in text or "--quantization gptq" in text:
        extra.append(Alternative("Load the checkpoint with the plain GPTQ kernels (--quantization gptq)",
                                 [SetFlag("--quantization", "gptq")],
                                 cost="slower kernels than Marlin; does not help if groups straddle ranks"))
    bound = _bound(k, notes, arithmetic)
    pp_ok = _pp_supported(ctx)
    if k.heads is not None and (k.vocab or k.intermediate or k.quant_group or k.moe_intermediate):
        _explain_sizes(k, bound, arithmetic, k.heads)
        plans = _rank(k, bound, k.heads, pp_ok, exclude=(k.tp, k.pp))
        return _build(k, plans, lambda t: f"every sharded dimension divides by {t}", arithmetic, notes,
                      extra)
    # only the evidence: keep what divides the failing dimension
    if num and den:
        sizes = [t for t in range(1, bound + 1) if num % t == 0 and (not k.heads or k.heads % t == 0)]
        why = lambda t: f"{num} % {t} = 0"  # noqa: E731
    elif n_part and group:
        full = n_part * max(k.tp, 1)
        sizes = [t for t in range(1, bound + 1) if full % t == 0 and (full // t) % group == 0
                 and (not k.heads or k.heads % t == 0)]
        why = lambda t: f"{full}/{t} = {full // t}, a multiple of {group}"  # noqa: E731
    else:
        sizes = _guess_sizes(bound, below=k.tp if k.tp <= bound else None)
        why = lambda t: f"smaller shards, tp {t} < {k.tp}"  # noqa: E731
    sizes = [t for t in sizes if pm.is_power_of_two(t) or (k.heads and k.heads % t == 0)]
    notes.append("model config unknown: only the failing dimension was checked; pass --model DIR to "
                 "check every sharded dimension")
    plans = _plans_from_sizes(k, sizes, bound, pp_ok, exclude=(k.tp, k.pp))
    return _build(k, plans, why, arithmetic, notes, extra)


def fix_pp_unsupported(ctx) -> Fix | None:
    """Pipeline parallelism is not supported for this model/version: drop it, use tensor parallel."""
    k = gather(ctx)
    arithmetic: list[str] = []
    notes: list[str] = []
    world = max(1, k.tp * k.pp)
    arithmetic.append(f"requested world size: tp {k.tp} x pp {k.pp} = {world}")
    bound = _bound(k, notes, arithmetic, fallback=world)
    if k.heads is None:
        notes.append("attention-head count unknown: proposing the largest power of two that fits; "
                     "pass --model DIR for an exact answer")
        plans = _plans_from_sizes(k, _guess_sizes(bound), bound, pp_supported=False)
        reason = lambda t: f"tensor parallel only, {t} GPUs"  # noqa: E731
    else:
        _explain_sizes(k, bound, arithmetic, k.heads)
        plans = _rank(k, bound, k.heads, pp_supported=False)
        reason = lambda t: f"tensor parallel only; {k.heads} heads divide by {t}"  # noqa: E731
    k.pp = max(k.pp, 2)  # make sure the edits drop the flag
    fix = _build(k, plans, reason, arithmetic, notes, [
        Alternative("Upgrade vLLM (0.6.3+ supports pipeline parallel for every model implementing "
                    "SupportsPP)", [], cost="a new vLLM version; check the model supports PP")])
    if fix is not None:
        fix.summary += f"; drop {PP_FLAG}"
    return fix


def fix_exceeds_gpus(ctx) -> Fix | None:
    """tp x pp (x dp) is larger than the GPUs available."""
    k = gather(ctx)
    caps = _all_captures(ctx)
    arithmetic: list[str] = []
    notes: list[str] = []
    world = _to_int(caps.get("world_size")) or max(1, k.tp * k.pp * k.dp)
    if _to_int(caps.get("world_size")) and not k.tp_known and k.pp == 1:
        k.tp = world
    product = k.tp * k.pp * k.dp
    if product == world:
        arithmetic.append(f"world size = tp {k.tp} x pp {k.pp}" + (f" x dp {k.dp}" if k.dp > 1 else "")
                          + f" = {world}")
    else:
        arithmetic.append(f"world size = {world}")
    extra = [Alternative(f"Keep the layout and span several nodes: start a Ray cluster and add "
                         f"{BACKEND_FLAG} ray", [SetFlag(BACKEND_FLAG, "ray")],
                         cost=f"needs a Ray cluster with {world} GPUs in total and a fast interconnect "
                              f"between nodes")]
    numa = caps.get("numa_nodes")
    if numa:
        # CPU backend: every worker binds its OpenMP threads to its own NUMA node
        nodes = len(re.findall(r"\d+", str(numa)))
        arithmetic.append(f"NUMA nodes available: {nodes} {numa} < {world} CPU workers")
        bound = max(1, nodes)
        notes.append("CPU backend: each worker needs its own NUMA node with VLLM_CPU_OMP_THREADS_BIND=auto; "
                     "binding cores by hand (VLLM_CPU_OMP_THREADS_BIND='0-7|8-15') lifts that limit")
    elif k.gpus:
        arithmetic.append(f"GPUs available: {k.gpus} < {world}")
        bound = k.gpus
    else:
        bound = _guess_sizes(max(1, world - 1))[-1]
        notes.append(f"GPU count not in the log or facts: assumed {bound} (the largest power of two "
                     f"below the world size {world}); pass --facts or run on the GPU host")
    if k.dp > 1:
        notes.append(f"data parallel size {k.dp} multiplies the GPUs needed; lower "
                     f"--data-parallel-size first if replicas are what you wanted")
    heads = k.heads
    if heads is None:
        # divisors of the requested tp passed the same divisibility checks the requested tp did
        sizes = pm.divisors(k.tp) if k.tp > 1 else _guess_sizes(bound)
        notes.append("attention-head count unknown: proposing divisors of the requested "
                     f"{TP_FLAG} {k.tp}, which satisfy the same head/vocab checks")
        plans = _plans_from_sizes(k, sizes, bound, _pp_supported(ctx), exclude=(k.tp, k.pp))
        reason = lambda t: f"world size {t} fits {bound} GPUs"  # noqa: E731
    else:
        _explain_sizes(k, bound, arithmetic, heads)
        plans = _rank(k, bound, heads, _pp_supported(ctx), exclude=(k.tp, k.pp))
        reason = lambda t: f"fits {bound} GPUs; {heads} heads divide by {t}"  # noqa: E731
    plans = [p for p in plans if p.world <= bound]
    return _build(k, plans, reason, arithmetic, notes, extra)
