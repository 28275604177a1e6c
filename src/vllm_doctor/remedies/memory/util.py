"""gpu-memory-utilization-too-high: at most free/total, or free the GPU other processes hold; also the CPU
backend's KV space, a utilization above 1, and free memory that changed while vLLM profiled."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm

from .common import GIB, UTIL, Process, fmt_u, free_cap, free_gpu_text, idle_gpu, layout, other_processes, \
    significant, total_gib, utilization, weights_total_gib


@dataclass
class _Case:
    free: float | None
    total: float | None
    util: float
    requested: float | None
    node: str | None                         # the CPU backend names the node whose RAM is short
    procs: list[Process]
    weights: float | None                    # per GPU
    used: dict[str, Any]
    arith: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fix(self, summary: str, edits: list, alts: list[Alternative]) -> Fix:
        return Fix(summary, edits, alts, self.arith, self.used, self.notes)


# below a tenth of the GPU there is no room for the weights and a KV cache worth serving with: free the GPU
MIN_USEFUL_UTIL = 0.1


def _case(ctx: RemedyContext) -> _Case:
    free, total = ctx.capture_float("free_gib"), ctx.capture_float("total_gib") or total_gib(ctx)
    u, _ = utilization(ctx)
    requested, node = ctx.capture_float("requested_gib"), ctx.capture("node") or None
    weights = ctx.fact_float("log.weights_gib")
    if weights is None:
        whole = weights_total_gib(ctx)
        tp, pp = layout(ctx)
        weights = whole / (tp * pp) if whole else None
    used = {"free_gib": free, "total_gib": total, "gpu_memory_utilization": u, "requested_gib": requested}
    return _Case(free, total, u, requested, node, [] if node is not None else other_processes(ctx), weights, used)


def _external(c: _Case, external: float) -> Fix:
    """Weights held outside the engine (external_gib): raise the share so it covers them."""
    new_u = min(0.95, mm.ceil_to(external / c.total + 0.1))
    c.arith.append(f"external weights {external} GiB / total {c.total} GiB = {external / c.total:.3f}; "
                   f"+0.10 for activations and KV cache -> {fmt_u(new_u)}")
    return c.fix(f"Raise --gpu-memory-utilization to {fmt_u(new_u)} so the engine's share covers the "
                 f"externally held weights", [SetFlag(UTIL, fmt_u(new_u))], [])


def _cpu_kv_space(ctx: RemedyContext, c: _Case, kv_space: float) -> Fix:
    """CPU backend: an explicit KV-cache size (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes) above free RAM."""
    new_kv = max(1, int(c.free * 0.5))
    c.arith.append(f"requested KV cache {kv_space} GiB > {c.free} GiB free on node {c.node}; "
                   f"half of the free RAM, rounded down -> {new_kv} GiB (the rest is for weights and activations)")
    if ctx.flag("--kv-cache-memory-bytes") not in (None, False):
        edits, what = [SetFlag("--kv-cache-memory-bytes", f"{new_kv}G")], f"--kv-cache-memory-bytes {new_kv}G"
    else:
        edits, what = [SetEnv("VLLM_CPU_KVCACHE_SPACE", str(new_kv))], f"VLLM_CPU_KVCACHE_SPACE={new_kv}"
    return c.fix(f"Ask for less KV cache than the free RAM: {what}", edits, [])


def _at_most_free(ctx: RemedyContext, c: _Case) -> Fix:
    """The start-up check failed: the largest utilization the free memory allows, or free the GPU."""
    free, total, u = c.free, c.total, c.util
    cap = mm.max_safe_utilization(free, total)
    c.arith.append(f"free {free} GiB / total {total} GiB = {free / total:.3f}; vLLM wants {fmt_u(u)} x "
                   f"{total} = {c.requested if c.requested is not None else round(u * total, 2)} GiB")
    c.arith.append(f"largest accepted utilization, 0.01 below free/total: {fmt_u(cap)}")
    held = total - free
    if c.node is not None:
        c.arith.append(f"{held:.2f} GiB of RAM is used by other processes on node {c.node}")
    fits_weights = c.weights is None or cap * total >= c.weights * 1.15 + 1.0
    if c.weights is not None:
        c.arith.append(f"weights {c.weights:.2f} GiB per GPU; {fmt_u(cap)} x {total} = {cap * total:.2f} GiB "
                       + ("leaves room for activations and KV cache" if fits_weights else "is not enough for them"))
    lower = Alternative(f"Lower --gpu-memory-utilization to {fmt_u(cap)} (what is free)", [SetFlag(UTIL, fmt_u(cap))],
                        f"{(u - cap) * total:.2f} GiB less KV cache (fewer concurrent requests / shorter context)")
    idle = idle_gpu(ctx, c.requested)
    alts = [idle] if idle else []
    if c.procs and significant(c.procs, total) and (not fits_weights or cap < 0.3):
        return c.fix(f"Another process holds the memory: {free_gpu_text(ctx, c.procs)}; then the same "
                     f"--gpu-memory-utilization {fmt_u(u)} works", [], alts + ([lower] if cap >= MIN_USEFUL_UTIL else []))
    if cap < MIN_USEFUL_UTIL:
        return c.fix(f"Only {free} GiB of {total} GiB is free: free the GPU (another process holds "
                     f"{held:.2f} GiB); no --gpu-memory-utilization value can work", [], alts)
    summary = f"Set --gpu-memory-utilization {fmt_u(cap)} (at most free/total = {free}/{total})"
    if c.node is not None:
        summary += " - on the CPU backend it is the share of the node's RAM"
    if c.procs:
        summary += f", or {free_gpu_text(ctx, c.procs)}"
        alts.insert(0, Alternative(f"Keep --gpu-memory-utilization {fmt_u(u)} and {free_gpu_text(ctx, c.procs)}",
                                   [], "you must stop the other process"))
    if not fits_weights:
        c.notes.append("the weights barely fit in that share; expect kv-cache-insufficient next")
    return c.fix(summary, [SetFlag(UTIL, fmt_u(cap))], alts)


def _out_of_range(ctx: RemedyContext, c: _Case, util_bad: float) -> Fix:
    default_u = mm.default_utilization(ctx.version)
    cap = free_cap(ctx, c.total)
    new_u = default_u if cap is None else min(default_u, cap)
    c.arith.append(f"--gpu-memory-utilization is a fraction of total memory in (0, 1]; {util_bad} is out of "
                   f"range -> {fmt_u(new_u)} (vLLM's default {fmt_u(default_u)})")
    bound = "at most 1" if util_bad > 0 else "above 0"
    return c.fix(f"Set --gpu-memory-utilization {fmt_u(new_u)} (it is a fraction, {bound})",
                 [SetFlag(UTIL, fmt_u(new_u))], [])


def _profiling_changed(ctx: RemedyContext, c: _Case) -> Fix:
    """"Error in memory profiling": free memory changed under vLLM while it profiled."""
    init_free, cur_free = ctx.capture_float("initial_free"), ctx.capture_float("current_free")
    if init_free is not None and cur_free is not None:
        scale = GIB if init_free > 1 << 20 else 1
        c.arith.append(f"free memory went from {init_free / scale:.2f} GiB to {cur_free / scale:.2f} GiB during "
                       f"profiling: another process released memory")
    idle = idle_gpu(ctx, None)
    summary = "Run vLLM alone on its GPU: another process allocated or released GPU memory while vLLM profiled"
    if c.procs:
        summary += f" ({free_gpu_text(ctx, c.procs)})"
    new_u = mm.floor_to(c.util - 0.05)
    alts = ([idle] if idle else []) + [Alternative(
        f"Leave headroom for the other process: --gpu-memory-utilization {fmt_u(new_u)}",
        [SetFlag(UTIL, fmt_u(new_u))], "a smaller KV cache")]
    return c.fix(summary, [], alts)


def fix_gpu_util(ctx: RemedyContext) -> Fix | None:
    """gpu-memory-utilization-too-high: at most free/total, or free the GPU held by other processes."""
    c = _case(ctx)
    external, kv_space, util_bad = (ctx.capture_float(n) for n in ("external_gib", "kv_space_gib", "util"))
    if external is not None and c.total:
        return _external(c, external)
    if kv_space is not None and c.free is not None:
        return _cpu_kv_space(ctx, c, kv_space)
    if c.free is not None and c.total:
        return _at_most_free(ctx, c)
    if util_bad is not None and (util_bad >= 1.0 or util_bad <= 0):
        return _out_of_range(ctx, c, util_bad)
    return _profiling_changed(ctx, c)
