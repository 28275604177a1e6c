"""The memory model: what vLLM will report at start-up for a model, a launch and a GPU, before it runs.

vLLM sizes its KV cache after a profiling run on the real GPU (``gpu_worker.determine_available_memory``)::

    KV memory = total x gpu_memory_utilization - (weights + activation peak + non-torch memory
                                                  [+ CUDA-graph memory, from 0.20.0])
    KV tokens = floor(KV memory / page bytes of one block of every layer slot) x block size

This module predicts each term per GPU without the GPU:

* weights: the checkpoint (safetensors headers) or the config's parameter count, as loaded
  (``sizing.Sizing.weights``), divided over tensor x pipeline ranks;
* activation peak: the profile run pushes ``max_num_batched_tokens`` tokens through the model and a sampler
  pass over ``max_num_seqs`` rows of fp32 logits; on real logs the peak follows the vocabulary and barely
  the tensor-parallel size or the MLP (the logits are the largest live tensors):
  ``A = a0 + a_tok x T x hidden x dtype + a_logit x min(S, T) x vocab x 4``; a multimodal model's profile also
  runs its vision tower on the largest images the encoder budget holds, and the larger of the two peaks counts
  (:func:`encoder_peak_gib`);
* non-torch memory: the CUDA context and, with tensor parallel, NCCL and custom all-reduce buffers;
* CUDA graphs: subtracted only where vLLM profiles them (0.20.0+, unless ``--enforce-eager``); their
  memory grows with the layers captured (one set of graph nodes per layer and batch size);
* layer slots: full attention counts every layer; vLLM's hybrid allocator (sliding + full attention,
  0.10.0+) shares one page among ``group`` layers of each kind and reports tokens per group, so its
  figure divides by ``group x number of groups``; linear-attention / Mamba layers hold a state per request,
  not per token, so only the full-attention layers count.

The coefficients (:data:`CALIBRATION`) were fitted on two thirds of real start-up logs that print both the
inputs and vLLM's figures (tests/data/memory_cases, `bench/memory_model.py` refits and prints the error on
the held-out third). ``plan``, ``check`` and the memory remedies all size memory through :func:`predict`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from vllm_doctor.command.versions import at_least
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import Sizing

GIB = mm.GIB


@dataclass(frozen=True)
class Calibration:
    """Fitted on the calibration two thirds of tests/data/memory_cases (see bench/memory_model.py)."""
    a0_gib: float = 0.416        # activation floor (allocator blocks, small buffers)
    a_tok: float = 0.0           # copies of the hidden states (batched tokens x hidden) live at the peak
    a_logit: float = 3.519       # copies of the fp32 logits the sampler pass holds at its peak
    non_torch_gib: float = 0.25  # CUDA context and allocator slack, one GPU
    non_torch_tp_gib: float = 1.86   # more with tensor parallel: NCCL and custom all-reduce buffers
    graph_gib: float = 0.375         # CUDA graphs (0.20.0+): a base, plus some per layer of the stage
    graph_gib_per_layer: float = 0.0163
    encoder_peak: float = 1.0        # the vision tower's profile peak, as its structure gives it (not fitted)


CALIBRATION = Calibration()


@dataclass(frozen=True)
class Launch:
    """What changes vLLM's memory figures, besides the model: the layout and the launch's knobs."""
    total_gib: float                       # one GPU's total memory
    tp: int = 1
    pp: int = 1
    utilization: float | None = None       # None: the version's default
    version: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    block_size: int = mm.DEFAULT_BLOCK
    weights_gib: float | None = None       # per GPU, when known (the log's "Model loading took")


@dataclass
class MemoryPrediction:
    """Per GPU, in GiB, as vLLM would report them; tokens as "GPU KV cache size"."""
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_gib: float
    kv_tokens: int
    kv_bytes_per_token: int
    layer_slots: int
    max_model_len: int | None = None       # the request length concurrency is counted for
    concurrency: float | None = None
    largest_max_model_len: int = 0         # one request of it fits the KV cache
    confidence: str = "high"
    assumptions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}

    def arithmetic(self) -> str:
        graphs = f" - {self.cuda_graph_gib:.2f} (CUDA graphs)" if self.cuda_graph_gib else ""
        return (f"{self.requested_gib:.2f} GiB (total x utilization) - {self.weights_gib:.2f} (weights) - "
                f"{self.activation_gib:.2f} (activation peak) - {self.non_torch_gib:.2f} (non-torch){graphs} = "
                f"{self.kv_gib:.2f} GiB KV cache = {mm.fmt_tokens(self.kv_tokens)} tokens")


def default_batched_tokens(version: str | None, max_model_len: int | None) -> int:
    """The profile run's token count when --max-num-batched-tokens is not given: the V1 engine's chunked
    prefill default (8192 from 0.10.0, 2048 before); V0 without chunked prefill took max_model_len."""
    if at_least(version, "0.10.0"):
        return 8192
    if version and not at_least(version, "0.8.0"):
        return max(2048, min(max_model_len or 2048, 32768))
    return 2048


def default_max_num_seqs(version: str | None) -> int:
    return 1024 if at_least(version, "0.10.0") else 256


def layer_slots(sizing: Sizing, pp: int, version: str | None, every_layer: bool = False) -> int:
    """The layers one token's KV is counted over in vLLM's "GPU KV cache size" (see the module doc)."""
    s = sizing.shape
    layers = mm.layers_per_stage(s.layers or 0, pp)
    full, sliding = s.full_attention_layers, s.sliding_layers
    if every_layer:                 # the public calculators' count
        return layers
    if full and s.linear_layers and not sliding:
        # linear-attention / Mamba layers keep one state per request, not KV per token: V0 holds it apart
        # (MambaCacheManager), V1's hybrid allocator gives it groups of its own whose pages a request takes
        # once; the token figure is the attention layers' pages
        return mm.layers_per_stage(full, pp)
    if not (full and sliding) or not at_least(version, "0.10.0"):
        return layers
    full, sliding = mm.layers_per_stage(full, pp), mm.layers_per_stage(sliding, pp)
    group = min(full, sliding)
    groups = -(-full // group) + -(-sliding // group)
    return group * groups


def predict(sizing: Sizing, launch: Launch, cal: Calibration = CALIBRATION, *,
            every_layer: bool = False) -> MemoryPrediction | None:
    """vLLM's start-up memory figures for this model and launch, per GPU (None: the config is unknown).
    `every_layer`: count every layer's KV per token (the public calculators' arithmetic, for `naive`)."""
    s = sizing.shape
    if not (s.layers and s.hidden):
        return None
    tp, pp = max(1, launch.tp), max(1, launch.pp)
    notes: list[str] = []
    confidence = "high"
    u = launch.utilization if launch.utilization is not None else mm.default_utilization(launch.version)
    if launch.utilization is None:
        notes.append(f"--gpu-memory-utilization {u:g} (the default of vLLM {launch.version or 'latest'})")
    requested = launch.total_gib * u
    if launch.weights_gib is not None:
        weights = launch.weights_gib
    else:
        w = sizing.weights()
        if not w.bytes:
            return None
        weights = w.bytes / GIB / (tp * pp)
        if w.estimated:
            notes.append(f"weights {w.source}")
    dtype_b = mm.dtype_bytes(sizing.load_dtype())
    tokens = launch.max_num_batched_tokens or default_batched_tokens(launch.version, launch.max_model_len)
    seqs = launch.max_num_seqs or default_max_num_seqs(launch.version)
    activation = cal.a0_gib + (cal.a_tok * tokens * s.hidden * dtype_b
                               + cal.a_logit * min(seqs, tokens) * (s.vocab or 32000) * 4) / GIB
    encoder = cal.encoder_peak * encoder_peak_gib(s, tokens, seqs, launch.max_model_len or s.derived_max_len)
    if encoder and cal.a0_gib + encoder > activation:
        activation = cal.a0_gib + encoder
        notes.append(f"activation peak: the vision tower's profile on its largest images ({encoder:.2f} GiB)")
    non_torch = cal.non_torch_gib + (cal.non_torch_tp_gib if tp > 1 else 0.0)
    graphs = 0.0
    if at_least(launch.version, "0.20.0") and not launch.enforce_eager:
        graphs = cal.graph_gib + cal.graph_gib_per_layer * mm.layers_per_stage(s.layers, pp)
        notes.append("CUDA-graph memory counted before the KV cache (vLLM 0.20.0+)")
    kv_gib = requested - weights - activation - non_torch - graphs
    slots = layer_slots(sizing, pp, launch.version, every_layer)
    per_token = sizing.kv_per_token(tp, pp)
    if per_token is None or not slots:
        return None
    layers = mm.layers_per_stage(s.layers, pp)
    bpt = per_token.bytes * slots // max(1, layers)          # bytes per reported token
    block = max(1, launch.block_size)
    kv_tokens = mm.round_down_to_block(kv_gib * GIB / bpt, block) if kv_gib > 0 else 0
    if s.experts or s.mla:
        confidence = "medium"
    if s.full_attention_layers and s.sliding_layers or s.linear_layers:
        confidence = "low"
        notes.append("hybrid attention: vLLM's figure counts layer groups, the real capacity per request differs")
    if sizing.quant_method():
        confidence = "medium" if confidence == "high" else confidence
    if launch.version and not at_least(launch.version, "0.8.0"):
        confidence = "low"          # the V0 engine profiles whole sequences: its peak is not modelled here
        notes.append(f"vLLM {launch.version} (V0 engine): its profiling peak is not modelled; on real V0 logs the "
                     f"KV figure was off by up to 45 %")
    mml = launch.max_model_len or s.derived_max_len
    conc = kv_tokens / mml if mml else None
    return MemoryPrediction(requested, weights, activation, non_torch, graphs, kv_gib, kv_tokens, bpt, slots, mml,
                            conc, mm.round_down_to_block(kv_tokens, block), confidence, notes)


def encoder_peak_gib(s: Any, batched_tokens: int, seqs: int, max_model_len: int | None) -> float:
    """The vision tower's peak in vLLM's profile run, which feeds it as many of the largest images as the
    encoder budget holds (v1 worker utils get_max_items: the budget is max(batched tokens, one image's tokens),
    at most max_num_seqs x the images one request can carry), on top of the activation floor; 0 for a text
    model. The profile's peak is the larger of this and the text pass."""
    per_item, peak = s.vision_tokens_per_item, s.vision_peak_bytes_per_item
    if not (per_item and peak):
        return 0.0
    per_prompt = max(1, (max_model_len or per_item) // per_item)
    items = max(1, min(max(batched_tokens, per_item) // per_item, seqs * per_prompt))
    return items * peak / GIB


def room_for_weights(sizing: Sizing, launch: Launch, cal: Calibration = CALIBRATION) -> float | None:
    """GiB per GPU the weights may take before no KV cache is left: total x utilization minus the
    activation peak, non-torch memory and CUDA graphs (None: the config is unknown)."""
    p = predict(sizing, replace(launch, weights_gib=0.0), cal)
    return None if p is None else p.requested_gib - p.activation_gib - p.non_torch_gib - p.cuda_graph_gib


def naive(sizing: Sizing, launch: Launch) -> MemoryPrediction | None:
    """The public calculators' arithmetic, for comparison: weights + KV, nothing else."""
    zero = Calibration(a0_gib=0.0, a_tok=0.0, a_logit=0.0, non_torch_gib=0.0, non_torch_tp_gib=0.0, graph_gib=0.0,
                       graph_gib_per_layer=0.0, encoder_peak=0.0)
    u = launch.utilization if launch.utilization is not None else mm.default_utilization(launch.version)
    plain = Launch(**{**launch.__dict__, "version": "0.9.0", "utilization": u})  # no graphs, full-attention slots
    return predict(sizing, plain, zero, every_layer=True)
