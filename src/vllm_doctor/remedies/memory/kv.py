"""kv-cache-insufficient: the largest --max-model-len that fits, or the utilization that makes room, an fp8
KV cache, more GPUs; the figures of the log first (vLLM's own estimate, its token capacity, the GiB needed
and available), then the model's KV bytes per token."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.command.edits import RemoveFlag, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import KVPerToken, parse_len

from .common import GIB, MML, TP, UTIL, compute_capability, fmt_u, free_cap, gpu_count, layout, present, sizing, \
    total_gib, tp_plan, utilization, weights_total_gib


@dataclass
class _Case:
    """The numbers of one kv-cache-insufficient report, and the lines that explain them."""
    mml: int | None
    block: int
    util: float
    user_util: bool
    default_util: float
    total: float | None
    needed: float | None
    avail: float | None
    estimate: float | None
    v0_tokens: float | None
    per_token: KVPerToken | None
    no_room: bool
    arith: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _case(ctx: RemedyContext) -> _Case:
    mml = ctx.capture_float("max_model_len") or parse_len(ctx.arg("max_model_len")) or ctx.fact_float("log.max_model_len")
    avail = ctx.capture_float("available_gib")
    u, user_set = utilization(ctx)
    return _Case(mml=int(mml) if mml else None, block=ctx.arg_int("block_size") or mm.DEFAULT_BLOCK, util=u,
                 user_util=user_set, default_util=mm.default_utilization(ctx.version), total=total_gib(ctx),
                 needed=ctx.capture_float("needed_gib"),
                 avail=avail if avail is not None else ctx.fact_float("log.kv_cache_gib"),
                 estimate=ctx.capture_float("estimated_max_len"), v0_tokens=ctx.capture_float("kv_cache_tokens"),
                 per_token=sizing(ctx).kv_per_token(*layout(ctx)),
                 no_room=ctx.has_pattern("no-cache-blocks", "auto-fit"))


def _fit(c: _Case) -> int | None:
    """The longest context that fits, from the best figure the log gives (None: none, or not shorter)."""
    bs, mml, tokens = c.block, c.mml, None
    if c.v0_tokens:
        fit = mm.round_down_to_block(c.v0_tokens, bs)
        c.arith.append(f"KV cache holds {mm.fmt_tokens(int(c.v0_tokens))} tokens (GPU blocks x {bs}) < "
                       f"max_model_len {mm.fmt_tokens(mml or 0)} -> --max-model-len {fit}")
        if c.avail and mml and c.needed is None:
            c.needed = c.avail * mml / c.v0_tokens
    elif c.estimate:
        fit = mm.round_down_to_block(c.estimate, bs)
        c.arith.append(f"KV needed {c.needed} GiB > available {c.avail} GiB for {mm.fmt_tokens(mml or 0)} tokens; "
                       f"vLLM's estimate {mm.fmt_tokens(int(c.estimate))} tokens, rounded down to a block of {bs} "
                       f"-> --max-model-len {fit}")
    elif c.avail is not None and c.avail > 0 and c.per_token:
        tokens = int(c.avail * GIB // c.per_token.bytes)
        fit = mm.round_down_to_block(tokens, bs)
        head = f"KV needed {c.needed} GiB > available {c.avail} GiB; " if c.needed else ""
        c.arith += [c.per_token.formula, f"{head}{c.avail} GiB / {mm.fmt_bytes(c.per_token.bytes)} per token = "
                                         f"{mm.fmt_tokens(tokens)} tokens -> --max-model-len {fit}"]
    elif c.avail is not None and c.avail > 0 and c.needed and mml:
        per_tok = c.needed * GIB / mml
        tokens = int(mml * c.avail / c.needed)
        fit = mm.round_down_to_block(tokens, bs)
        c.arith.append(f"KV needed {c.needed} GiB for {mm.fmt_tokens(mml)} tokens = {mm.fmt_bytes(per_tok)} per "
                       f"token; {c.avail} GiB / {mm.fmt_bytes(per_tok)} = {mm.fmt_tokens(tokens)} tokens -> "
                       f"--max-model-len {fit}")
    else:
        return None
    return None if (mml and fit >= mml) or fit < bs else fit


def _aim(c: _Case) -> None:
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


def _raise_util(c: _Case, cap: float | None, fit: int | None) -> tuple[float, bool] | None:
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


def _alternatives(ctx: RemedyContext, c: _Case, fit: int | None, util_alt: tuple[float, bool] | None,
                  plan: tuple[int, str, list[str]] | None) -> dict[str, Alternative]:
    alts: dict[str, Alternative] = {}
    if ctx.arg("kv_cache_memory_bytes"):
        alts["kvbytes"] = Alternative(
            f"Drop --kv-cache-memory-bytes {ctx.arg('kv_cache_memory_bytes')} and let vLLM size the KV cache "
            f"from --gpu-memory-utilization", [RemoveFlag("--kv-cache-memory-bytes")],
            "the KV cache takes the memory --gpu-memory-utilization allows")
    if fit is not None:
        alts["mml"] = Alternative(f"Shorten the context: --max-model-len {fit}", [SetFlag(MML, str(fit))],
                                  f"requests longer than {mm.fmt_tokens(fit)} tokens are rejected")
    if util_alt:
        new_u, capped = util_alt
        alts["util"] = Alternative(
            f"Give vLLM more of the GPU: --gpu-memory-utilization {fmt_u(new_u)}"
            + (" (all that is free; not the whole need - combine with a shorter context)" if capped else ""),
            [SetFlag(UTIL, fmt_u(new_u))], "less memory left for other processes and CUDA graphs")
    if ctx.arg("kv_cache_dtype") in (None, "", "auto"):
        cc = compute_capability(ctx)
        extra = "" if cc is None or cc >= (8, 9) else " (your GPU has no native fp8: slower dequantization)"
        doubled = (f"; about {mm.fmt_tokens(mm.round_down_to_block((fit or 0) * 2, c.block))} tokens fit"
                   if fit else "")
        alts["fp8kv"] = Alternative(f"Halve the KV bytes per token: --kv-cache-dtype fp8{extra}",
                                    [SetFlag("--kv-cache-dtype", "fp8")], f"small accuracy loss{doubled}")
    if plan:
        t, cost, lines = plan
        c.arith.extend(lines)
        alts["tp"] = Alternative(f"Spread the model over {t} GPUs: --tensor-parallel-size {t}",
                                 [SetFlag(TP, str(t))], cost)
    return alts


def _order(ctx: RemedyContext, c: _Case, util_alt, weights: float | None, weights_fill: bool) -> list[str]:
    budget = c.total * c.util if c.total else None
    if ctx.arg("kv_cache_memory_bytes"):
        # an explicit KV size makes vLLM ignore --gpu-memory-utilization: raising it would change nothing
        return ["kvbytes", "mml", "fp8kv", "tp"]
    if weights_fill:
        if weights is not None and budget is not None:
            c.arith.append(f"weights {weights:.2f} GiB of the {budget:.2f} GiB budget "
                           f"({c.total:.2f} GiB x {fmt_u(c.util)}): almost nothing is left for the KV cache")
        return ["tp", "util", "fp8kv", "mml"]
    if c.user_util and c.util < c.default_util - 1e-9 and util_alt and not util_alt[1]:
        c.notes.append(f"--gpu-memory-utilization {fmt_u(c.util)} is below the default {fmt_u(c.default_util)}: "
                       f"a lower value shrinks the KV cache, it does not free memory for it")
        return ["util", "mml", "fp8kv", "tp"]
    return ["mml", "util", "fp8kv", "tp"]


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
        plan = tp_plan(ctx, weights_total_gib(ctx) or (weights * tp if weights else None),
                       0.6 * c.total * c.util if c.total else None)
    alts = _alternatives(ctx, c, fit, util_alt, plan)
    ranked = [alts[key] for key in _order(ctx, c, util_alt, weights, weights_fill) if key in alts]
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
