"""`vllm-doctor plan MODEL`: every (tensor, pipeline) layout vLLM accepts for a model on some GPUs, ranked.

The sizes come from ``remedies.parallel_math.valid_tp_sizes`` (vLLM's real rules: heads, KV heads, padded
vocabulary, MLP / MoE sizes, quantization groups, vision tower), never from "largest power of two" or
"ceil(memory / per-GPU)" — which vLLM rejects for 40-, 28- or 52-head models. Memory per layout:

* weights per GPU ``W / (tp x pp)`` (``model.weight_bytes`` or an estimate from config.json);
* KV budget per GPU ``u x T - W/(tp x pp) - A`` where ``A`` (``ACTIVATION_GIB``) is a stated allowance for
  the profile run's activations, the CUDA context, NCCL and CUDA-graph buffers (vLLM measures the real
  value at start-up);
* KV capacity in tokens ``floor(budget / kv_bytes_per_token / block) x block``; the layout fits when one
  request of ``max_model_len`` tokens fits.

The sizing helpers here are shared with ``preflight`` (`vllm-doctor check`).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import Facts, gpus
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.numbers import as_int as _int

GIB = mm.GIB
MIB = mm.MIB
ACTIVATION_GIB = 2.0          # per GPU: profile-run activations + CUDA context + NCCL/graph buffers
TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
MML_FLAG = "--max-model-len"


class PlanError(Exception):
    """Bad input for a plan: one line, exit 2."""


# --------------------------------------------------------------------------- sizing (shared with check)



default_utilization = mm.default_utilization


def effective_dtype(facts: Facts) -> str:
    """The dtype vLLM loads the weights in: --dtype, else the config's (float32 configs load in 16 bits)."""
    d = str(facts.get("args.dtype") or "auto").lower().replace("torch.", "")
    if d in ("", "auto", "none"):
        d = str(facts.get("model.dtype") or "bfloat16").lower().replace("torch.", "")
        if d in ("float32", "float", "fp32"):
            d = "float16"
    return {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(d, d)


QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "compressed-tensors": 1.0, "mxfp4": 0.55,
               "awq": 0.55, "awq_marlin": 0.55, "gptq": 0.55, "gptq_marlin": 0.55, "marlin": 0.55,
               "bitsandbytes": 0.55, "gguf": 0.6}


def weight_bytes(facts: Facts) -> tuple[int | None, str]:
    """Total weight bytes as loaded, and where the number comes from ('' when unknown)."""
    wb = _int(facts.get("model.weight_bytes"))
    if wb:
        if effective_dtype(facts) == "float32" and mm.dtype_bytes(facts.get("model.dtype")) == 2:
            return wb * 2, "checkpoint size x 2 (--dtype float32)"
        return wb, "checkpoint size"
    hidden, layers = _int(facts.get("model.hidden_size")), _int(facts.get("model.num_layers"))
    heads = _int(facts.get("model.num_attention_heads"))
    if not (hidden and layers and heads):
        return None, ""
    experts = _int(facts.get("model.num_experts"))
    moe = _int(facts.get("model.moe_intermediate_size")) or (_int(facts.get("model.intermediate_size"))
                                                             if experts else None)
    params = mm.estimate_params(hidden, layers, heads, _int(facts.get("model.num_kv_heads")),
                                _int(facts.get("model.head_dim")), _int(facts.get("model.intermediate_size")),
                                _int(facts.get("model.vocab_size")), num_experts=experts, moe_intermediate=moe)
    quant = str(facts.get("model.quant_method") or facts.get("args.quantization") or "").lower()
    per = QUANT_BYTES.get(quant) if quant else None
    if per is None:
        per = mm.dtype_bytes(effective_dtype(facts))
    label = f"estimated from config.json: ~{params / 1e9:.1f}B parameters x {per:g} bytes"
    return int(params * per), label


def kv_dtype_bytes(facts: Facts) -> int:
    kv = facts.get("args.kv_cache_dtype")
    if kv in (None, "", "auto"):
        return mm.dtype_bytes(effective_dtype(facts))
    return mm.dtype_bytes(kv)


