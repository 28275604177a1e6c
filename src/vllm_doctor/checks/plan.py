"""`vllm-doctor plan MODEL`: every (tensor, pipeline) layout vLLM accepts for a model on some GPUs, ranked.

The sizes come from ``vllm_math.parallel.valid_tp_sizes`` (vLLM's real rules: heads, KV heads, padded
vocabulary, MLP / MoE sizes, quantization groups, vision tower), never from "largest power of two" or
"ceil(memory / per-GPU)" — which vLLM rejects for 40-, 28- or 52-head models. Memory per layout:

* weights per GPU ``W / (tp x pp)`` (``model.weight_bytes`` or an estimate from config.json);
* KV budget per GPU ``u x T - W/(tp x pp) - A`` where ``A`` (``ACTIVATION_GIB``) is a stated allowance for
  the profile run's activations, the CUDA context, NCCL and CUDA-graph buffers (vLLM measures the real
  value at start-up);
* KV capacity in tokens ``floor(budget / kv_bytes_per_token / block) x block``; the layout fits when one
  request of ``max_model_len`` tokens fits.

The sizing comes from ``vllm_math.sizing``, which ``check`` and the memory remedies use too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import Facts
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm
from vllm_doctor.vllm_math.sizing import ACTIVATION_GIB, GIB, Sizing, domains

TP_FLAG = "--tensor-parallel-size"
PP_FLAG = "--pipeline-parallel-size"
MML_FLAG = "--max-model-len"


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
                "kv_bytes_per_token": self.kv_bytes_per_token,
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


def size_layout(sizing: Sizing, tp: int, pp: int, gpu_gib: float | None, util: float, mml: int | None,
                weights: int | None, block: int = mm.DEFAULT_BLOCK) -> Layout:
    lay = Layout(tp, pp, tp * pp)
    kv = sizing.kv_per_token(tp, pp)
    lay.kv_bytes_per_token = kv.bytes if kv else None
    if weights:
        lay.weights_per_gpu = weights / (tp * pp) / GIB
    if gpu_gib and lay.weights_per_gpu is not None:
        lay.kv_gib = util * gpu_gib - lay.weights_per_gpu - ACTIVATION_GIB
        bpt = lay.kv_bytes_per_token
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
    sizing = Sizing.from_facts(facts)
    shape = sizing.shape
    heads = shape.heads
    if not heads:
        raise PlanError(f"no attention-head count for {model!r}: give a model directory with a config.json")
    if gpus < 1:
        raise PlanError("--gpus must be at least 1")
    layers = shape.layers
    valid = pm.valid_tp_sizes(heads, max_tp=gpus, **shape.tp_kwargs())
    util = utilization or mm.default_utilization(facts.get("vllm.version"))
    derived = shape.derived_max_len
    mml, mml_src = (max_model_len, "--max-model-len") if max_model_len else (derived, "model's derived maximum")
    weighed = sizing.weights()
    weights, wsrc = weighed.bytes, weighed.source
    pp_ok = pm.pp_supported(facts.get("vllm.version"))
    dom = domains(facts, gpus)
    largest = len(dom[0][0]) if dom else None
    layouts: list[Layout] = []
    for t in valid:
        for p in range(1, gpus // t + 1):
            if p > 1 and (not pp_ok or (layers and p > layers)):
                continue
            lay = size_layout(sizing, t, p, gpu_gib, util, mml, weights)
            if largest is not None:
                lay.in_domain = t <= largest
                if not lay.in_domain:
                    lay.notes.append(f"tp={t} spans {dom[1]} domains (largest has {largest} GPUs): "
                                     "all-reduce crosses the slow link")
            if p > 1:
                lay.notes.append(f"{p} pipeline stages: higher single-request latency")
            if lay.world < gpus:
                lay.notes.append(f"{gpus - lay.world} of {gpus} GPUs idle")
            kv = shape.kv_heads
            if shape.use_mla and t > 1:
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
