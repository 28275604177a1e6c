"""Remedies for the memory family: CUDA OOM (load / runtime), KV cache, utilization, max-model-len.

One function per rule (``fix_*``); the OOM phase comes from the refine hook (refine/oom_phase.py). Every number a fix proposes
is derived from the figures in the log (captures and ``log.*`` facts) first, then from the model config
(``model.*``), the GPUs (``gpu.*``) and the user's arguments (``args.*``); the arithmetic is returned as
lines a person can check by hand. The math itself lives in :mod:`vllm_doctor.vllm_math.memory`.
"""
from __future__ import annotations

import math
import re
from typing import Any

from vllm_doctor.events.phases import PHASE_FACT, PHASE_NAMES, classify_frames, classify_milestones
from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.remedies.base import Alternative, Fix, RemedyContext
from vllm_doctor.facts import gpus
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.numbers import as_float as _num
from vllm_doctor.vllm_math.parallel import valid_tp_sizes
from vllm_doctor.vllm_math.sizing import KVPerToken, LoadArgs, Sizing, parse_len

GIB = mm.GIB
UTIL = "--gpu-memory-utilization"
MML = "--max-model-len"
TP = "--tensor-parallel-size"
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_VALUE = "expandable_segments:True"

_PROC_RE = re.compile(r"Process (\d+) has (\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB|TiB)) memory in use")


# --------------------------------------------------------------------------- small helpers


def _fact(ctx: RemedyContext, *keys: str) -> Any:
    for key in keys:
        try:
            value = ctx.facts.get(key)
        except Exception:  # noqa: BLE001 - a facts object without a key
            value = None
        if value is not None:
            return value
    return None


def _fact_num(ctx: RemedyContext, *keys: str) -> float | None:
    return _num(_fact(ctx, *keys))


def _cap(ctx: RemedyContext, name: str) -> str | None:
    value = (ctx.captures or {}).get(name)
    return value if value not in (None, "") else None


def _cap_num(ctx: RemedyContext, name: str) -> float | None:
    return _num(_cap(ctx, name))


def _cap_gib(ctx: RemedyContext, name: str) -> float | None:
    return mm.to_gib(_cap(ctx, name))


def _cmd_value(ctx: RemedyContext, flag: str) -> Any:
    cmd = ctx.command
    if cmd is None:
        return None
    try:
        return cmd.get(flag)
    except Exception:  # noqa: BLE001
        return None


def _arg(ctx: RemedyContext, name: str) -> Any:
    """A user argument: the launch command first, then args.<name> facts."""
    value = _cmd_value(ctx, "--" + name.replace("_", "-"))
    if value is None or value is True:
        fact = _fact(ctx, "args." + name)
        if fact is not None:
            value = fact
    if isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
        return None
    return value


def _arg_num(ctx: RemedyContext, name: str) -> float | None:
    return _num(_arg(ctx, name))


def _version(ctx: RemedyContext) -> str | None:
    v = _fact(ctx, "vllm.version")
    return str(v) if v else None


default_utilization = mm.default_utilization


def _util(ctx: RemedyContext) -> tuple[float, bool]:
    """(utilization in effect, whether the user set it)."""
    u = _cap_num(ctx, "util")
    if u is None:
        u = _arg_num(ctx, "gpu_memory_utilization")
    if u is not None:
        return u, True
    return default_utilization(_version(ctx)), False


def _tp(ctx: RemedyContext) -> int:
    return int(_arg_num(ctx, "tensor_parallel_size") or 1)


def _pp(ctx: RemedyContext) -> int:
    return int(_arg_num(ctx, "pipeline_parallel_size") or 1)


def _fmt_u(u: float) -> str:
    return f"{u:.2f}"


def _gpu_index(ctx: RemedyContext) -> int | None:
    g = _cap(ctx, "gpu")
    if g is None:
        dev = _cap(ctx, "device")
        if dev:
            m = re.search(r"(\d+)$", dev)
            g = m.group(1) if m else None
    return int(g) if g is not None and str(g).isdigit() else None


# --------------------------------------------------------------------------- GPU facts

def gpu_devices(ctx: RemedyContext) -> list[dict]:
    """gpu.devices normalised: index, name, total_gib, free_gib, cc, processes [(pid, gib, name)]."""
    return [{"index": int(d.get("index", i)), "name": d.get("name") or "", "total_gib": gpus.total_gib(d),
             "free_gib": gpus.free_gib(d), "cc": gpus.compute_capability(d), "processes": gpus.processes(d)}
            for i, d in enumerate(gpus.devices(ctx.facts))]


def _gpu_count(ctx: RemedyContext) -> int | None:
    n = _fact_num(ctx, "gpu.count")
    if n:
        return int(n)
    devs = gpu_devices(ctx)
    return len(devs) or None


def _device(ctx: RemedyContext) -> dict | None:
    devs = gpu_devices(ctx)
    if not devs:
        return None
    idx = _gpu_index(ctx)
    for d in devs:
        if idx is not None and d["index"] == idx:
            return d
    return devs[0]


def _compute_capability(ctx: RemedyContext) -> tuple[int, int] | None:
    d = _device(ctx)
    return d["cc"] if d else None


def _total_gib(ctx: RemedyContext) -> float | None:
    for name in ("total_gib",):
        v = _cap_num(ctx, name)
        if v:
            return v
    v = _cap_gib(ctx, "total")
    if v:
        return v
    v = _fact_num(ctx, "log.total_gpu_gib")
    if v:
        return v
    d = _device(ctx)
    return d["total_gib"] if d and d["total_gib"] else None


