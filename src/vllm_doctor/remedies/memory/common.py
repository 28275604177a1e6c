"""What the memory remedies share: the utilization and layout in effect, the failing GPU (from the log, then
`gpu.devices`), the processes holding it, the model's sizes (vllm_math.sizing), and the alternatives more
than one remedy offers (more GPUs, fp8 weights, CPU offload, an idle GPU)."""
from __future__ import annotations

import math
import re
from typing import Any

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.facts import gpus
from vllm_doctor.findings import Alternative
from vllm_doctor.numbers import as_int, parse_int
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.parallel import real_size, valid_tp_sizes
from vllm_doctor.vllm_math.sizing import LoadArgs, Sizing

GIB = mm.GIB
UTIL = "--gpu-memory-utilization"
MML = "--max-model-len"
TP = "--tensor-parallel-size"
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_VALUE = "expandable_segments:True"

_PROC_RE = re.compile(r"Process (\d+) has (\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB|TiB)) memory in use")
Process = tuple[int, "float | None", str]      # (pid, GiB held, name)
# PyTorch's OOM text (c10/cuda/CUDACachingAllocator.cpp, 2.1+): what its own pool holds in use
_ALLOCATED_RE = re.compile(r"Of the allocated memory (\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB|TiB)) is allocated by PyTorch")


def fmt_u(u: float) -> str:
    return f"{u:.2f}"


def capture_gib(ctx: RemedyContext, name: str) -> float | None:
    """A captured size ("1.53 GiB", "270.00 MiB") in GiB."""
    return mm.to_gib(ctx.capture(name) or None)


def utilization(ctx: RemedyContext) -> tuple[float, bool]:
    """(utilization in effect, whether the user set it): the log's figure, the flag, else vLLM's default."""
    u = ctx.capture_float("util")
    if u is None:
        u = ctx.arg_float("gpu_memory_utilization")
    if u is not None:
        return u, True
    return mm.default_utilization(ctx.version), False


def layout(ctx: RemedyContext) -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes of the launch."""
    return ctx.arg_int("tensor_parallel_size") or 1, ctx.arg_int("pipeline_parallel_size") or 1


def sizing(ctx: RemedyContext, kv_cache_dtype: str | None = None) -> Sizing:
    """The model's sizes for this launch (the same reader as `plan` and `check`)."""
    kv = kv_cache_dtype if kv_cache_dtype is not None else ctx.arg("kv_cache_dtype")
    return Sizing(ctx.shape, LoadArgs(ctx.arg("dtype"), kv, ctx.arg("quantization")))


def weights_total_gib(ctx: RemedyContext) -> float | None:
    """The whole model's weights as vLLM loads them (checkpoint size, else estimated; quantized too)."""
    return sizing(ctx).weights().gib


def is_fp32(ctx: RemedyContext) -> bool:
    return str(ctx.arg("dtype") or "").lower() in ("float", "float32", "torch.float32")


# --------------------------------------------------------------------------- the failing GPU

def gpu_index(ctx: RemedyContext) -> int | None:
    """The GPU the log names: `GPU 2` or `cuda:2`."""
    g = ctx.capture("gpu")
    if not g and ctx.capture("device"):
        m = re.search(r"(\d+)$", ctx.capture("device"))
        g = m.group(1) if m else None
    return parse_int(str(g)) if g else None


def _index(device: dict, default: int) -> int:
    index = as_int(device.get("index"))          # a snapshot's "index": "abc" is no index: its position is
    return default if index is None else index


def device(ctx: RemedyContext) -> dict | None:
    """The failing GPU's `gpu.devices` entry (the first one when the log names none)."""
    devs = ctx.gpus
    idx = gpu_index(ctx)
    return next((d for i, d in enumerate(devs) if idx is not None and _index(d, i) == idx), devs[0] if devs else None)


def gpu_count(ctx: RemedyContext) -> int | None:
    """The GPUs the facts know of; None when unknown, or a count no machine has (a snapshot claiming 10**12)."""
    count = ctx.fact_int("gpu.count") or len(ctx.gpus) or None
    return count if real_size(count) else None


def compute_capability(ctx: RemedyContext) -> tuple[int, int] | None:
    d = device(ctx)
    return gpus.compute_capability(d) if d else None


def total_gib(ctx: RemedyContext) -> float | None:
    """The failing GPU's memory: the log's figures, then the GPU facts."""
    found = ctx.capture_float("total_gib") or capture_gib(ctx, "total") or ctx.fact_float("log.total_gpu_gib")
    if found:
        return found
    d = device(ctx)
    return (gpus.total_gib(d) or None) if d else None


