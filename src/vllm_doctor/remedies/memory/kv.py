"""kv-cache-insufficient: a --max-model-len safely below what fits, or the utilization that makes room, an fp8
KV cache, more GPUs; the figures of the log first (vLLM's own estimate, its token capacity, the GiB needed
and available), then the model's KV bytes per token. Each alternative is re-checked against those figures
(kv_checks.py) so that it fixes the finding on its own."""
from __future__ import annotations

from typing import Any

from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import parse_len

from .common import GIB, MML, TP, UTIL, compute_capability, fmt_u, fp8_weights, free_cap, gpu_count, layout, \
    present, sizing, total_gib, tp_plan, utilization, weights_total_gib
from .kv_checks import CPU_KV_SPACE, KV_BYTES, KVCase, complete, cpu_backend, error_names_cpu_kv_space, \
    explicit_kv, resize_kv, tokens_with, tp_factor


def _case(ctx: RemedyContext) -> KVCase:
    mml = ctx.capture_float("max_model_len") or parse_len(ctx.arg("max_model_len")) or ctx.fact_float("log.max_model_len")
    avail = ctx.capture_float("available_gib")
    if avail is None:
        avail = ctx.fact_float("log.kv_cache_gib")
    explicit = explicit_kv(ctx)
    if avail is None and explicit:
        avail = explicit[1]
    u, user_set = utilization(ctx)
    return KVCase(mml=int(mml) if mml else None, block=ctx.arg_int("block_size") or mm.DEFAULT_BLOCK, util=u,
                 user_util=user_set, default_util=mm.default_utilization(ctx.version), total=total_gib(ctx),
                 needed=ctx.capture_float("needed_gib"), avail=avail,
                 estimate=ctx.capture_float("estimated_max_len"), v0_tokens=ctx.capture_float("kv_cache_tokens"),
                 per_token=sizing(ctx).kv_per_token(*layout(ctx)),
                 no_room=ctx.has_pattern("no-cache-blocks", "auto-fit", "zero-gpu-blocks"), explicit=explicit)