def kv_per_token(facts: Facts, tp: int, pp: int) -> int | None:
    """KV-cache bytes per token per GPU for this layout (None when the config is unknown)."""
    layers = _int(facts.get("model.num_layers"))
    if not layers:
        return None
    nbytes = kv_dtype_bytes(facts)
    if facts.get("model.use_mla") and _int(facts.get("model.kv_lora_rank")):
        return mm.kv_bytes_per_token(layers, dtype_bytes=nbytes, tp=tp, pp=pp, use_mla=True,
                                     kv_lora_rank=_int(facts.get("model.kv_lora_rank")),
                                     qk_rope_head_dim=_int(facts.get("model.qk_rope_head_dim")))
    heads = _int(facts.get("model.num_attention_heads"))
    kv = _int(facts.get("model.num_kv_heads")) or heads
    head_dim = _int(facts.get("model.head_dim"))
    hidden = _int(facts.get("model.hidden_size"))
    if not head_dim and hidden and heads:
        head_dim = hidden // heads
    if not kv or not head_dim:
        return None
    return mm.kv_bytes_per_token(layers, kv, head_dim, nbytes, tp=tp, pp=pp)


def parse_len(value: Any) -> int | None:
    """--max-model-len as vLLM reads it: 4096, '32k' (x1000), '32K' (x1024), '1m'; auto/-1 -> None."""
    if value is None:
        return None
    text = str(value).strip()
    if text in ("", "auto", "-1", "None"):
        return None
    mult = {"k": 1000, "K": 1024, "m": 1000 ** 2, "M": 1024 ** 2, "g": 1000 ** 3, "G": 1024 ** 3}
    try:
        if text[-1] in mult:
            return int(float(text[:-1]) * mult[text[-1]])
        return int(float(text))
    except (ValueError, IndexError):
        return None


def model_tp_kwargs(facts: Facts) -> dict[str, Any]:
    group = _int(facts.get("model.quant_group_size"))
    return dict(kv_heads=_int(facts.get("model.num_kv_heads")), vocab=_int(facts.get("model.vocab_size")),
                intermediate=_int(facts.get("model.intermediate_size")),
                moe_intermediate=_int(facts.get("model.moe_intermediate_size")),
                quant_group=group if group and group > 0 else None,
                vision_heads=_int(facts.get("model.vision_num_heads")), head_dim=_int(facts.get("model.head_dim")))


def device_gib(device: dict, kind: str) -> float | None:
    """'total' / 'free' GiB of one gpu.devices entry."""
    return gpus.total_gib(device) if kind == "total" else gpus.free_gib(device)


compute_capability = gpus.compute_capability
devices = gpus.devices


def _matrix(value: Any) -> list[list[str]] | None:
    if isinstance(value, list) and value and all(isinstance(r, list) for r in value):
        return [[str(c) for c in r] for r in value]
    return None


def domains(facts: Facts, count: int) -> tuple[list[list[int]], str] | None:
    """GPU groups that talk directly (NVLink, else one PCIe/NUMA domain), largest first; None: unknown."""
    p2p = facts.get("gpu.p2p")
    nvlink = _matrix(p2p.get("nvlink")) if isinstance(p2p, dict) else None
    topo = _matrix(facts.get("gpu.topology"))
    if nvlink and len(nvlink) >= count and any(c == "OK" for r in nvlink for c in r):
        linked, kind = (lambda i, j: nvlink[i][j] == "OK"), "NVLink"
    elif topo and len(topo) >= count:
        linked = lambda i, j: topo[i][j].startswith("NV") or topo[i][j] in ("PIX", "PXB", "PHB", "NODE")  # noqa: E731
        kind = "PCIe/NUMA"
    else:
        return None
    groups: list[list[int]] = []
    seen: set[int] = set()
    for i in range(count):
        if i in seen:
            continue
        group = [i] + [j for j in range(count) if j != i and j not in seen and linked(i, j)]
        seen.update(group)
        groups.append(group)
    groups.sort(key=len, reverse=True)
    return groups, kind


