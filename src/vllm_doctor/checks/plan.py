"""`vllm-doctor plan MODEL`: every (tensor, pipeline) layout vLLM accepts for a model on some GPUs, ranked.

The sizes come from ``vllm_math.parallel.valid_tp_sizes`` (vLLM's real rules: heads, KV heads, padded
vocabulary, MLP / MoE sizes, quantization groups, vision tower), never from "largest power of two" or
"ceil(memory / per-GPU)" — which vLLM rejects for 40-, 28- or 52-head models. Memory per layout:

* weights per GPU ``W / (tp x pp)`` (``model.weight_bytes`` or an estimate from config.json);
* KV memory and tokens per GPU from the memory model (``vllm_math.budget.predict``: ``u x T`` minus the
  weights, the profile run's activation peak, non-torch memory and, from 0.20.0, CUDA graphs), the same
  figures vLLM prints as "Available KV cache memory" and "GPU KV cache size"; the layout fits when one
  request of ``max_model_len`` tokens fits.

When no layout fits, the least short one is explained (its per-GPU arithmetic in one line) and the
changes that would make a layout fit are tried with the same sizing: more GPUs of this size, a shorter
``--max-model-len``, an FP8 KV cache, an FP8 or 4-bit checkpoint. Only those that do fit are offered.

The sizing comes from ``vllm_math.sizing``, which ``check`` and the memory remedies use too.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vllm_doctor.facts import Facts
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.vllm_math import budget
from vllm_doctor.vllm_math.sizing import GIB, Sizing, domains

TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
MML_FLAG = "--max-model-len"
MAX_SEARCH_GPUS = 256        # "more GPUs would fit" is searched up to this many
MIN_USEFUL_LEN = 1024        # a shorter --max-model-len below this is no remedy worth offering
# A layout "has room" when its KV cache holds this many requests of the context: below it the server works
# one request at a time, and an operator spends more GPUs on the replica before adding replicas.
ROOMY = 2
DP_FLAG = "--data-parallel-size"
QUANT_TRIES = (("an FP8 checkpoint (or --quantization fp8)", 1.0), ("a 4-bit checkpoint (AWQ/GPTQ)", 0.55))


class PlanError(Exception):
    """Bad input for a plan: one line, exit 2."""


@dataclass
class Layout:
    tp: int
    pp: int
    gpus: int
    weights_per_gpu: float | None = None     # GiB
    kv_gib: float | None = None              # KV budget per GPU
    kv_tokens: int | None = None
    kv_bytes_per_token: int | None = None    # per GPU, for this layout
    concurrency: float | None = None         # requests of max_model_len the KV cache holds
    fits: bool | None = None
    overhead_gib: float | None = None        # activation peak + non-torch + CUDA graphs (the memory model)
    memory: budget.MemoryPrediction | None = None
    in_domain: bool | None = None
    notes: list[str] = field(default_factory=list)
    command: str | None = None
    replicas: int = 1                        # copies of the layout the GPUs hold (data parallel / servers)

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def as_dict(self) -> dict[str, Any]:
        r = lambda x, n=2: None if x is None else round(x, n)  # noqa: E731
        return {"tp": self.tp, "pp": self.pp, "gpus_used": self.world, "weights_per_gpu_gib": r(self.weights_per_gpu),
                "kv_cache_per_gpu_gib": r(self.kv_gib), "kv_cache_tokens": self.kv_tokens,
                "kv_bytes_per_token": self.kv_bytes_per_token, "overhead_gib": r(self.overhead_gib),
                "memory_model": self.memory.as_dict() if self.memory else None,
                "max_concurrency": r(self.concurrency), "fits": self.fits, "replicas": self.replicas,
                "power_of_two": pm.is_power_of_two(self.tp),
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
    shortfall: str | None = None                          # nothing fits: the closest layout's arithmetic
    would_fit: list[str] = field(default_factory=list)    # nothing fits: changes that make a layout fit

    @property
    def best(self) -> Layout | None:
        """The top-ranked layout: the best fit, or the least short one when nothing fits."""
        return self.layouts[0] if self.layouts else None

    @property
    def nothing_fits(self) -> bool:
        return bool(self.layouts) and self.layouts[0].fits is False

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpus": self.gpus, "gpu_memory_gib": self.gpu_gib,
                "gpu_memory_utilization": self.utilization, "max_model_len": self.max_model_len,
                "max_model_len_source": self.max_model_len_source, "valid_tensor_parallel_sizes": self.valid_tp,
                "weights_gib": None if self.weights_gib is None else round(self.weights_gib, 2),
                "weights_source": self.weights_source,
                "domains": self.domains, "notes": self.notes,
                # "best" only for a layout that fits (or whose fit is unknown); the least short one is "closest"
                "best": self.best.as_dict() if self.best and not self.nothing_fits else None,
                "closest": self.best.as_dict() if self.nothing_fits else None,
                "shortfall": self.shortfall, "would_fit": self.would_fit,
                "layouts": [p.as_dict() for p in self.layouts]}


def size_layout(sizing: Sizing, tp: int, pp: int, gpu_gib: float | None, util: float, mml: int | None,
                weights: int | None, block: int = mm.DEFAULT_BLOCK, version: str | None = None) -> Layout:
    lay = Layout(tp, pp, tp * pp)
    kv = sizing.kv_per_token(tp, pp)
    lay.kv_bytes_per_token = kv.bytes if kv else None
    if weights:
        lay.weights_per_gpu = weights / (tp * pp) / GIB
    if gpu_gib and lay.weights_per_gpu is not None:
        pred = budget.predict(sizing, budget.Launch(gpu_gib, tp, pp, util, version, mml, block_size=block,
                                                    weights_gib=lay.weights_per_gpu))
        if pred is None:
            return lay
        lay.memory = pred
        lay.kv_gib = pred.kv_gib
        lay.overhead_gib = pred.activation_gib + pred.non_torch_gib + pred.cuda_graph_gib
        if lay.kv_bytes_per_token:
            lay.kv_tokens = pred.kv_tokens
            if mml:
                lay.fits = lay.kv_tokens >= mml
                lay.concurrency = lay.kv_tokens / mml
        else:
            lay.fits = lay.kv_gib > 0
    return lay


@dataclass(frozen=True)
class _Inputs:
    """What sizes every layout of one plan: the model, the GPUs, the context length."""
    sizing: Sizing
    gpu_gib: float | None
    util: float
    mml: int | None
    weights: int | None
    pp_ok: bool
    version: str | None = None

    def size(self, tp: int, pp: int, *, weights: int | None = None, sizing: Sizing | None = None) -> Layout:
        return size_layout(sizing or self.sizing, tp, pp, self.gpu_gib, self.util, self.mml, weights or self.weights,
                           version=self.version)

    def pp_sizes(self, tp: int, gpus: int) -> range:
        """1..the most stages: every layer its own stage at most (vLLM refuses pp > layers); with the layer
        count unknown, at most one stage per GPU of a full node (no loop as long as a GPU count)."""
        layers = self.sizing.shape.layers
        top = gpus // tp if self.pp_ok else 1
        return range(1, min(top, layers or pm.MAX_GPUS_PER_NODE) + 1)


def build_plan(facts: Facts, model: str, gpus: int, gpu_gib: float | None, max_model_len: int | None = None,
               utilization: float | None = None) -> PlanResult:
    sizing = Sizing.from_facts(facts)
    shape = sizing.shape
    if not shape.heads:
        raise PlanError(f"no attention-head count for {model!r}: give a model directory with a config.json")
    if not pm.real_size(gpus):
        raise PlanError(pm.not_a_real_size("--gpus", gpus))
    valid = pm.valid_tp_sizes(shape.heads, max_tp=gpus, **shape.tp_kwargs())
    util = utilization or mm.default_utilization(facts.get("vllm.version"))
    mml, mml_src = (max_model_len, "--max-model-len") if max_model_len else (shape.derived_max_len,
                                                                             "model's derived maximum")
    weighed = sizing.weights()
    inputs = _Inputs(sizing, gpu_gib, util, mml, weighed.bytes, pm.pp_supported(facts.get("vllm.version")),
                     facts.get("vllm.version"))
    dom = domains(facts, gpus)
    dp = pm.dp_supported(inputs.version)        # replicas by --data-parallel-size, else one server each
    layouts = [_noted(inputs.size(t, p), shape, gpus, dom, dp) for t in valid for p in inputs.pp_sizes(t, gpus)]
    layouts.sort(key=_rank)
    for lay in layouts:
        lay.command = serve_command(model, lay.tp, lay.pp, max_model_len, lay.replicas if dp else 1)
    result = PlanResult(model, gpus, gpu_gib, util, mml, mml_src, valid, layouts, weighed.gib, weighed.source,
                        f"{len(dom[0])} {dom[1]} domain(s): " + " | ".join(",".join(map(str, g)) for g in dom[0])
                        if dom else None, _notes(facts, inputs))
    if result.nothing_fits:
        result.shortfall = shortfall(inputs, layouts[0])
        result.would_fit = would_fit(inputs, layouts[0], gpus)
        result.notes.append(f"no layout fits on these GPUs: {result.shortfall}")
    return result


def _noted(lay: Layout, shape: Any, gpus: int, dom: Any, dp: bool = True) -> Layout:
    """The costs of a layout, as notes: crossing a slow link, pipeline stages, idle GPUs, replicated KV; a
    layout known to fit on fewer GPUs than there are is served as replicas."""
    largest = len(dom[0][0]) if dom else None
    if largest is not None:
        lay.in_domain = lay.tp <= largest
        if not lay.in_domain:
            lay.notes.append(f"tp={lay.tp} spans {dom[1]} domains (largest has {largest} GPUs): "
                             "all-reduce crosses the slow link")
    if lay.pp > 1:
        lay.notes.append(f"{lay.pp} pipeline stages: higher single-request latency")
    if lay.fits is True and gpus // lay.world > 1:
        lay.replicas = gpus // lay.world
        how = f"{DP_FLAG} {lay.replicas}" if dp else "one server per replica, each with its own CUDA_VISIBLE_DEVICES"
        lay.notes.append(f"{lay.replicas} replicas of {lay.world} GPU{'s' if lay.world > 1 else ''} ({how})")
    if lay.world * lay.replicas < gpus:
        lay.notes.append(f"{gpus - lay.world * lay.replicas} of {gpus} GPUs idle")
    kv = shape.kv_heads
    if shape.use_mla and lay.tp > 1:
        lay.notes.append("MLA latent KV cache replicated on every tp rank")
    elif kv and lay.tp > kv:
        lay.notes.append(f"KV heads replicated {lay.tp // kv}x (tp > {kv} KV heads)")
    return lay


def _rank(x: Layout) -> tuple:
    """As an operator ranks layouts: one that fits first, then no slow link, no pipeline stages (never for a
    model that fits without), room for ROOMY requests of the context, the fewest GPUs per replica (the rest
    serve more replicas), then the most KV tokens; when none fits the least short first; with the fit
    unknown more GPUs is the safer bet."""
    short = -(x.kv_gib or 0.0) if x.fits is False else 0.0
    cramped = x.fits is True and x.concurrency is not None and x.concurrency < ROOMY
    spread = x.world if x.fits is True else -x.world
    return (x.fits is False, short, x.in_domain is False, x.pp > 1, cramped, spread, not pm.is_power_of_two(x.tp),
            -(x.kv_tokens or 0))


def _notes(facts: Facts, inputs: _Inputs) -> list[str]:
    notes: list[str] = []
    if inputs.weights is None:
        notes.append("weights unknown (no checkpoint size, config too sparse): memory fit not checked")
    if inputs.gpu_gib is None:
        notes.append("GPU memory unknown: pass --gpu-memory GiB (or --facts SNAPSHOT) to see which layouts fit")
    if not inputs.pp_ok:
        notes.append(f"vLLM {facts.get('vllm.version')} has no pipeline parallelism: tp-only layouts")
    return notes


def shortfall(inputs: _Inputs, lay: Layout) -> str:
    """The closest layout's per-GPU arithmetic in one line: what it needs against what vLLM may use."""
    usable = inputs.util * (inputs.gpu_gib or 0.0)
    overhead = lay.overhead_gib or 0.0
    parts = [f"{lay.weights_per_gpu or 0.0:.1f} GiB weights",
             f"{overhead:.1f} GiB activations, non-torch and CUDA graphs (memory model)"]
    need = (lay.weights_per_gpu or 0.0) + overhead
    if lay.kv_bytes_per_token and inputs.mml:
        kv = lay.kv_bytes_per_token * inputs.mml / GIB
        need += kv
        parts.append(f"{kv:.1f} GiB KV cache for one {inputs.mml:,}-token request")
    return (f"tp={lay.tp} pp={lay.pp} needs {' + '.join(parts)} = {need:.1f} GiB per GPU, but vLLM may use "
            f"{usable:.1f} GiB of each ({inputs.util:g} x {inputs.gpu_gib:.1f} GiB)")


