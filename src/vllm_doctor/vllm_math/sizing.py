"""Sizing a model for vLLM from its facts: the dtype it loads in, weight bytes, KV bytes per token per GPU,
context lengths as vLLM parses them, GPU memory per device, and which GPUs talk directly.

One reader of these numbers for `plan`, `check` and the memory remedies, so that the three agree.
"""
from __future__ import annotations

from typing import Any

from vllm_doctor.facts import Facts, gpus
from vllm_doctor.numbers import as_int as _int
from vllm_doctor.vllm_math import memory as mm

GIB = mm.GIB
MIB = mm.MIB
ACTIVATION_GIB = 2.0          # per GPU: profile-run activations + CUDA context + NCCL/graph buffers

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