def free_cap(ctx: RemedyContext, total: float | None) -> float | None:
    """Largest utilization the free memory allows: from the Free-memory message or the GPU snapshot."""
    free = ctx.capture_float("free_gib")
    tot = ctx.capture_float("total_gib") or total
    d = device(ctx)
    if free is None and d and gpus.free_gib(d) is not None:
        free, tot = gpus.free_gib(d), tot or gpus.total_gib(d)
    if free is None or not tot:
        return None
    return mm.max_safe_utilization(free, tot)


def listed_processes(ctx: RemedyContext) -> list[Process]:
    """The processes PyTorch's OOM text lists on the failing GPU ("Process N has X memory in use")."""
    texts = list(ctx.lines)
    if ctx.capture("other_pid") and ctx.capture("other_used"):
        texts.append(f"Process {ctx.capture('other_pid')} has {ctx.capture('other_used')} memory in use")
    seen: dict[int, Process] = {}
    for text in texts:
        for pid, size in _PROC_RE.findall(text or ""):
            number = parse_int(pid)
            if number is not None:
                seen.setdefault(number, (number, mm.to_gib(size), ""))
    return list(seen.values())


def other_processes(ctx: RemedyContext) -> list[Process]:
    """Processes other than vLLM holding memory on the failing GPU: from the OOM text, then NVML."""
    seen = {p[0]: p for p in listed_processes(ctx)}
    own = {int(m.line.pid) for m in ctx.matches if getattr(m.line, "pid", None) is not None}
    if (me := this_vllm(ctx, list(seen.values()))) is not None:
        del seen[me[0]]
    d = device(ctx)
    for pid, gib, name in gpus.processes(d) if d else []:
        if pid in own:
            continue
        old = seen.get(pid)
        seen[pid] = (pid, old[1] if old and old[1] is not None else gib, name or (old[2] if old else ""))
    return sorted(seen.values(), key=lambda p: -(p[1] or 0))


def this_vllm(ctx: RemedyContext, listed: list[Process]) -> tuple[int, float, float] | None:
    """(pid, GiB it holds, GiB PyTorch allocated) of the listed process that is this vLLM: without a "this
    process has ..." clause (in a container PyTorch cannot tell its own PID from others: it lists vLLM
    itself as "Process N has X"), the one holding about what PyTorch allocated, plus its CUDA context."""
    allocated = capture_gib(ctx, "allocated")
    if allocated is None:
        found = next((m for text in ctx.lines if "is allocated by PyTorch" in (text or "")
                      for m in [_ALLOCATED_RE.search(text)] if m), None)
        allocated = mm.to_gib(found.group(1)) if found else None
    if not allocated or ctx.capture("in_use"):
        return None
    fits = [(pid, gib) for pid, gib, _ in listed if gib is not None and allocated <= gib <= allocated + max(2.0, 0.1 * allocated)]
    return (fits[0][0], fits[0][1], allocated) if len(fits) == 1 else None


def held_outside(ctx: RemedyContext) -> tuple[float, str] | None:
    """GiB of the failing GPU that the OOM message shows held outside this process, with the arithmetic.

    Old PyTorch (<= 2.0): total - reserved by PyTorch - free; newer: total - this process's use - free.
    What this process holds beyond PyTorch's pool (CUDA context, NCCL buffers, cuBLAS workspaces) stays
    well under the threshold (2 GiB, or 8% of the GPU)."""
    total, free = capture_gib(ctx, "total"), capture_gib(ctx, "free")
    ours = capture_gib(ctx, "in_use") or capture_gib(ctx, "reserved")
    if total is None or free is None or ours is None:
        return None
    outside = total - ours - free
    if outside < max(2.0, 0.08 * total):
        return None
    what = "this process's memory" if ctx.capture("in_use") else "PyTorch's reserved memory"
    return outside, (f"{ctx.capture('total')} total - {ctx.capture('in_use') or ctx.capture('reserved')} {what} - "
                     f"{ctx.capture('free')} free = {outside:.2f} GiB held outside this process")


def significant(procs: list[Process], total: float | None) -> bool:
    """Whether the other processes hold enough to be the cause worth naming first."""
    if not procs:
        return False
    held = sum(p[1] or 0 for p in procs)
    if held == 0:
        return True  # named by NVML without a size: still worth naming
    return held >= 1.0 or (total is not None and held >= 0.05 * total)