def would_fit(inputs: _Inputs, closest: Layout, gpus: int) -> list[str]:
    """Changes that make a layout fit, each checked with the same sizing (none is offered on a guess)."""
    out: list[str] = []
    more = _fewest_gpus(inputs, gpus)
    if more:
        out.append(f"{more.world} GPUs of {inputs.gpu_gib:.1f} GiB (tp {more.tp} x pp {more.pp})")
    tokens = closest.kv_tokens or 0
    if inputs.mml and MIN_USEFUL_LEN <= tokens < inputs.mml:
        out.append(f"--max-model-len {tokens} (what tp={closest.tp} pp={closest.pp} holds)")
    if inputs.sizing.kv_dtype_bytes() > 1:
        fp8 = Sizing(inputs.sizing.shape, replace(inputs.sizing.args, kv_cache_dtype="fp8"))
        if inputs.size(closest.tp, closest.pp, sizing=fp8).fits:
            out.append("--kv-cache-dtype fp8 (halves the KV cache)")
    if inputs.weights and not inputs.sizing.quant_method():
        plain = mm.dtype_bytes(inputs.sizing.load_dtype())
        for label, per in QUANT_TRIES:
            smaller = int(inputs.weights * per / plain)
            if per < plain and inputs.size(closest.tp, closest.pp, weights=smaller).fits:
                out.append(f"{label}: ~{smaller / GIB:.0f} GiB of weights")
                break
    return out