@dataclass
class Layout:
    tp: int
    pp: int
    gpus: int
    weights_per_gpu: float | None = None     # GiB
    kv_gib: float | None = None              # KV budget per GPU
    kv_tokens: int | None = None
    concurrency: float | None = None         # requests of max_model_len the KV cache holds
    fits: bool | None = None
    in_domain: bool | None = None
    notes: list[str] = field(default_factory=list)
    command: str | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def as_dict(self) -> dict[str, Any]:
        r = lambda x, n=2: None if x is None else round(x, n)  # noqa: E731
        return {"tp": self.tp, "pp": self.pp, "gpus_used": self.world, "weights_per_gpu_gib": r(self.weights_per_gpu),
                "kv_cache_per_gpu_gib": r(self.kv_gib), "kv_cache_tokens": self.kv_tokens,
                "max_concurrency": r(self.concurrency), "fits": self.fits, "power_of_two": pm.is_power_of_two(self.tp),
                "within_one_domain": self.in_domain, "notes": self.notes, "command": self.command}


@dataclass
class PlanResult:
    model: str
    gpus: int
    gpu_gib: float | None
    utilization: float
    max_model_len: int | None
    max_model_len_source: str
    valid_tp: list[int]
    layouts: list[Layout]
    weights_gib: float | None
    weights_source: str
    domains: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Layout | None:
        return self.layouts[0] if self.layouts else None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpus": self.gpus, "gpu_memory_gib": self.gpu_gib,
                "gpu_memory_utilization": self.utilization, "max_model_len": self.max_model_len,
                "max_model_len_source": self.max_model_len_source, "valid_tensor_parallel_sizes": self.valid_tp,
                "weights_gib": None if self.weights_gib is None else round(self.weights_gib, 2),
                "weights_source": self.weights_source, "activation_allowance_gib": ACTIVATION_GIB,
                "domains": self.domains, "notes": self.notes,
                "best": self.best.as_dict() if self.best else None,
                "layouts": [p.as_dict() for p in self.layouts]}


def size_layout(facts: Facts, tp: int, pp: int, gpu_gib: float | None, util: float, mml: int | None,
                weights: int | None, block: int = mm.DEFAULT_BLOCK) -> Layout:
    lay = Layout(tp, pp, tp * pp)
    if weights:
        lay.weights_per_gpu = weights / (tp * pp) / GIB
    if gpu_gib and lay.weights_per_gpu is not None:
        lay.kv_gib = util * gpu_gib - lay.weights_per_gpu - ACTIVATION_GIB
        bpt = kv_per_token(facts, tp, pp)
        if bpt:
            lay.kv_tokens = mm.max_len_for_budget(max(0.0, lay.kv_gib) * GIB, bpt, block)
            if mml:
                lay.fits = lay.kv_tokens >= mml
                lay.concurrency = lay.kv_tokens / mml
        else:
            lay.fits = lay.kv_gib > 0
    return lay