def other_processes(ctx: RemedyContext) -> list[tuple[int, float | None, str]]:
    """Processes other than vLLM holding memory on the failing GPU: from the OOM text, then NVML."""
    seen: dict[int, tuple[int, float | None, str]] = {}
    texts = []
    for m in ctx.matches or []:
        line = getattr(m, "line", None)
        texts.append(getattr(line, "message", None) or getattr(line, "raw", None) or str(getattr(m, "text", "")))
    if _cap(ctx, "other_pid") and _cap(ctx, "other_used"):
        texts.append(f"Process {_cap(ctx, 'other_pid')} has {_cap(ctx, 'other_used')} memory in use")
    own_pids = set()
    for m in ctx.matches or []:
        pid = getattr(getattr(m, "line", None), "pid", None)
        if pid is not None:
            own_pids.add(int(pid))
    for text in texts:
        for pid, size in _PROC_RE.findall(text or ""):
            pid_i = int(pid)
            if pid_i not in seen:
                seen[pid_i] = (pid_i, mm.to_gib(size), "")
    d = _device(ctx)
    if d:
        for pid, gib, name in d["processes"]:
            if pid in own_pids:
                continue
            if pid in seen:
                seen[pid] = (pid, seen[pid][1] if seen[pid][1] is not None else gib, name or seen[pid][2])
            else:
                seen[pid] = (pid, gib, name)
    return sorted(seen.values(), key=lambda p: -(p[1] or 0))


def _describe_procs(procs: list[tuple[int, float | None, str]]) -> str:
    parts = []
    for pid, gib, name in procs[:4]:
        label = f"PID {pid}" + (f" ({name})" if name else "")
        parts.append(label + (f" holds {gib:.2f} GiB" if gib is not None else ""))
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return ", ".join(parts) + more


# --------------------------------------------------------------------------- model facts

def _sizing(ctx: RemedyContext, kv_dtype: str | None = None) -> Sizing:
    """The model's shape and the launch arguments that change its sizes (vllm_math.sizing reads them)."""
    args = LoadArgs(_arg(ctx, "dtype"), kv_dtype if kv_dtype is not None else _arg(ctx, "kv_cache_dtype"),
                    _arg(ctx, "quantization"))
    return Sizing(ModelShape.from_facts(ctx.facts), args)


def bytes_per_token(ctx: RemedyContext, tp: int | None = None, pp: int | None = None,
                    kv_dtype: str | None = None) -> KVPerToken | None:
    """KV bytes per token per GPU from the model facts, with the formula written out."""
    return _sizing(ctx, kv_dtype).kv_per_token(tp or _tp(ctx), pp or _pp(ctx))


def _weights_total_gib(ctx: RemedyContext) -> float | None:
    """Weights of the whole model as vLLM loads them (checkpoint size, else estimated; quantized too)."""
    return _sizing(ctx).weights().gib


def _is_fp32(ctx: RemedyContext) -> bool:
    d = _arg(ctx, "dtype")
    return str(d).lower() in ("float", "float32", "torch.float32") if d else False


def _valid_tps(ctx: RemedyContext, max_tp: int) -> tuple[list[int], bool]:
    """Valid tensor-parallel sizes <= max_tp (via vllm_math.parallel) and whether the model was known."""
    shape = ModelShape.from_facts(ctx.facts)
    if not shape.known:
        return [t for t in (1, 2, 4, 8, 16) if t <= max_tp], False
    return valid_tp_sizes(shape.heads, max_tp=max_tp, **shape.tp_kwargs()), True


