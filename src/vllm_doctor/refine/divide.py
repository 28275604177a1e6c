"""vLLM's `divide()` asserts `A is not divisible by B` for every sharded dimension: which one was it?
Attention heads, KV heads, or another tensor dimension (vocabulary, MLP, vision tower)."""
from __future__ import annotations

import regex

from vllm_doctor.findings import RefineContext
from vllm_doctor.numbers import as_int as _to_int
from vllm_doctor.rules.search import bounded_search
from vllm_doctor.vllm_math import parallel as pm

KV_RULE = "tp-kv-heads-indivisible"
SHAPE_RULE = "tp-shape-indivisible"
HEADS_RULE = "tp-heads-indivisible"

_KV_CODE = regex.compile(r"total_num_kv_heads|num_kv_head_replicas|num_key_value_heads|kv_heads")
_VOCAB_CODE = regex.compile(r"vocab|num_embeddings|_get_indices")
_MLP_CODE = regex.compile(r"intermediate|output_size|input_size|output_partition_sizes")
_VISION_FILE = regex.compile(r"intern_vit|siglip|clip\.py|vision|visual|pixtral|idefics2_vision|radio")
_HEADS_CODE = regex.compile(r"total_num_heads|num_attention_heads|num_heads")


def classify(ctx: RefineContext) -> str | None:
    """Relabel `AssertionError: A is not divisible by B` (vLLM's divide()) by what A and B are."""
    caps = ctx.match.captures
    a, b = _to_int(caps.get("numerator")), _to_int(caps.get("denominator"))
    if a is None or b is None:
        return None
    tp, kv, vision, vocab, inter = (_to_int(ctx.facts.get(key)) for key in (
        "args.tensor_parallel_size", "model.num_kv_heads", "model.vision_num_heads", "model.vocab_size",
        "model.intermediate_size"))

    # 1. the traceback: the innermost vLLM frame that called divide() tells which dimension it was
    frames = ctx.traceback.frames if ctx.traceback is not None else []
    for fr in reversed(frames):
        code, file = fr.code or "", fr.file
        if "ensure_divisibility" in code or code.strip().startswith("assert numerator"):
            continue
        if "divide(" not in code and "Parallel" not in code:
            continue
        if bounded_search(_KV_CODE, code):
            return KV_RULE
        if bounded_search(_VOCAB_CODE, code) or "vocab_parallel_embedding" in file:
            return SHAPE_RULE
        if bounded_search(_HEADS_CODE, code):
            return HEADS_RULE
        if bounded_search(_MLP_CODE, code):
            return SHAPE_RULE
        break
    vision_tb = any(bounded_search(_VISION_FILE, fr.file) for fr in frames[-6:])

    # 2. the numbers against the model config
    if kv and ((a == kv and b == (tp or b)) or (a == (tp or a) and b == kv and a != kv)):
        return KV_RULE
    if vision and a == vision:
        return HEADS_RULE
    if vocab and a in (vocab, pm.padded_vocab(vocab)):
        return SHAPE_RULE
    if inter and a == inter:
        return SHAPE_RULE
    if vision_tb and a <= 128:
        return HEADS_RULE
    # 3. no config: a head count is small, a tensor dimension is not
    if a <= 128 and (tp is None or b == tp or a == tp):
        return KV_RULE
    return SHAPE_RULE