def free_gpu_text(ctx: RemedyContext, procs: list[Process]) -> str:
    idx = gpu_index(ctx)
    where = f"GPU {idx}" if idx is not None else "the GPU"
    # a Ray worker's OOM carries the node it ran on: the process to stop is there, not on the head node
    node = next((m.line.ip for m in ctx.matches if getattr(m.line, "ip", None)), None)
    if node:
        where += f" on node {node}"
    parts = [f"PID {pid}" + (f" ({name})" if name else "") + (f" holds {gib:.2f} GiB" if gib is not None else "")
             for pid, gib, name in procs[:4]]
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return f"free {where}: {', '.join(parts)}{more} (stop it, or run vLLM on an idle GPU)"


# --------------------------------------------------------------------------- shared alternatives

def idle_gpu(ctx: RemedyContext, need_gib: float | None) -> Alternative | None:
    """Another GPU with nothing on it and room enough: CUDA_VISIBLE_DEVICES."""
    cur = gpu_index(ctx)
    for i, d in enumerate(ctx.gpus):
        idx, free, total = _index(d, i), gpus.free_gib(d), gpus.total_gib(d)
        if idx == cur or free is None or total is None:
            continue
        if not gpus.processes(d) and free >= (need_gib or 0.9 * total):
            return Alternative(f"Run on the idle GPU {idx}: CUDA_VISIBLE_DEVICES={idx}",
                               [SetEnv("CUDA_VISIBLE_DEVICES", str(idx))], "uses another GPU")
    return None


def tp_plan(ctx: RemedyContext, weights_total: float | None, budget_per_gpu: float | None
            ) -> tuple[int, str, list[str]] | None:
    """The smallest valid --tensor-parallel-size above the current one whose weights fit (if known):
    (tp, cost, arithmetic lines), or None. Limited to the GPUs present when their count is known."""
    tp, pp = layout(ctx)
    count = gpu_count(ctx)
    limit = (count // pp) if count else 8
    if limit <= tp:
        return None
    shape = ctx.shape
    sizes = (valid_tp_sizes(shape.heads, max_tp=limit, **shape.tp_kwargs()) if shape.known
             else [t for t in (1, 2, 4, 8, 16) if t <= limit])
    cands = [t for t in sizes if t > tp]
    if not cands:
        return None
    lines: list[str] = []
    chosen = cands[0]
    if weights_total and budget_per_gpu:
        fits = [t for t in cands if weights_total / (t * pp) <= budget_per_gpu]
        chosen = fits[0] if fits else cands[-1]
        lines.append(f"weights {weights_total:.2f} GiB / (tp {chosen} x pp {pp}) = "
                     f"{weights_total / (chosen * pp):.2f} GiB per GPU "
                     + (f"<= {budget_per_gpu:.2f} GiB usable" if fits else "(still tight)"))
    cost = f"uses {chosen * pp} GPUs" + ("" if count else " (the GPU count is unknown: check you have them)")
    if not shape.known:
        cost += "; model config unknown, tp validity assumed (powers of two divide common head counts)"
    return chosen, cost, lines


def fp8_weights(ctx: RemedyContext, weights_per_gpu: float | None) -> Alternative | None:
    """--quantization fp8 for an unquantized model on a GPU that has fp8 (or whose capability is unknown)."""
    if ctx.shape.quant_method or ctx.arg("quantization"):
        return None
    cc = compute_capability(ctx)
    if cc is not None and cc < (8, 9):
        return None
    saved = (f"; weights ~{weights_per_gpu / 2:.2f} GiB per GPU instead of {weights_per_gpu:.2f}"
             if weights_per_gpu else "")
    note = "" if cc else " (needs compute capability >= 8.9: Ada/Hopper/Blackwell)"
    return Alternative(f"Quantize the weights on the fly: --quantization fp8{note}",
                       [SetFlag("--quantization", "fp8")], f"small accuracy loss{saved}")


def cpu_offload(weights_per_gpu: float | None, budget: float | None) -> Alternative:
    gb = max(1, math.ceil(weights_per_gpu - budget) + 1) if weights_per_gpu and budget else 8
    return Alternative(f"Keep {gb} GiB of the weights in CPU memory: --cpu-offload-gb {gb}",
                       [SetFlag("--cpu-offload-gb", str(gb))],
                       "much slower: those weights cross PCIe on every forward pass")


def lead(ranked: list[Alternative]) -> tuple[Alternative, list[Alternative], str]:
    """(primary, the rest, summary): a primary without edits ("free the GPU") names the next change too."""
    primary, rest = ranked[0], ranked[1:]
    summary = f"{primary.summary}; otherwise {rest[0].summary}" if not primary.edits and rest else primary.summary
    return primary, rest, summary


def present(used: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in used.items() if v is not None}