def _tp_plan(ctx: RemedyContext, weights_total: float | None, budget_per_gpu: float | None
             ) -> tuple[int, str, list[str]] | None:
    """The smallest valid --tensor-parallel-size above the current one whose weights fit (if known).

    Returns (tp, cost, arithmetic lines) or None. Limited to the GPUs present when their count is known.
    """
    tp, pp = _tp(ctx), _pp(ctx)
    count = _gpu_count(ctx)
    limit = (count // pp) if count else 8
    if limit <= tp:
        return None
    sizes, known = _valid_tps(ctx, limit)
    cands = [t for t in sizes if t > tp]
    if not cands:
        return None
    chosen = None
    lines = []
    for t in cands:
        if weights_total and budget_per_gpu:
            per = weights_total / (t * pp)
            if per <= budget_per_gpu:
                chosen = t
                lines.append(f"weights {weights_total:.2f} GiB / (tp {t} x pp {pp}) = {per:.2f} GiB per GPU "
                             f"<= {budget_per_gpu:.2f} GiB usable")
                break
        else:
            chosen = t
            break
    if chosen is None:
        chosen = cands[-1]
        if weights_total:
            lines.append(f"weights {weights_total:.2f} GiB / (tp {chosen} x pp {pp}) = "
                         f"{weights_total / (chosen * pp):.2f} GiB per GPU (still tight)")
    need = chosen * pp
    cost = f"uses {need} GPUs" + ("" if count else " (the GPU count is unknown: check you have them)")
    if not known:
        cost += "; model config unknown, tp validity assumed (powers of two divide common head counts)"
    return chosen, cost, lines


def _free_cap(ctx: RemedyContext, total: float | None) -> float | None:
    """Largest utilization the free memory allows: from the Free-memory message or the GPU snapshot."""
    free = _cap_num(ctx, "free_gib")
    tot = _cap_num(ctx, "total_gib") or total
    if free is None:
        d = _device(ctx)
        if d and d["free_gib"] is not None:
            free = d["free_gib"]
            tot = tot or d["total_gib"]
    if free is None or not tot:
        return None
    return mm.max_safe_utilization(free, tot)


# --------------------------------------------------------------------------- refine hook

def _phase(ctx: RemedyContext) -> str | None:
    if _cap(ctx, "warmup") or _cap(ctx, "num_reqs"):
        return "sampler"
    for m in ctx.matches or []:
        tb = getattr(m, "traceback", None)
        frames = list(getattr(tb, "frames", None) or [])
        if frames:
            got = classify_frames([getattr(f, "func", "") or "" for f in frames],
                                  [getattr(f, "file", "") or "" for f in frames])
            if got:
                return got
    got = _fact(ctx, PHASE_FACT)
    if got:
        return str(got)
    return classify_milestones(_fact(ctx, "log.milestones"))


# --------------------------------------------------------------------------- shared alternatives

def _fp8_weights(ctx: RemedyContext, weights_per_gpu: float | None) -> Alternative | None:
    if _fact(ctx, "model.quant_method") or _arg(ctx, "quantization"):
        return None
    cc = _compute_capability(ctx)
    if cc is not None and cc < (8, 9):
        return None
    saved = f"; weights ~{weights_per_gpu / 2:.2f} GiB per GPU instead of {weights_per_gpu:.2f}" \
        if weights_per_gpu else ""
    note = "" if cc else " (needs compute capability >= 8.9: Ada/Hopper/Blackwell)"
    return Alternative(f"Quantize the weights on the fly: --quantization fp8{note}",
                       [SetFlag("--quantization", "fp8")],
                       f"small accuracy loss{saved}")


def _cpu_offload(weights_per_gpu: float | None, budget: float | None) -> Alternative:
    if weights_per_gpu and budget:
        gb = max(1, math.ceil(weights_per_gpu - budget) + 1)
    else:
        gb = 8
    return Alternative(f"Keep {gb} GiB of the weights in CPU memory: --cpu-offload-gb {gb}",
                       [SetFlag("--cpu-offload-gb", str(gb))],
                       "much slower: those weights cross PCIe on every forward pass")


def _free_gpu_text(ctx: RemedyContext, procs: list[tuple[int, float | None, str]]) -> str:
    idx = _gpu_index(ctx)
    where = f"GPU {idx}" if idx is not None else "the GPU"
    # a Ray worker's OOM carries the node it ran on: the process to stop is there, not on the head node
    node = next((ip for m in ctx.matches or [] if (ip := getattr(getattr(m, "line", None), "ip", None))), None)
    if node:
        where += f" on node {node}"
    return f"free {where}: {_describe_procs(procs)} (stop it, or run vLLM on an idle GPU)"


def _significant(procs: list[tuple[int, float | None, str]], total: float | None) -> bool:
    held = sum(p[1] or 0 for p in procs)
    if not procs:
        return False
    if held == 0:
        return True  # named by NVML without a size: still worth naming
    return held >= 1.0 or (total is not None and held >= 0.05 * total)


def _idle_gpu_env(ctx: RemedyContext, need_gib: float | None) -> Alternative | None:
    cur = _gpu_index(ctx)
    for d in gpu_devices(ctx):
        if d["index"] == cur or d["free_gib"] is None or d["total_gib"] is None:
            continue
        if not d["processes"] and d["free_gib"] >= (need_gib or 0.9 * d["total_gib"]):
            return Alternative(f"Run on the idle GPU {d['index']}: CUDA_VISIBLE_DEVICES={d['index']}",
                               [SetEnv("CUDA_VISIBLE_DEVICES", str(d["index"]))],
                               "uses another GPU")
    return None


# --------------------------------------------------------------------------- remedies

def fix_kv_cache(ctx: RemedyContext) -> Fix | None:
    """kv-cache-insufficient: the largest --max-model-len that fits, or the utilization that makes room."""
    mml = _cap_num(ctx, "max_model_len") or parse_len(_arg(ctx, "max_model_len")) or _fact_num(ctx, "log.max_model_len")
    mml = int(mml) if mml else None
    bs = int(_arg_num(ctx, "block_size") or mm.DEFAULT_BLOCK)
    u, user_set_u = _util(ctx)
    default_u = default_utilization(_version(ctx))
    total = _total_gib(ctx)
    needed = _cap_num(ctx, "needed_gib")
    avail = _cap_num(ctx, "available_gib")
    if avail is None:
        avail = _fact_num(ctx, "log.kv_cache_gib")
    est = _cap_num(ctx, "estimated_max_len")
    v0_tokens = _cap_num(ctx, "kv_cache_tokens")
    bpt = bytes_per_token(ctx)
    arith: list[str] = []
    notes: list[str] = []
    used: dict[str, Any] = {"max_model_len": mml, "gpu_memory_utilization": u, "block_size": bs,
                            "kv_bytes_per_token": bpt.bytes if bpt else None,
                            "weight_bytes": _sizing(ctx).weights().bytes}

    fit: int | None = None
    if v0_tokens:
        fit = mm.round_down_to_block(v0_tokens, bs)
        arith.append(f"KV cache holds {mm.fmt_tokens(int(v0_tokens))} tokens (GPU blocks x {bs}) < "
                     f"max_model_len {mm.fmt_tokens(mml or 0)} -> --max-model-len {fit}")
        if avail and mml and needed is None:
            needed = avail * mml / v0_tokens
    elif est:
        fit = mm.round_down_to_block(est, bs)
        arith.append(f"KV needed {needed} GiB > available {avail} GiB for {mm.fmt_tokens(mml or 0)} tokens; "
                     f"vLLM's estimate {mm.fmt_tokens(int(est))} tokens, rounded down to a block of {bs} "
                     f"-> --max-model-len {fit}")
    elif avail is not None and avail > 0 and bpt:
        tokens = int(avail * GIB // bpt.bytes)
        fit = mm.round_down_to_block(tokens, bs)
        arith.append(bpt.formula)
        head = f"KV needed {needed} GiB > available {avail} GiB; " if needed else ""
        arith.append(f"{head}{avail} GiB / {mm.fmt_bytes(bpt.bytes)} per token = {mm.fmt_tokens(tokens)} tokens "
                     f"-> --max-model-len {fit}")
    elif avail is not None and avail > 0 and needed and mml:
        per_tok = needed * GIB / mml
        tokens = int(mml * avail / needed)
        fit = mm.round_down_to_block(tokens, bs)
        arith.append(f"KV needed {needed} GiB for {mm.fmt_tokens(mml)} tokens = {mm.fmt_bytes(per_tok)} per token; "
                     f"{avail} GiB / {mm.fmt_bytes(per_tok)} = {mm.fmt_tokens(tokens)} tokens -> --max-model-len {fit}")
    if fit is not None and mml and fit >= mml:
        fit = None
    if fit is not None and fit < bs:
        fit = None

    # Raising the utilization: only up to what is free at start.
    cap = _free_cap(ctx, total)
    if needed is None and total and (fit is None or _no_room(ctx)):
        # No figure for the need: aim for one request of max_model_len (or 4096 tokens) of KV cache.
        want_tokens = mml if mml and mml > 0 else 4096
        if bpt:
            needed = round(mm.kv_bytes_needed(want_tokens, bpt.bytes, bs) / GIB, 2)
            arith.append(f"one request of {mm.fmt_tokens(want_tokens)} tokens needs {needed} GiB of KV cache "
                         f"({bpt.formula})")
        else:
            needed = round(max(1.0, 0.05 * total), 2)
            arith.append(f"model size unknown: aim for {needed} GiB of KV cache (5 % of {total:.2f} GiB)")
        if avail is None:
            avail = 0.0
    util_alt = None
    if total and needed is not None and avail is not None:
        limit = cap if cap is not None else 0.95
        if u < limit - 1e-9:
            new_u, capped = mm.utilization_for_need(u, needed, avail, total, cap=limit)
            if new_u > u:
                gained = mm.kv_gib_at_utilization(u, avail, new_u, total)
                arith.append(f"--gpu-memory-utilization {_fmt_u(u)} -> {_fmt_u(new_u)}: KV {avail} GiB + "
                             f"({_fmt_u(new_u)} - {_fmt_u(u)}) x {total:.2f} GiB = {gained:.2f} GiB"
                             + (f" (capped by free memory: {_fmt_u(limit)})" if capped else f" >= {needed} GiB"))
                if not capped:
                    util_alt = (new_u, False)
                elif fit is None or new_u - u >= 0.02:
                    util_alt = (new_u, True)
        elif cap is not None:
            notes.append(f"--gpu-memory-utilization {_fmt_u(u)} is already at what is free "
                         f"({_fmt_u(cap)} of the total); raising it would fail the start-up check")
    used.update({"needed_gib": needed, "available_gib": avail, "total_gib": total, "free_cap": cap})

    weights = _fact_num(ctx, "log.weights_gib")
    budget = total * u if total else None
    weights_fill = (avail is not None and avail <= 0) or _no_room(ctx) or (
        weights is not None and budget is not None and weights >= 0.85 * budget)
    count = _gpu_count(ctx)
    tp = _tp(ctx)
    tp_plan = None
    if count is None or count > tp * _pp(ctx):
        tp_plan = _tp_plan(ctx, _weights_total_gib(ctx) or (weights * tp if weights else None),
                           0.6 * total * u if total else None)

    alts: list[tuple[str, Alternative]] = []
    if fit is not None:
        alts.append(("mml", Alternative(f"Shorten the context: --max-model-len {fit}",
                                        [SetFlag(MML, str(fit))],
                                        f"requests longer than {mm.fmt_tokens(fit)} tokens are rejected")))
    if util_alt:
        new_u, capped = util_alt
        alts.append(("util", Alternative(
            f"Give vLLM more of the GPU: --gpu-memory-utilization {_fmt_u(new_u)}"
            + (" (all that is free; not the whole need - combine with a shorter context)" if capped else ""),
            [SetFlag(UTIL, _fmt_u(new_u))],
            "less memory left for other processes and CUDA graphs")))
    kv_dtype = _arg(ctx, "kv_cache_dtype")
    if kv_dtype in (None, "", "auto"):
        cc = _compute_capability(ctx)
        extra = "" if cc is None or cc >= (8, 9) else " (your GPU has no native fp8: slower dequantization)"
        doubled = f"; about {mm.fmt_tokens(mm.round_down_to_block((fit or 0) * 2, bs))} tokens fit" if fit else ""
        alts.append(("fp8kv", Alternative(f"Halve the KV bytes per token: --kv-cache-dtype fp8{extra}",
                                          [SetFlag("--kv-cache-dtype", "fp8")],
                                          f"small accuracy loss{doubled}")))
    if tp_plan:
        t, cost, lines = tp_plan
        arith.extend(lines)
        alts.append(("tp", Alternative(f"Spread the model over {t} GPUs: --tensor-parallel-size {t}",
                                       [SetFlag(TP, str(t))], cost)))
    if _arg(ctx, "kv_cache_memory_bytes"):
        alts.insert(0, ("kvbytes", Alternative(
            f"Drop --kv-cache-memory-bytes {_arg(ctx, 'kv_cache_memory_bytes')} and let vLLM size the KV cache "
            f"from --gpu-memory-utilization", [RemoveFlag("--kv-cache-memory-bytes")],
            "the KV cache takes the memory --gpu-memory-utilization allows")))

    # Ranking.
    order: list[str]
    lowered = user_set_u and u < default_u - 1e-9
    if _arg(ctx, "kv_cache_memory_bytes"):
        # an explicit KV size makes vLLM ignore --gpu-memory-utilization: raising it would change nothing
        order = ["kvbytes", "mml", "fp8kv", "tp"]
    elif weights_fill:
        order = ["tp", "util", "fp8kv", "mml"]
        if weights is not None and budget is not None:
            arith.append(f"weights {weights:.2f} GiB of the {budget:.2f} GiB budget "
                         f"({total:.2f} GiB x {_fmt_u(u)}): almost nothing is left for the KV cache")
    elif lowered and util_alt and not util_alt[1]:
        order = ["util", "mml", "fp8kv", "tp"]
        notes.append(f"--gpu-memory-utilization {_fmt_u(u)} is below the default {_fmt_u(default_u)}: a lower "
                     f"value shrinks the KV cache, it does not free memory for it")
    else:
        order = ["mml", "util", "fp8kv", "tp"]
    ranked = [a for key in order for k, a in alts if k == key]
    if not ranked:
        return None
    primary, rest = ranked[0], ranked[1:]
    if not _arg(ctx, "max_model_len") and mml and mml >= 32768:
        notes.append(f"max_model_len {mm.fmt_tokens(mml)} was not set by you: vLLM took it from the model's "
                     f"config.json")
    if weights_fill and primary.edits and isinstance(primary.edits[0], SetFlag) and primary.edits[0].flag == MML:
        notes.append("the weights leave little KV memory; a short context is the only fix on this GPU")
    summary = primary.summary
    if rest:
        summary += f" (cost: {primary.cost})" if primary.cost else ""
    return Fix(summary=summary, edits=primary.edits, alternatives=rest, arithmetic=arith,
               facts_used={k: v for k, v in used.items() if v is not None}, notes=notes)


def _no_room(ctx: RemedyContext) -> bool:
    for m in ctx.matches or []:
        pat = getattr(m, "pattern", None)
        name = getattr(pat, "name", pat)
        if name in ("no-cache-blocks", "auto-fit"):
            return True
    return False


def fix_gpu_util(ctx: RemedyContext) -> Fix | None:
    """gpu-memory-utilization-too-high: at most free/total, or free the GPU held by other processes."""
    free = _cap_num(ctx, "free_gib")
    total = _cap_num(ctx, "total_gib") or _total_gib(ctx)
    u, _ = _util(ctx)
    requested = _cap_num(ctx, "requested_gib")
    external = _cap_num(ctx, "external_gib")
    cpu = _cap(ctx, "node") is not None
    procs = [] if cpu else other_processes(ctx)
    weights = _fact_num(ctx, "log.weights_gib")
    if weights is None:
        wt = _weights_total_gib(ctx)
        weights = wt / (_tp(ctx) * _pp(ctx)) if wt else None
    default_u = default_utilization(_version(ctx))
    used = {"free_gib": free, "total_gib": total, "gpu_memory_utilization": u, "requested_gib": requested}
    arith: list[str] = []
    notes: list[str] = []
    alts: list[Alternative] = []

    if external is not None and total:
        new_u = min(0.95, mm.ceil_to(external / total + 0.1))
        arith.append(f"external weights {external} GiB / total {total} GiB = {external / total:.3f}; "
                     f"+0.10 for activations and KV cache -> {_fmt_u(new_u)}")
        return Fix(f"Raise --gpu-memory-utilization to {_fmt_u(new_u)} so the engine's share covers the "
                   f"externally held weights", [SetFlag(UTIL, _fmt_u(new_u))], [], arith, used, notes)

    kv_space = _cap_num(ctx, "kv_space_gib")
    if kv_space is not None and free is not None:
        # CPU backend: an explicit KV-cache size (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes) above free RAM
        new_kv = max(1, int(free * 0.5))
        arith.append(f"requested KV cache {kv_space} GiB > {free} GiB free on node {_cap(ctx, 'node')}; "
                     f"half of the free RAM, rounded down -> {new_kv} GiB (the rest is for weights and activations)")
        cmd = ctx.command
        if cmd is not None and cmd.get("--kv-cache-memory-bytes") not in (None, False):
            edits = [SetFlag("--kv-cache-memory-bytes", f"{new_kv}G")]
            what = f"--kv-cache-memory-bytes {new_kv}G"
        else:
            edits = [SetEnv("VLLM_CPU_KVCACHE_SPACE", str(new_kv))]
            what = f"VLLM_CPU_KVCACHE_SPACE={new_kv}"
        return Fix(f"Ask for less KV cache than the free RAM: {what}", edits, [], arith, used, notes)

    if free is not None and total:
        cap = mm.max_safe_utilization(free, total)
        arith.append(f"free {free} GiB / total {total} GiB = {free / total:.3f}; vLLM wants {_fmt_u(u)} x "
                     f"{total} = {requested if requested is not None else round(u * total, 2)} GiB")
        arith.append(f"largest accepted utilization, 0.01 below free/total: {_fmt_u(cap)}")
        held = total - free
        if cpu:
            arith.append(f"{held:.2f} GiB of RAM is used by other processes on node {_cap(ctx, 'node')}")
        fits_weights = weights is None or cap * total >= weights * 1.15 + 1.0
        if weights is not None:
            arith.append(f"weights {weights:.2f} GiB per GPU; {_fmt_u(cap)} x {total} = {cap * total:.2f} GiB "
                         + ("leaves room for activations and KV cache" if fits_weights else "is not enough for them"))
        lower = Alternative(f"Lower --gpu-memory-utilization to {_fmt_u(cap)} (what is free)",
                            [SetFlag(UTIL, _fmt_u(cap))],
                            f"{(u - cap) * total:.2f} GiB less KV cache (fewer concurrent requests / shorter context)")
        idle = _idle_gpu_env(ctx, requested)
        if procs and _significant(procs, total) and (not fits_weights or cap < 0.3):
            summary = (f"Another process holds the memory: {_free_gpu_text(ctx, procs)}; then the same "
                       f"--gpu-memory-utilization {_fmt_u(u)} works")
            if idle:
                alts.append(idle)
            if cap >= 0.05:
                alts.append(lower)
            return Fix(summary, [], alts, arith, used, notes)
        if cap < 0.05:
            summary = (f"Only {free} GiB of {total} GiB is free: free the GPU (another process holds "
                       f"{held:.2f} GiB); no --gpu-memory-utilization value can work")
            if idle:
                alts.append(idle)
            return Fix(summary, [], alts, arith, used, notes)
        summary = f"Set --gpu-memory-utilization {_fmt_u(cap)} (at most free/total = {free}/{total})"
        if cpu:
            summary += " - on the CPU backend it is the share of the node's RAM"
        if procs:
            summary += f", or {_free_gpu_text(ctx, procs)}"
            alts.append(Alternative(f"Keep --gpu-memory-utilization {_fmt_u(u)} and {_free_gpu_text(ctx, procs)}",
                                    [], "you must stop the other process"))
        if idle:
            alts.append(idle)
        if not fits_weights:
            notes.append("the weights barely fit in that share; expect kv-cache-insufficient next")
        return Fix(summary, [SetFlag(UTIL, _fmt_u(cap))], alts, arith, used, notes)

    util_bad = _cap_num(ctx, "util")
    if util_bad is not None and util_bad >= 1.0:
        new_u = default_u
        cap = _free_cap(ctx, total)
        if cap is not None:
            new_u = min(new_u, cap)
        arith.append(f"--gpu-memory-utilization is a fraction of total memory in (0, 1]; {util_bad} is out of "
                     f"range -> {_fmt_u(new_u)} (vLLM's default {_fmt_u(default_u)})")
        return Fix(f"Set --gpu-memory-utilization {_fmt_u(new_u)} (it is a fraction, at most 1)",
                   [SetFlag(UTIL, _fmt_u(new_u))], [], arith, used, notes)

    # "Error in memory profiling": free memory changed under vLLM while it profiled.
    init_free, cur_free = _cap_num(ctx, "initial_free"), _cap_num(ctx, "current_free")
    if init_free is not None and cur_free is not None:
        scale = GIB if init_free > 1 << 20 else 1
        arith.append(f"free memory went from {init_free / scale:.2f} GiB to {cur_free / scale:.2f} GiB during "
                     f"profiling: another process released memory")
    idle = _idle_gpu_env(ctx, None)
    summary = "Run vLLM alone on its GPU: another process allocated or released GPU memory while vLLM profiled"
    if procs:
        summary += f" ({_free_gpu_text(ctx, procs)})"
    alts = [idle] if idle else []
    new_u = mm.floor_to(u - 0.05)
    alts.append(Alternative(f"Leave headroom for the other process: --gpu-memory-utilization {_fmt_u(new_u)}",
                            [SetFlag(UTIL, _fmt_u(new_u))], "a smaller KV cache"))
    return Fix(summary, [], alts, arith, used, notes)


def fix_max_model_len(ctx: RemedyContext) -> Fix | None:
    """max-model-len-too-large: --max-model-len = the derived maximum from the message."""
    derived = _cap_num(ctx, "derived") or _fact_num(ctx, "model.derived_max_model_len")
    if not derived:
        return None
    derived_i = int(derived)
    mml_tok = _cap(ctx, "model_max_length")
    mml_tok_n = _num(mml_tok) if mml_tok not in (None, "None") else None
    if mml_tok_n and 0 < mml_tok_n < derived_i:
        derived_i = int(mml_tok_n)
    user = _cap_num(ctx, "max_model_len") or parse_len(_arg(ctx, "max_model_len"))
    key = _cap(ctx, "key") or "max_position_embeddings"
    arith = [f"requested {mm.fmt_tokens(int(user)) if user else '?'} > {key} = {mm.fmt_tokens(derived_i)} "
             f"in config.json -> --max-model-len {derived_i}"]
    alts = [Alternative("Only if the model really handles longer inputs (rope scaling you applied yourself): "
                        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
                        [SetEnv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")],
                        "NaNs or CUDA out-of-bounds errors past the trained positions")]
    return Fix(f"Set --max-model-len {derived_i} (the model's maximum, {key})", [SetFlag(MML, str(derived_i))],
               alts, arith, {"max_model_len": user, "derived_max_model_len": derived_i, "key": key})


def fix_oom_load(ctx: RemedyContext) -> Fix | None:
    """cuda-oom-load: the weights do not fit per GPU -> bf16 instead of fp32, more GPUs, quantize, offload."""
    total = _total_gib(ctx)
    u, _ = _util(ctx)
    tp, pp = _tp(ctx), _pp(ctx)
    procs = other_processes(ctx)
    weights_total = _weights_total_gib(ctx)
    per_gpu = weights_total / (tp * pp) if weights_total else None
    budget = 0.8 * total * u if total else None   # leave ~20 % of the share for activations + KV cache
    cc = _compute_capability(ctx)
    arith: list[str] = []
    notes: list[str] = []
    used = {"total_gib": total, "gpu_memory_utilization": u, "tensor_parallel_size": tp,
            "pipeline_parallel_size": pp, "weights_total_gib": weights_total, "gpu_count": _gpu_count(ctx),
            "compute_capability": ".".join(map(str, cc)) if cc else None}
    if per_gpu is not None and total:
        arith.append(f"weights {weights_total:.2f} GiB / (tp {tp} x pp {pp}) = {per_gpu:.2f} GiB per GPU; "
                     f"usable ~0.8 x {total:.2f} GiB x {_fmt_u(u)} = {budget:.2f} GiB")
    tried, free = _cap_gib(ctx, "tried_to_allocate"), _cap_gib(ctx, "free")
    if tried is not None and free is not None:
        arith.append(f"the failed request: {_cap(ctx, 'tried_to_allocate')} with only {_cap(ctx, 'free')} free")

    ranked: list[Alternative] = []
    if procs and _significant(procs, total):
        held = sum(p[1] or 0 for p in procs)
        arith.append(f"other processes hold {held:.2f} GiB of GPU {_gpu_index(ctx) or 0}")
        ranked.append(Alternative(f"Free the GPU first: {_free_gpu_text(ctx, procs)}", [],
                                  "you must stop the other process"))
    if _is_fp32(ctx):
        wb = _fact_num(ctx, "model.weight_bytes")
        if wb:
            arith.append(f"--dtype float stores 4 bytes per parameter: {2 * wb / GIB:.2f} GiB instead of "
                         f"{wb / GIB:.2f} GiB in bfloat16/float16")
        target = "float16" if cc is not None and cc < (8, 0) else "auto"
        ranked.append(Alternative(f"Load the weights in 2 bytes: --dtype {target} (float32 doubles them)",
                                  [SetFlag("--dtype", target)], "none for inference in practice"))
        if per_gpu:
            per_gpu /= 2
            weights_total = weights_total / 2 if weights_total else None
    plan = None
    count = _gpu_count(ctx)
    if count is None or count > tp * pp:
        plan = _tp_plan(ctx, weights_total, budget)
    fits_now = per_gpu is not None and budget is not None and per_gpu <= budget
    if plan and (count is not None or not ranked):
        t, cost, lines = plan
        arith.extend(lines)
        if count and count > tp * pp:
            notes.append(f"{count} GPUs are present but only {tp * pp} used")
        ranked.append(Alternative(f"Split the weights over {t} GPUs: --tensor-parallel-size {t}",
                                  [SetFlag(TP, str(t))], cost))
    if not fits_now:
        fp8 = _fp8_weights(ctx, per_gpu)
        if fp8:
            ranked.append(fp8)
        elif cc is not None and cc < (8, 9):
            notes.append(f"compute capability {cc[0]}.{cc[1]} < 8.9: no fp8 weights; use a pre-quantized "
                         f"AWQ/GPTQ checkpoint of this model instead")
        ranked.append(_cpu_offload(per_gpu, budget))
    if plan and count is None and not any(a.edits and a.edits[0] == SetFlag(TP, str(plan[0])) for a in ranked):
        t, cost, lines = plan
        ranked.append(Alternative(f"Split the weights over {t} GPUs: --tensor-parallel-size {t}",
                                  [SetFlag(TP, str(t))], cost))
    if not ranked:
        return None
    primary, rest = ranked[0], ranked[1:]
    if not primary.edits and rest:
        # "free the GPU" first; still show the first flag-level change in the summary
        summary = f"{primary.summary}; otherwise {rest[0].summary}"
    else:
        summary = primary.summary
    notes.append("a lower --gpu-memory-utilization or --max-model-len does not help: the KV cache does not "
                 "exist yet when the weights are loaded")
    return Fix(summary, primary.edits, rest, arith, {k: v for k, v in used.items() if v is not None}, notes)


def fix_oom_runtime(ctx: RemedyContext) -> Fix | None:
    """cuda-oom-runtime: act on the phase that failed; fragmentation -> expandable segments."""
    phase = _phase(ctx)
    total = _total_gib(ctx)
    u, _ = _util(ctx)
    procs = other_processes(ctx)
    tried = _cap_gib(ctx, "tried_to_allocate")
    free = _cap_gib(ctx, "free")
    reserved = _cap_gib(ctx, "reserved_unallocated")
    arith: list[str] = []
    notes: list[str] = []
    used = {"phase": phase, "total_gib": total, "gpu_memory_utilization": u,
            "tried_to_allocate_gib": tried, "free_gib": free, "reserved_unallocated_gib": reserved}
    if phase:
        notes.append(f"the OOM happened during {PHASE_NAMES.get(phase, phase)}")
    if tried is not None and free is not None:
        arith.append(f"requested {_cap(ctx, 'tried_to_allocate')} with {_cap(ctx, 'free')} free "
                     f"on GPU {_cap(ctx, 'gpu') or 0} of {_cap(ctx, 'total') or '?'}")

    # lower utilization step: at least 0.05, more if the failed request is bigger than that
    step = 0.05
    if total and tried is not None:
        step = max(step, mm.ceil_to(max(0.0, tried - (free or 0)) / total + 0.01))
    new_u = max(0.1, mm.floor_to(u - step))
    if total:
        arith.append(f"--gpu-memory-utilization {_fmt_u(u)} -> {_fmt_u(new_u)} leaves "
                     f"{(u - new_u) * total:.2f} GiB ({_fmt_u(u - new_u)} x {total:.2f} GiB) outside the KV cache")
    util_alt = Alternative(f"Leave more room outside the KV cache: --gpu-memory-utilization {_fmt_u(new_u)}",
                           [SetFlag(UTIL, _fmt_u(new_u))], "a smaller KV cache: fewer concurrent requests")

    seqs = _cap_num(ctx, "num_reqs") or _arg_num(ctx, "max_num_seqs")
    seqs_default = seqs is None
    seqs = int(seqs or 256)
    new_seqs = max(1, seqs // 2)
    seqs_alt = Alternative(f"Fewer sequences per batch: --max-num-seqs {new_seqs}",
                           [SetFlag("--max-num-seqs", str(new_seqs))],
                           "fewer concurrent requests (lower throughput); smaller sampler warm-up and CUDA graphs")
    if not seqs_default or _cap(ctx, "num_reqs"):
        arith.append(f"--max-num-seqs {seqs} -> {new_seqs}")
    mbt = _arg_num(ctx, "max_num_batched_tokens")
    mbt_alt = None
    if mbt:
        new_mbt = max(256, int(mbt // 2) // 256 * 256)
        mbt_alt = Alternative(f"Smaller prefill chunks: --max-num-batched-tokens {new_mbt}",
                              [SetFlag("--max-num-batched-tokens", str(new_mbt))],
                              "slower first token for long prompts")
        arith.append(f"--max-num-batched-tokens {int(mbt)} -> {new_mbt} roughly halves the activation peak")
    eager_alt = Alternative("Skip CUDA graphs: --enforce-eager", [SetFlag("--enforce-eager")],
                            "slower decoding (no CUDA graphs)")
    frag_alt = None
    if reserved is not None and reserved > 0:
        frag = (tried is not None and reserved >= tried and reserved >= 0.5) or reserved >= 1.0
        if frag:
            arith.append(f"reserved but unallocated {_cap(ctx, 'reserved_unallocated')} >= the failed "
                         f"{_cap(ctx, 'tried_to_allocate') or 'request'}: fragmentation")
            frag_alt = Alternative(f"Reduce fragmentation: {ALLOC_ENV}={ALLOC_VALUE}",
                                   [SetEnv(ALLOC_ENV, ALLOC_VALUE)], "none known")

    ranked: list[Alternative] = []
    if procs and _significant(procs, total):
        ranked.append(Alternative(f"Free the GPU: {_free_gpu_text(ctx, procs)}", [],
                                  "you must stop the other process"))
    if frag_alt and phase not in ("sampler",):
        ranked.append(frag_alt)
    if phase == "graph":
        ranked += [eager_alt, util_alt, seqs_alt]
    elif phase == "sampler":
        ranked += [seqs_alt, util_alt]
    elif phase == "profile":
        ranked += [a for a in (mbt_alt, seqs_alt, util_alt) if a]
        if not mbt_alt:
            notes.append("the activation peak grows with --max-num-batched-tokens (and, without chunked "
                         "prefill, with --max-model-len)")
    elif phase == "kv_alloc":
        ranked += [util_alt, seqs_alt]
    elif phase == "init":
        # the card was full before vLLM allocated anything: no flag of vLLM's makes room
        if not ranked:
            gpu = f"GPU {_cap(ctx, 'gpu')}" if _cap(ctx, "gpu") else "the GPU"
            ranked.append(Alternative(f"Free {gpu}: it was already nearly full before vLLM allocated anything - "
                                      "another process or an earlier vLLM still holds it (`nvidia-smi`)", [],
                                      "you must stop the other process"))
        notes.append("lowering --gpu-memory-utilization or --max-num-seqs does not help here: those only size "
                     "what vLLM allocates later")
    else:  # serving or unknown
        ranked += [util_alt, seqs_alt] + ([mbt_alt] if mbt_alt else []) + [eager_alt]
    if frag_alt and frag_alt not in ranked:
        ranked.append(frag_alt)
    primary, rest = ranked[0], ranked[1:]
    if not primary.edits and rest:
        summary = f"{primary.summary}; otherwise {rest[0].summary}"
    else:
        summary = primary.summary
    env = {ALLOC_ENV: ALLOC_VALUE} if primary is frag_alt else {}
    fix = Fix(summary, primary.edits, rest, arith, {k: v for k, v in used.items() if v is not None}, notes)
    if env:
        fix.facts_used["env"] = env
    return fix