def _capacity(c: KVCase) -> int | None:
    """Tokens the KV cache holds, from the best figure the log gives, with the arithmetic (None: no figure)."""
    bs, mml = c.block, c.mml
    if c.v0_tokens:
        c.arith.append(f"KV cache holds {mm.fmt_tokens(int(c.v0_tokens))} tokens (GPU blocks x {bs}) < "
                       f"max_model_len {mm.fmt_tokens(mml or 0)}")
        if c.avail and mml and c.needed is None:
            c.needed = c.avail * mml / c.v0_tokens
        return mm.round_down_to_block(c.v0_tokens, bs)
    if c.estimate:
        c.arith.append(f"KV needed {c.needed} GiB > available {c.avail} GiB for {mm.fmt_tokens(mml or 0)} tokens; "
                       f"vLLM's estimate: {mm.fmt_tokens(int(c.estimate))} tokens fit")
        return mm.round_down_to_block(c.estimate, bs)
    if c.avail is not None and c.avail > 0 and c.per_token:
        tokens = int(c.avail * GIB // c.per_token.bytes)
        head = f"KV needed {c.needed} GiB > available {c.avail} GiB; " if c.needed else ""
        c.arith += [c.per_token.formula, f"{head}{c.avail} GiB / {mm.fmt_bytes(c.per_token.bytes)} per token = "
                                         f"{mm.fmt_tokens(tokens)} tokens fit"]
        return mm.round_down_to_block(tokens, bs)
    if c.avail is not None and c.avail > 0 and c.needed and mml:
        per_tok = c.needed * GIB / mml
        tokens = int(mml * c.avail / c.needed)
        c.arith.append(f"KV needed {c.needed} GiB for {mm.fmt_tokens(mml)} tokens = {mm.fmt_bytes(per_tok)} per "
                       f"token; {c.avail} GiB / {mm.fmt_bytes(per_tok)} = {mm.fmt_tokens(tokens)} tokens fit")
        return mm.round_down_to_block(tokens, bs)
    return None


def _fit(c: KVCase) -> int | None:
    """The context to propose: below what fits by the headroom of mm.len_with_headroom, in whole blocks
    (None: no figure, or not shorter than max_model_len)."""
    c.capacity = _capacity(c)
    if c.capacity is None:
        return None
    fit = mm.len_with_headroom(c.capacity, c.block)
    if (c.mml and fit >= c.mml) or fit < c.block:
        return None
    c.arith.append(f"--max-model-len {fit}: {c.capacity - fit} tokens of headroom below the "
                   f"{mm.fmt_tokens(c.capacity)} that fit (at least {mm.HEADROOM:.0%}, whole blocks of {c.block})")
    return fit


def _aim(c: KVCase) -> None:
    """No figure for the need: aim for one request of max_model_len (or 4096 tokens) of KV cache."""
    want = c.mml if c.mml and c.mml > 0 else 4096
    if c.per_token:
        c.needed = round(mm.kv_bytes_needed(want, c.per_token.bytes, c.block) / GIB, 2)
        c.arith.append(f"one request of {mm.fmt_tokens(want)} tokens needs {c.needed} GiB of KV cache "
                       f"({c.per_token.formula})")
    else:
        c.needed = round(max(1.0, 0.05 * c.total), 2)
        c.arith.append(f"model size unknown: aim for {c.needed} GiB of KV cache (5 % of {c.total:.2f} GiB)")
    if c.avail is None:
        c.avail = 0.0


def _raise_util(c: KVCase, cap: float | None, fit: int | None) -> tuple[float, bool] | None:
    """(new utilization, capped by free memory) that gives the KV cache what it needs, if any helps."""
    if not (c.total and c.needed is not None and c.avail is not None):
        return None
    u, limit = c.util, cap if cap is not None else 0.95
    if u >= limit - 1e-9:
        if cap is not None:
            c.notes.append(f"--gpu-memory-utilization {fmt_u(u)} is already at what is free "
                           f"({fmt_u(cap)} of the total); raising it would fail the start-up check")
        return None
    new_u, capped = mm.utilization_for_need(u, c.needed, c.avail, c.total, cap=limit)
    if new_u <= u:
        return None
    gained = mm.kv_gib_at_utilization(u, c.avail, new_u, c.total)
    c.arith.append(f"--gpu-memory-utilization {fmt_u(u)} -> {fmt_u(new_u)}: KV {c.avail} GiB + "
                   f"({fmt_u(new_u)} - {fmt_u(u)}) x {c.total:.2f} GiB = {gained:.2f} GiB"
                   + (f" (capped by free memory: {fmt_u(limit)})" if capped else f" >= {c.needed} GiB"))
    if not capped or fit is None or new_u - u >= 0.02:
        return new_u, capped
    return None


def _alternatives(ctx: RemedyContext, c: KVCase, fit: int | None, util_alt: tuple[float, bool] | None,
                  plan: tuple[int, str, list[str]] | None) -> dict[str, Alternative]:
    alts: dict[str, Alternative | None] = {}
    if c.explicit and c.explicit[0] == KV_BYTES:
        alts["kvbytes"] = Alternative(
            f"Drop --kv-cache-memory-bytes {ctx.arg('kv_cache_memory_bytes')} and let vLLM size the KV cache "
            f"from --gpu-memory-utilization", [RemoveFlag("--kv-cache-memory-bytes")],
            "the KV cache takes the memory --gpu-memory-utilization allows")
    if c.explicit:
        alts["kvset"] = resize_kv(c, c.explicit[0])
    if fit is not None:
        alts["mml"] = Alternative(f"Shorten the context: --max-model-len {fit}", [SetFlag(MML, str(fit))],
                                  f"requests longer than {mm.fmt_tokens(fit)} tokens are rejected")
    if util_alt and not c.explicit:     # a fixed KV size makes vLLM ignore the utilization for the cache
        alts["util"] = _more_util(c, *util_alt)
    if ctx.arg("kv_cache_dtype") in (None, "", "auto"):
        alts["fp8kv"] = _fp8_kv(ctx, c)
    if plan and not cpu_backend(ctx):
        alts["tp"] = _more_gpus(ctx, c, plan)
    if not c.explicit and error_names_cpu_kv_space(ctx):
        alts["cpuspace"] = Alternative(f"Give the KV cache more RAM: {CPU_KV_SPACE}=8 (GiB)",
                                       [SetEnv(CPU_KV_SPACE, "8")], "8 GiB of RAM held for the KV cache")
    return {key: alt for key, alt in alts.items() if alt is not None}


def _more_util(c: KVCase, new_u: float, capped: bool) -> Alternative | None:
    alt = Alternative(f"Give vLLM more of the GPU: --gpu-memory-utilization {fmt_u(new_u)}"
                      + (" (all that is free)" if capped else ""), [SetFlag(UTIL, fmt_u(new_u))],
                      "less memory left for other processes and CUDA graphs")
    gained = mm.kv_gib_at_utilization(c.util, c.avail, new_u, c.total)
    return complete(c, alt, tokens_with(c, gained), f"at --gpu-memory-utilization {fmt_u(new_u)}")


def _fp8_kv(ctx: RemedyContext, c: KVCase) -> Alternative | None:
    cc = compute_capability(ctx)
    extra = "" if cc is None or cc >= (8, 9) else " (your GPU has no native fp8: slower dequantization)"
    alt = Alternative(f"Halve the KV bytes per token: --kv-cache-dtype fp8{extra}",
                      [SetFlag("--kv-cache-dtype", "fp8")], "small accuracy loss")
    tokens = 0 if c.no_room else tokens_with(c, None, 2.0)     # half the bytes of no budget is still none
    return complete(c, alt, tokens, "with an fp8 KV cache (half the bytes per token)")


def _weights_whole(ctx: RemedyContext) -> float | None:
    """The whole model's weights in GiB: as sized from the model, else the log's per-GPU figure x tp x pp."""
    per_gpu, (tp, pp) = ctx.fact_float("log.weights_gib"), layout(ctx)
    return weights_total_gib(ctx) or (per_gpu * tp * pp if per_gpu else None)


def _fp8_weights(ctx: RemedyContext, c: KVCase, weights_per_gpu: float | None) -> Alternative | None:
    """The weights fill the GPU: fp8 weights (half the bytes) give the KV cache the other half."""
    if weights_per_gpu is None:
        tp, pp = layout(ctx)
        whole = _weights_whole(ctx)
        weights_per_gpu = whole / (tp * pp) if whole else None
    alt = fp8_weights(ctx, weights_per_gpu)
    if alt is None or weights_per_gpu is None:
        return alt
    room = (c.avail or 0.0) + weights_per_gpu / 2
    return complete(c, alt, tokens_with(c, room), f"with fp8 weights ({weights_per_gpu / 2:.2f} GiB more KV cache)")


def _more_gpus(ctx: RemedyContext, c: KVCase, plan: tuple[int, str, list[str]]) -> Alternative | None:
    """More GPUs: each holds a 1/t share of the KV heads (fewer bytes per token) and of the weights (more room)."""
    t, cost, lines = plan
    c.arith.extend(lines)
    tp, pp = layout(ctx)
    factor = tp_factor(ctx, tp, t)
    weights = _weights_whole(ctx)
    freed = weights / (tp * pp) - weights / (t * pp) if weights else 0.0
    if c.explicit:
        tokens = tokens_with(c, None, factor)      # a fixed KV size per GPU: only the bytes per token shrink
    elif freed and c.avail is not None:
        tokens = tokens_with(c, c.avail + freed, factor)
    elif c.avail is None or c.avail > 0:
        tokens = tokens_with(c, None, factor)      # the room the weights free is unknown: a lower bound
    else:
        tokens = None                              # no KV room now, and how much the split frees is unknown
    alt = Alternative(f"Spread the model over {t} GPUs: --tensor-parallel-size {t}", [SetFlag(TP, str(t))], cost)
    return complete(c, alt, tokens, f"over {t} GPUs (KV per token / {factor:g}"
                    + (f", {freed:.2f} GiB of weights less per GPU)" if freed else ")"))


def _order(ctx: RemedyContext, c: KVCase, util_alt, weights: float | None, weights_fill: bool) -> list[str]:
    """Which knob first: the user's own before the rest (a fixed KV size, an explicit context that does not
    fit, a utilization lowered below the default), more GPUs when the weights leave no room."""
    budget = c.total * c.util if c.total else None
    if c.explicit and c.explicit[0] == KV_BYTES:
        # an explicit KV size makes vLLM ignore --gpu-memory-utilization: raising it would change nothing
        return ["kvbytes", "kvset", "mml", "fp8kv", "tp"]
    if weights_fill:
        if weights is not None and budget is not None:
            c.arith.append(f"weights {weights:.2f} GiB of the {budget:.2f} GiB budget "
                           f"({c.total:.2f} GiB x {fmt_u(c.util)}): almost nothing is left for the KV cache")
        return ["tp", "util", "fp8w", "kvset", "fp8kv", "mml"]
    if parse_len(ctx.arg("max_model_len")):
        return ["mml", "util", "kvset", "fp8kv", "tp"]      # the length the user asked for does not fit: lower it
    if c.user_util and c.util < c.default_util - 1e-9 and util_alt and not util_alt[1]:
        c.notes.append(f"--gpu-memory-utilization {fmt_u(c.util)} is below the default {fmt_u(c.default_util)}: "
                       f"a lower value shrinks the KV cache, it does not free memory for it")
        return ["util", "mml", "fp8kv", "tp"]
    return ["mml", "util", "kvset", "fp8kv", "tp"]


def fix_kv_cache(ctx: RemedyContext) -> Fix | None:
    """kv-cache-insufficient: the largest --max-model-len that fits, or the utilization that makes room."""
    c = _case(ctx)
    fit = _fit(c)
    cap = free_cap(ctx, c.total)
    if c.needed is None and c.total and (fit is None or c.no_room):
        _aim(c)
    util_alt = _raise_util(c, cap, fit)
    weights = ctx.fact_float("log.weights_gib")
    budget = c.total * c.util if c.total else None
    weights_fill = (c.avail is not None and c.avail <= 0) or c.no_room or (
        weights is not None and budget is not None and weights >= 0.85 * budget)
    tp, pp = layout(ctx)
    count = gpu_count(ctx)
    plan = None
    if count is None or count > tp * pp:
        plan = tp_plan(ctx, _weights_whole(ctx), 0.6 * c.total * c.util if c.total else None)
    alts = _alternatives(ctx, c, fit, util_alt, plan)
    if weights_fill and not cpu_backend(ctx) and (half := _fp8_weights(ctx, c, weights)) is not None:
        alts["fp8w"] = half
    ranked = [alts[key] for key in ["cpuspace"] + _order(ctx, c, util_alt, weights, weights_fill) if key in alts]
    if not ranked:
        return None
    primary, rest = ranked[0], ranked[1:]
    if not ctx.arg("max_model_len") and c.mml and c.mml >= 32768:
        c.notes.append(f"max_model_len {mm.fmt_tokens(c.mml)} was not set by you: vLLM took it from the model's "
                       f"config.json")
    if weights_fill and primary is alts.get("mml"):
        c.notes.append("the weights leave little KV memory; a short context is the only fix on this GPU")
    summary = primary.summary + (f" (cost: {primary.cost})" if rest and primary.cost else "")
    used: dict[str, Any] = {"max_model_len": c.mml, "gpu_memory_utilization": c.util, "block_size": c.block,
                            "kv_bytes_per_token": c.per_token.bytes if c.per_token else None,
                            "weight_bytes": sizing(ctx).weights().bytes, "needed_gib": c.needed,
                            "available_gib": c.avail, "total_gib": c.total, "free_cap": cap}
    return Fix(summary=summary, edits=primary.edits, alternatives=rest, arithmetic=c.arith,
               facts_used=present(used), notes=c.notes)