def _fewest_gpus(inputs: _Inputs, gpus: int) -> Layout | None:
    """The smallest layout beyond `gpus` GPUs of this size that fits, up to MAX_SEARCH_GPUS."""
    shape = inputs.sizing.shape
    valid = pm.valid_tp_sizes(shape.heads, max_tp=MAX_SEARCH_GPUS, **shape.tp_kwargs())
    found = [(t * p, t, p) for t in valid for p in inputs.pp_sizes(t, MAX_SEARCH_GPUS) if t * p > gpus]
    for _, t, p in sorted(found, key=lambda x: (x[0], x[2])):
        lay = inputs.size(t, p)
        if lay.fits:
            return lay
    return None


def serve_command(model: str, tp: int, pp: int, max_model_len: int | None, replicas: int = 1) -> str:
    from vllm_doctor.command import Command
    from vllm_doctor.command.edits import SetFlag

    edits = [SetFlag(TP_FLAG, str(tp))]
    if pp > 1:
        edits.append(SetFlag(PP_FLAG, str(pp)))
    if replicas > 1:
        edits.append(SetFlag(DP_FLAG, str(replicas)))
    if max_model_len:
        edits.append(SetFlag(MML_FLAG, str(max_model_len)))
    return Command.from_args({"model": model}).apply(edits).render()
