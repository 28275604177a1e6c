"""Sizing a model for vLLM: the dtype it loads in, weight bytes, KV bytes per token per GPU, context lengths
as vLLM parses them, GPU memory per device, and which GPUs talk directly.

The one reader of these numbers for `plan`, `check` and the memory/parallel remedies, so that the three
agree: each builds a :class:`Sizing` from a :class:`~vllm_doctor.facts.shape.ModelShape` and the launch
arguments that change sizes (:class:`LoadArgs`: ``--dtype``, ``--kv-cache-dtype``, ``--quantization``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.facts import Facts
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.numbers import as_int, parse_float
from vllm_doctor.vllm_math import memory as mm

GIB = mm.GIB
MIB = mm.MIB
ACTIVATION_GIB = 2.0          # per GPU: profile-run activations + CUDA context + NCCL/graph buffers


# Bytes per parameter of a quantized linear layer (packed weights + group scales/zeros), by method.
QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "compressed-tensors": 1.0, "mxfp4": 0.55,
               "awq": 0.55, "awq_marlin": 0.55, "gptq": 0.55, "gptq_marlin": 0.55, "marlin": 0.55,
               "bitsandbytes": 0.55, "gguf": 0.6}
GROUP_OVERHEAD = 0.05         # bytes per parameter the scales/zeros of a sub-8-bit group add
ONLINE_QUANT = ("fp8", "bitsandbytes")   # --quantization that vLLM applies to an unquantized checkpoint
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _dtype_name(value: Any) -> str:
    d = str(value or "").strip().lower().replace("torch.", "")
    return _DTYPE_ALIASES.get(d, d)


@dataclass(frozen=True)
class LoadArgs:
    """The launch arguments that change sizes (None: not given, vLLM's 'auto')."""
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None

    @classmethod
    def from_facts(cls, facts: Any) -> "LoadArgs":
        get = (lambda key: facts.get(key)) if facts is not None else (lambda key: None)
        return cls(get("args.dtype"), get("args.kv_cache_dtype"), get("args.quantization"))


@dataclass(frozen=True)
class Weights:
    bytes: int | None
    source: str = ""             # how the number was found ('' when unknown)

    @property
    def gib(self) -> float | None:
        return None if self.bytes is None else self.bytes / GIB

    @property
    def estimated(self) -> bool:
        return self.source.startswith("estimated")


@dataclass(frozen=True)
class KVPerToken:
    bytes: int                   # KV-cache bytes one token costs on one GPU
    formula: str                 # the arithmetic, for a person to check


@dataclass(frozen=True)
class Sizing:
    shape: ModelShape
    args: LoadArgs = field(default_factory=LoadArgs)

    @classmethod
    def from_facts(cls, facts: Any) -> "Sizing":
        return cls(ModelShape.from_facts(facts), LoadArgs.from_facts(facts))

    # ------------------------------------------------------------------ dtypes
    def load_dtype(self) -> str:
        """The dtype vLLM loads the weights in: --dtype, else the config's (float32 configs load in 16 bits,
        as vLLM's _resolve_auto_dtype downcasts them)."""
        d = _dtype_name(self.args.dtype)
        if d in ("", "auto", "none"):
            d = _dtype_name(self.shape.dtype) or "bfloat16"
            if d == "float32":
                d = "float16"
        return d

    def kv_dtype_bytes(self) -> int:
        kv = self.args.kv_cache_dtype
        if kv in (None, "", "auto"):
            return mm.dtype_bytes(self.load_dtype())
        return mm.dtype_bytes(kv)

    def quant_method(self) -> str | None:
        """The checkpoint's quantization, else the one --quantization asks for on the fly."""
        q = self.shape.quant_method or self.args.quantization
        return str(q).lower() if q not in (None, "", "None") else None

    def _param_bytes(self, bits: int | None = None) -> float:
        """Bytes per parameter of a quantized (or plain) linear layer as loaded; `bits`: a mixed scheme's
        part at its own width (else the checkpoint's)."""
        quant = self.quant_method()
        per = QUANT_BYTES.get(quant) if quant else None
        bits = bits or (self.shape.quant_bits if self.shape.quant_method else None)
        if bits and 0 < bits <= 8:
            per = bits / 8 + (GROUP_OVERHEAD if bits < 8 else 0.0)
        return per if per is not None else float(mm.dtype_bytes(self.load_dtype()))

    # ------------------------------------------------------------------ weights
    def weights(self) -> Weights:
        """Total weight bytes as loaded: the checkpoint's size (rescaled when vLLM loads an unquantized
        checkpoint in another dtype or quantizes it on the fly), else estimated from config.json with the
        quantization's bytes per parameter. A quantized model is never 'unknown' for being quantized."""
        wb = self.shape.weight_bytes
        if wb:
            return self._from_checkpoint(wb)
        s = self.shape
        if not (s.hidden and s.layers and s.heads):
            return Weights(None, "")
        moe = s.moe_intermediate or (s.intermediate if s.experts else None)
        mla = (s.kv_lora_rank, s.q_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim or 0, s.v_head_dim) \
            if s.mla and s.qk_nope_head_dim and s.v_head_dim else None
        attn, mlp = mm.layer_params(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate,
                                    num_experts=s.experts, moe_intermediate=moe, mla=mla)
        if s.attn_output_gate:      # Qwen3-Next/3.5: q_proj also yields a gate as wide as the query
            attn += s.hidden * s.heads * (s.head_dim or s.hidden // s.heads)
        linear = s.linear_layers if s.linear_mixer_params and s.linear_layers else 0
        attn, mlp = attn * (s.layers - linear) + (s.linear_mixer_params or 0) * linear, mlp * s.layers
        if s.experts and moe:       # shared experts on every MoE layer; dense layers have one plain MLP instead
            dense = s.dense_layers or 0
            mlp += 3 * s.hidden * ((s.layers - dense) * (s.shared_expert_intermediate or 0)
                                   + dense * ((s.dense_intermediate or s.intermediate or 0) - moe * s.experts))
        # embeddings + lm_head stay unquantized, and so does a vision tower (quantizers leave it out), unless a
        # mixed scheme quantizes lm_head
        head = 0 if s.tied_embeddings else (s.vocab or 0) * s.hidden
        embed = (s.vocab or 0) * s.hidden + (s.vision_params or 0)
        per, plain = self._param_bytes(), mm.dtype_bytes(self.load_dtype())
        attn_per, mlp_per = self._param_bytes(s.quant_bits_attention), self._param_bytes(s.quant_bits_mlp)
        head_per = self._param_bytes(s.quant_bits_lm_head) if s.quant_bits_lm_head else plain
        total = attn * attn_per + mlp * mlp_per + head * head_per + embed * plain
        params = attn + mlp + head + embed
        if attn_per != mlp_per:
            label = (f"estimated from config.json: ~{params / 1e9:.1f}B parameters; attention x {attn_per:g}, "
                     f"MLP x {mlp_per:g} bytes")
        else:
            label = f"estimated from config.json: ~{params / 1e9:.1f}B parameters x {per:g} bytes"
        if embed and per != plain:
            label += f" (embeddings x {plain})"
        return Weights(int(total), label)

    def _from_checkpoint(self, wb: int) -> Weights:
        method = self.shape.weight_bytes_method or ""
        base = method if method.startswith("model table") else "checkpoint size"   # no files here: the table's
        if self.shape.quant_method:
            return Weights(wb, base)                     # pre-quantized: loaded as stored
        stored = mm.dtype_bytes(self.shape.dtype)
        if self.quant_method() in ONLINE_QUANT:
            ratio, why = self._param_bytes() / stored, f"--quantization {self.args.quantization}"
        else:
            ratio, why = mm.dtype_bytes(self.load_dtype()) / stored, f"--dtype {self.load_dtype()}"
        if ratio == 1:
            return Weights(wb, base)
        return Weights(int(wb * ratio), f"{base} x {ratio:g} ({why})")

    # ------------------------------------------------------------------ KV cache
    def kv_per_token(self, tp: int = 1, pp: int = 1) -> KVPerToken | None:
        """KV-cache bytes per token per GPU for a layout (None when the config is unknown).

        Full attention: 2 x layers of the largest stage x max(1, K // tp) x head_size x dtype bytes; MLA:
        layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes, the same on every rank.
        """
        s = self.shape
        if not s.layers:
            return None
        tp, pp = max(1, int(tp or 1)), max(1, int(pp or 1))
        nbytes = self.kv_dtype_bytes()
        stage = mm.layers_per_stage(s.layers, pp)
        if s.mla:
            rope = s.qk_rope_head_dim or 0
            b = mm.kv_bytes_per_token(s.layers, dtype_bytes=nbytes, tp=tp, pp=pp, use_mla=True,
                                      kv_lora_rank=s.kv_lora_rank, qk_rope_head_dim=rope)
            return KVPerToken(b, f"MLA: {stage} layers x ({s.kv_lora_rank} + {rope}) x {nbytes} bytes = "
                                 f"{mm.fmt_bytes(b)} per token")
        kv, head_dim = s.total_kv_heads, s.head_dim
        if not kv or not head_dim:
            return None
        b = mm.kv_bytes_per_token(s.layers, kv, head_dim, nbytes, tp=tp, pp=pp)
        return KVPerToken(b, f"2 x {stage} layers x {mm.kv_heads_per_gpu(kv, tp)} KV heads/GPU x {head_dim} x "
                             f"{nbytes} bytes = {mm.fmt_bytes(b)} per token")


def parse_len(value: Any) -> int | None:
    """--max-model-len as vLLM reads it: 4096, '32k' (x1000), '32K' (x1024), '1m'; auto/-1 -> None.

    vLLM's human_readable_int (vllm/engine/arg_utils.py): lowercase k/m/g are decimal, uppercase K/M/G
    binary. This is the only reader of such lengths in vllm-doctor.
    """
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip().replace(",", "")
    if text in ("", "auto", "-1", "None"):
        return None
    mult = {"k": 1000, "K": 1024, "m": 1000 ** 2, "M": 1024 ** 2, "g": 1000 ** 3, "G": 1024 ** 3}
    factor = mult.get(text[-1], 1)
    number = parse_float(text[:-1] if factor != 1 else text)     # `nan`, `1e999`, 5000 digits: no length
    return None if number is None else as_int(number * factor)




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

