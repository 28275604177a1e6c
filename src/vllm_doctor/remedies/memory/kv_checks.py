"""kv-cache-insufficient: every alternative re-checked against the finding's own arithmetic before it is shown.

An alternative is offered as a whole fix: an fp8 KV cache, more of the GPU or more GPUs that make room for
the context asked for stand alone; one that makes room for less comes with the --max-model-len that then
fits (with the same headroom as the shorter-context fix); one that makes no room at all is not offered.
Where the log gives no figure to check against, the alternative stays as it is, except under a KV-cache
size the user fixed (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE), which the error has already shown
to be too small: there only what is shown to fit is offered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.findings import Alternative
from vllm_doctor.numbers import as_float
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import KVPerToken

from .common import GIB, MML

KV_BYTES = "--kv-cache-memory-bytes"
CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
CPU_ENV = (CPU_KV_SPACE, "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_SIM_MULTI_NUMA")


@dataclass
class KVCase:
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
    explicit: tuple[str, float | None] | None = None   # a KV-cache size the user fixed (kv_checks.explicit_kv)
    capacity: int | None = None              # tokens the KV cache holds now (whole blocks)
    arith: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def cpu_backend(ctx: RemedyContext) -> bool:
    """vLLM runs on its CPU backend (the log's platform, or the CPU-only variables the launch sets): no GPU
    to spread the model over."""
    platform = str(ctx.fact("log.platform") or "").lower()
    return platform == "cpu" or any(ctx.env(name) for name in CPU_ENV) or error_names_cpu_kv_space(ctx)


def error_names_cpu_kv_space(ctx: RemedyContext) -> bool:
    """The CPU worker's error says to raise VLLM_CPU_KVCACHE_SPACE (up to 0.11: its KV cache is sized from it
    alone, 4 GiB when unset; from 0.30 the cache is sized from --gpu-memory-utilization and the error says so)."""
    return any(f"`{CPU_KV_SPACE}`" in line for line in ctx.lines) or ctx.has_pattern("cpu-reserve-used-up")


def explicit_kv(ctx: RemedyContext) -> tuple[str, float | None] | None:
    """A KV-cache size the user fixed, (where, GiB): --kv-cache-memory-bytes (it overrides
    --gpu-memory-utilization) or, on the CPU backend, VLLM_CPU_KVCACHE_SPACE."""
    size = ctx.arg("kv_cache_memory_bytes")
    if size:
        return KV_BYTES, mm.to_gib(size)
    space = ctx.env(CPU_KV_SPACE)
    if space:
        return CPU_KV_SPACE, as_float(space)          # None: `nan`, words, more digits than any size
    return None


def _per_token_gib(c: KVCase) -> float | None:
    """GiB one token costs per GPU now: the log's capacity first, then the model's bytes, then need/length."""
    if c.capacity and c.avail and c.avail > 0:
        return c.avail / c.capacity
    if c.per_token:
        return c.per_token.bytes / GIB
    if c.needed and c.mml:
        return c.needed / c.mml
    return None


def tokens_with(c: KVCase, kv_gib: float | None = None, factor: float = 1.0) -> int | None:
    """Tokens that fit in `kv_gib` of KV cache (None: what is available now) once a token costs `factor`
    times less; None when the log and the model give no figure to tell."""
    if kv_gib is None:
        if c.capacity:
            return mm.round_down_to_block(c.capacity * factor, c.block)
        kv_gib = c.avail
    if kv_gib is None:
        return None
    if kv_gib <= 0:
        return 0
    per = _per_token_gib(c)
    return None if per is None else mm.round_down_to_block(kv_gib / per * factor, c.block)


def complete(c: KVCase, alt: Alternative, tokens: int | None, what: str) -> Alternative | None:
    """`alt` as a whole fix that makes room for `tokens`: alone when max_model_len fits in that, with a
    --max-model-len below it (the headroom of the shorter-context fix) otherwise, None when it makes room for
    no request at all (or, under a KV size the user fixed, when no figure shows that it makes room)."""
    if tokens is None:
        return None if c.explicit else alt
    if tokens < c.block:
        c.notes.append(f"the fix {what} is not offered: it leaves no room for the KV cache")
        return None
    if not c.mml:
        return alt
    if tokens >= c.mml:
        c.arith.append(f"{what}: about {mm.fmt_tokens(tokens)} tokens fit >= max_model_len {mm.fmt_tokens(c.mml)}")
        return replace(alt, cost=f"{alt.cost}; about {mm.fmt_tokens(tokens)} tokens fit")
    fit = mm.len_with_headroom(tokens, c.block)
    if fit < c.block:
        c.notes.append(f"the fix {what} is not offered: room for {mm.fmt_tokens(tokens)} tokens, too few for headroom")
        return None
    c.arith.append(f"{what}: about {mm.fmt_tokens(tokens)} tokens fit, short of max_model_len {mm.fmt_tokens(c.mml)} "
                   f"-> with --max-model-len {fit} ({tokens - fit} tokens of headroom)")
    return replace(alt, summary=f"{alt.summary} with --max-model-len {fit}",
                   edits=[*alt.edits, SetFlag(MML, str(fit))],
                   cost=f"{alt.cost}; requests longer than {mm.fmt_tokens(fit)} tokens are rejected")


def tp_factor(ctx: RemedyContext, tp: int, t: int) -> float:
    """How many times less KV one token costs per GPU at tensor-parallel size `t` than at `tp`: KV heads are
    split (once t > K each rank keeps one whole head), an MLA latent is not."""
    shape = ctx.shape
    if shape.use_mla:
        return 1.0
    k = shape.kv_heads
    if not k:
        return t / tp                       # KV heads unknown: assumed to split
    return mm.kv_heads_per_gpu(k, tp) / mm.kv_heads_per_gpu(k, t)


def resize_kv(c: KVCase, where: str) -> Alternative | None:
    """Set the user's fixed KV-cache size to what the request needs, with 5 % headroom."""
    if not c.needed:
        return None
    gib = max(1, math.ceil(c.needed * (1 + mm.HEADROOM)))
    c.arith.append(f"KV needed {c.needed} GiB + {mm.HEADROOM:.0%} headroom -> {gib} GiB")
    if where == KV_BYTES:
        return Alternative(f"Give the KV cache what it needs: {KV_BYTES} {gib * GIB} ({gib} GiB)",
                           [SetFlag(KV_BYTES, str(gib * GIB))],
                           f"{gib} GiB of GPU memory for the KV cache whatever --gpu-memory-utilization says: "
                           f"check it is free")
    return Alternative(f"Give the KV cache what it needs: {CPU_KV_SPACE}={gib}", [SetEnv(CPU_KV_SPACE, str(gib))],
                       f"{gib} GiB of the node's RAM for the KV cache: check it is free")