def build_plan(facts: Facts, model: str, gpus: int, gpu_gib: float | None, max_model_len: int | None = None,
               utilization: float | None = None) -> PlanResult:
    heads = _int(facts.get("model.num_attention_heads"))
    if not heads:
        raise PlanError(f"no attention-head count for {model!r}: give a model directory with a config.json")
    if gpus < 1:
        raise PlanError("--gpus must be at least 1")
    layers = _int(facts.get("model.num_layers"))
    kwargs = model_tp_kwargs(facts)
    valid = pm.valid_tp_sizes(heads, max_tp=gpus, **kwargs)
    util = utilization or default_utilization(facts.get("vllm.version"))
    derived = _int(facts.get("model.derived_max_model_len"))
    mml, mml_src = (max_model_len, "--max-model-len") if max_model_len else (derived, "model's derived maximum")
    weights, wsrc = weight_bytes(facts)
    pp_ok = pm.pp_supported(facts.get("vllm.version"))
    dom = domains(facts, gpus)
    largest = len(dom[0][0]) if dom else None
    layouts: list[Layout] = []
    for t in valid:
        for p in range(1, gpus // t + 1):
            if p > 1 and (not pp_ok or (layers and p > layers)):
                continue
            lay = size_layout(facts, t, p, gpu_gib, util, mml, weights)
            if largest is not None:
                lay.in_domain = t <= largest
                if not lay.in_domain:
                    lay.notes.append(f"tp={t} spans {dom[1]} domains (largest has {largest} GPUs): "
                                     "all-reduce crosses the slow link")
            if p > 1:
                lay.notes.append(f"{p} pipeline stages: higher single-request latency")
            if lay.world < gpus:
                lay.notes.append(f"{gpus - lay.world} of {gpus} GPUs idle")
            kv = kwargs.get("kv_heads")
            if facts.get("model.use_mla") and t > 1:
                lay.notes.append("MLA latent KV cache replicated on every tp rank")
            elif kv and t > kv:
                lay.notes.append(f"KV heads replicated {t // kv}x (tp > {kv} KV heads)")
            layouts.append(lay)

    def key(x: Layout):
        short = -(x.kv_gib or 0.0) if x.fits is False else 0.0    # least short first when none fits
        # a layout known to fit leaves the other GPUs free; with the fit unknown, more GPUs is the safer bet
        spread = x.world if x.fits is True else -x.world
        return (x.fits is False, short, x.in_domain is False, x.pp > 1, not pm.is_power_of_two(x.tp),
                -(x.kv_tokens or 0), spread)

    layouts.sort(key=key)
    notes: list[str] = []
    if weights is None:
        notes.append("weights unknown (no checkpoint size, config too sparse): memory fit not checked")
    if gpu_gib is None:
        notes.append("GPU memory unknown (no --gpu-memory, no GPU facts): memory fit not checked")
    if not pp_ok:
        notes.append(f"vLLM {facts.get('vllm.version')} has no pipeline parallelism: tp-only layouts")
    if layouts and layouts[0].fits is False:
        notes.append("no layout fits on these GPUs: more or larger GPUs, a quantized checkpoint, "
                     "a shorter --max-model-len or --kv-cache-dtype fp8")
    for lay in layouts:
        lay.command = serve_command(model, lay.tp, lay.pp, max_model_len)
    return PlanResult(model, gpus, gpu_gib, util, mml, mml_src, valid, layouts,
                      weights / GIB if weights else None, wsrc,
                      f"{len(dom[0])} {dom[1]} domain(s): " + " | ".join(",".join(map(str, g)) for g in dom[0])
                      if dom else None, notes)


def serve_command(model: str, tp: int, pp: int, max_model_len: int | None) -> str:
    from vllm_doctor.command import Command
    from vllm_doctor.command.edits import SetFlag

    edits = [SetFlag(TP_FLAG, str(tp))]
    if pp > 1:
        edits.append(SetFlag(PP_FLAG, str(pp)))
    if max_model_len:
        edits.append(SetFlag(MML_FLAG, str(max_model_len)))
    return Command.from_args({"model": model}).apply(edits).render()


# --------------------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-doctor plan", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every (tensor, pipeline)-parallel layout vLLM accepts for MODEL on these GPUs, ranked, "
                    "with the `vllm serve` command for the best one.",
        epilog="examples:\n  vllm-doctor plan ./Llama-2-13b --gpus 3 --gpu-memory 40\n"
               "  vllm-doctor plan Qwen/Qwen2.5-7B-Instruct --format json")
    p.add_argument("model", metavar="MODEL", help="model directory (or cached hub id) with a config.json")
    p.add_argument("--gpus", type=int, metavar="N", help="GPUs to plan for (default: this machine's / --facts)")
    p.add_argument("--gpu-memory", type=float, metavar="GiB", help="memory per GPU in GiB (default: from facts)")
    p.add_argument("--max-model-len", metavar="L", help="context length to fit (default: the model's maximum)")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="U", help="fraction of each GPU vLLM may use")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="plan for this vLLM release (default: installed)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--facts", metavar="SNAPSHOT", help="facts snapshot of the target machine")
    p.add_argument("--no-live", action="store_true", help="do not look at this machine's GPUs")
    p.add_argument("--online", action="store_true", help="allow Hugging Face hub look-ups")
    p.add_argument("--no-color", action="store_true", help="plain output (also when NO_COLOR is set)")
    return p


def plan_from_args(args, *, nvml: Any = None, environ: Any = None) -> PlanResult:
    from vllm_doctor.facts.gather import gather_facts

    if args.gpus is not None and args.gpus < 1:
        raise PlanError("--gpus must be at least 1")
    facts = Facts()
    if args.vllm_version:
        facts.set("vllm.version", args.vllm_version, "user")
    if args.gpus is not None:
        facts.set("gpu.count", args.gpus, "user")
    live = not args.no_live and (args.gpus is None or args.gpu_memory is None)
    notices = gather_facts(facts, model=args.model, online=args.online, live=live, snapshot=args.facts,
                           environ=environ, nvml=nvml) or []
    if not facts.get("model.num_attention_heads"):
        raise PlanError(notices[0] if notices else f"no model config for {args.model!r}")
    gpus = args.gpus if args.gpus is not None else _int(facts.get("gpu.count"))
    if not gpus:
        raise PlanError("no GPUs known: pass --gpus N (and --gpu-memory GiB), --facts SNAPSHOT, or run on the GPU host")
    gpu_gib = args.gpu_memory
    if gpu_gib is None:
        sizes = [g for g in (device_gib(d, "total") for d in devices(facts)[:gpus]) if g]
        gpu_gib = min(sizes) if sizes else None
    if gpu_gib is not None and gpu_gib <= 0:
        raise PlanError("--gpu-memory must be positive")
    util = args.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise PlanError("--gpu-memory-utilization must be in (0, 1]")
    mml = None
    if args.max_model_len is not None:
        mml = parse_len(args.max_model_len)
        if not mml or mml < 1:
            raise PlanError(f"--max-model-len {args.max_model_len!r} is not a positive length")
    result = build_plan(facts, args.model, gpus, gpu_gib, mml, util)
    result.notes = [n for n in notices if n] + result.notes
    return result


def render_text(result: PlanResult, color: bool) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=140, highlight=False)
    mem = f" x {result.gpu_gib:.1f} GiB" if result.gpu_gib else ""
    console.print(f"Layouts for {result.model} on {result.gpus} GPU(s){mem}, "
                  f"--gpu-memory-utilization {result.utilization:g}, max_model_len "
                  f"{result.max_model_len or '?'} ({result.max_model_len_source})")
    console.print(f"valid --tensor-parallel-size (vLLM's rules): {', '.join(map(str, result.valid_tp))}")
    if result.weights_gib:
        console.print(f"weights: {result.weights_gib:.1f} GiB ({result.weights_source}); "
                      f"activation allowance {ACTIVATION_GIB:g} GiB per GPU")
    if result.domains:
        console.print(f"topology: {result.domains}")
    table = Table(box=None if not color else None, show_edge=False, pad_edge=False)
    for col in ("#", "TP", "PP", "GPUs", "weights/GPU", "KV/GPU", "KV tokens", "concurrency", "fits", "notes"):
        table.add_column(col, justify="right" if col not in ("fits", "notes") else "left")
    g = lambda x: "?" if x is None else f"{x:.1f} GiB"  # noqa: E731
    for i, lay in enumerate(result.layouts, 1):
        fits = {True: "yes", False: "no", None: "?"}[lay.fits]
        table.add_row(str(i), str(lay.tp), str(lay.pp), str(lay.world), g(lay.weights_per_gpu), g(lay.kv_gib),
                      "?" if lay.kv_tokens is None else f"{lay.kv_tokens:,}",
                      "?" if lay.concurrency is None else f"{lay.concurrency:.1f}x", fits, "; ".join(lay.notes))
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    if result.best:
        console.print("best:")
        console.print(f"  {result.best.command}", soft_wrap=True)
    return out.getvalue()


def cmd_plan(argv: list[str]) -> int:
    import os

    from vllm_doctor.cli.main import fail

    args = _parser().parse_args(argv)
    try:
        result = plan_from_args(args)
    except PlanError as exc:
        return fail(str(exc))
    except Exception as exc:  # snapshot errors and the like: one line, never a traceback
        return fail(f"{type(exc).__name__}: {exc}")
    if args.format == "json":
        sys.stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
    else:
        color = not args.no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
        sys.stdout.write(render_text(result, color))
    sys.stdout.flush()
    return 0 if result.best and result.best.fits is not False else 1
