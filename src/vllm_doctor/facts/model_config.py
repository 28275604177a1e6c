"""Normalise a model's config (a plain dict: config.json, or a transformers config's to_dict()) into
`model.*` facts, following the attribute names vLLM itself looks at (see docs/reference/vllm-messages.md §4 and
vLLM's ModelConfig.get_total_num_kv_heads / get_head_size / _get_and_verify_max_len).
"""
from __future__ import annotations

import re
from typing import Any

from vllm_doctor.numbers import as_float, as_int, parse_int

SOURCE = "config.json"

# Where multimodal configs keep their language model (vLLM uses the text part for heads, layers, length).
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
# Order as in vLLM's get_total_num_kv_heads (num_attention_groups: Step3p5 at HEAD).
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                "num_attention_groups")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff")
EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size", "n_vocab")
# vLLM's possible_keys for the derived max_model_len (min over those present), in vLLM's order.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
DEFAULT_MAX_LEN = 2048  # vLLM's fallback when no key is present
FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")
# model_types vLLM treats as DeepSeek-style MLA (when kv_lora_rank is set).
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2", "kimi_linear", "kimi_vl", "kimi_k25",
             "longcat_flash", "pangu_ultra_moe")


def _first(cfg: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return None


def _count(value: Any) -> int | None:
    """A size or count as config.json should hold it: a whole number >= 0 (`"32"` too). A string of words,
    a list, 4096.5, -3, NaN or 10**30 is no size: the fact is left out rather than carried as junk."""
    if isinstance(value, float):
        number = as_int(value) if value.is_integer() else None      # NaN and ±inf are not integers either
    else:
        number = parse_int(value) if isinstance(value, str) else as_int(value) if isinstance(value, int) else None
    return number if number is not None and number >= 0 else None


def _length(value: Any) -> float | None:
    """A context length or a scaling factor: a number (not a bool, not text) of sane magnitude."""
    return as_float(value) if isinstance(value, (int, float)) else None


def text_part(cfg: dict) -> dict:
    """The language-model part of a (possibly multimodal) config; falls back to the top level."""
    thinker = cfg.get("thinker_config")
    if isinstance(thinker, dict) and isinstance(thinker.get("text_config"), dict):
        return thinker["text_config"]
    for key in TEXT_CONFIG_KEYS:
        sub = cfg.get(key)
        if isinstance(sub, dict) and _first(sub, HEAD_KEYS + LAYER_KEYS + HIDDEN_KEYS) is not None:
            return sub
    return cfg


def kv_heads(text: dict, heads: int | None) -> int | None:
    model_type = text.get("model_type")
    new_falcon = model_type in FALCON_TYPES and text.get("new_decoder_architecture")
    if text.get("multi_query") and not new_falcon:
        return 1  # MQA (Falcon-7B, GPTBigCode): one KV head
    attn = text.get("attn_config")
    if isinstance(attn, dict) and attn.get("kv_n_heads") is not None:  # MPT / DBRX
        return _count(attn["kv_n_heads"])
    value = _first(text, KV_HEAD_KEYS)
    return heads if value is None else _count(value)


def derived_max_len(text: dict, tokenizer_config: dict | None = None) -> tuple[float | int, str | None]:
    """vLLM's derived max_model_len and the key it names in the error message."""
    derived: float = float("inf")
    key_used = None
    for key in MAX_LEN_KEYS:
        value = _length(text.get(key))
        if value is not None:
            if value < derived:
                key_used = key
            derived = min(derived, value)
    own = _length(text.get("model_max_length"))
    if own:  # Command-R / Cohere: this key wins outright
        key_used, derived = "model_max_length", own
    tokenizer_max = _length(tokenizer_config.get("model_max_length")) if isinstance(tokenizer_config, dict) else None
    if tokenizer_max is not None:
        derived = min(derived, tokenizer_max)
    if derived == float("inf"):
        derived, key_used = DEFAULT_MAX_LEN, None
    derived = _apply_rope(text, derived)
    if isinstance(derived, float) and derived.is_integer():
        derived = int(derived)
    return derived, key_used


def _rope_entries(text: dict) -> list[dict]:
    # transformers v5 renamed rope_scaling to rope_parameters and may key it by layer type.
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(rope, dict):
        return []
    if all(isinstance(v, dict) for v in rope.values()) and rope:
        return list(rope.values())
    return [rope]


def _apply_rope(text: dict, derived: float) -> float:
    entries = _rope_entries(text)
    if not entries or "gemma3" in str(text.get("model_type", "")):
        return derived  # Gemma3's length already includes its RoPE scaling
    factor = 1.0
    for rope in entries:
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type in ("su", "longrope", "llama3"):
            continue  # these keep max_position_embeddings as the limit
        factor = _length(rope.get("factor")) or factor      # a factor that is no number changes nothing
        original = _length(rope.get("original_max_position_embeddings"))
        if rope_type == "yarn" and original:
            derived = original
    derived = derived * factor
    return derived if as_float(derived) is not None else DEFAULT_MAX_LEN


def _dtype(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).replace("torch.", "")


def _part(target: str) -> str | None:
    """Which part of a layer a quantization group's target names (a module path, a `re:` pattern):
    attention, mlp (experts, shared experts, dense MLP) or lm_head; None for a class name like `Linear`."""
    t = target.lower()
    if "lm_head" in t:
        return "lm_head"
    if "attn" in t or "attention" in t or re.search(r"\b[qkvo]_proj|qkv", t):
        return "attention"
    if "mlp" in t or "expert" in t or "feed_forward" in t or re.search(r"(gate|up|down)_proj|\bw[123]\b", t):
        return "mlp"
    return None


def quant_facts(qcfg: Any) -> dict[str, Any]:
    if not isinstance(qcfg, dict):
        return {}
    out: dict[str, Any] = {"model.quant_method": qcfg.get("quant_method")}
    group = _first(qcfg, ("group_size", "q_group_size"))
    bits = _first(qcfg, ("bits", "w_bit", "num_bits"))
    groups = qcfg.get("config_groups")  # compressed-tensors / modelopt keep them per group
    if isinstance(groups, dict):
        group_bits = []
        parts: dict[str, int] = {}
        for grp in groups.values():
            weights = grp.get("weights") if isinstance(grp, dict) else None
            if isinstance(weights, dict):
                group = group if group is not None else weights.get("group_size")
                if n := _count(weights.get("num_bits")):
                    group_bits.append(n)
                    for part in {_part(str(t)) for t in grp.get("targets") or ()} - {None}:
                        parts[part] = min(n, parts.get(part, n))
        # mixed schemes (8-bit attention, 4-bit experts): the fewest bits are the bulk of an MoE's weights
        bits = bits if bits is not None else (min(group_bits) if group_bits else None)
        if len(set(group_bits)) > 1:   # each part at its own group's bits (modelopt MIXED_PRECISION)
            out["model.quant_bits_attention"] = parts.get("attention")
            out["model.quant_bits_mlp"] = parts.get("mlp")
            out["model.quant_bits_lm_head"] = parts.get("lm_head")
    out["model.quant_group_size"] = as_int(group)        # -1: per channel (no group), kept as such
    out["model.quant_bits"] = _count(bits)
    out["model.quant_weight_block_size"] = qcfg.get("weight_block_size")
    return out


def layer_kinds(text: dict, layers: int | None) -> dict[str, Any]:
    """How many layers are full attention, sliding-window attention and linear/state-space, when the config
    mixes them (the keys transformers' and vLLM's configs use): ``layer_types`` (Gemma 3, gpt-oss, Qwen3-Next
    in transformers >= 4.5x), Gemma 2's alternation, Gemma 3's ``sliding_window_pattern``, Jamba/Granite's
    ``layers_block_type``, Qwen3-Next's ``full_attention_interval``. Uniform models give nothing."""
    if not layers:
        return {}
    full = sliding = linear = 0
    types = text.get("layer_types") or text.get("layers_block_type")
    model_type = str(text.get("model_type") or "")
    if isinstance(types, list) and types:
        for t in (str(x).lower() for x in types[:layers]):
            if "sliding" in t or t == "local":
                sliding += 1
            elif t in ("mamba", "linear_attention", "conv", "mamba2") or "linear" in t:
                linear += 1
            else:
                full += 1
    elif model_type == "gemma2" and text.get("sliding_window"):
        sliding, full = (layers + 1) // 2, layers // 2             # even layers slide (vLLM's Gemma2)
    elif as_int(text.get("sliding_window_pattern")) and text.get("sliding_window"):
        every = as_int(text.get("sliding_window_pattern"))
        full = layers // every
        sliding = layers - full
    elif as_int(text.get("full_attention_interval")):
        full = layers // as_int(text.get("full_attention_interval"))
        linear = layers - full
    else:
        return {}
    if (sliding == 0 and linear == 0) or full + sliding + linear == 0:
        return {}
    return {"model.full_attention_layers": full, "model.sliding_layers": sliding or None,
            "model.linear_layers": linear or None}


def normalise(cfg: dict, tokenizer_config: dict | None = None) -> dict[str, Any]:
    """Config dict -> {fact key: value}; None values are dropped."""
    text = text_part(cfg)
    heads = _count(_first(text, HEAD_KEYS))
    hidden = _count(_first(text, HIDDEN_KEYS))
    model_type = cfg.get("model_type")
    text_type = text.get("model_type", model_type)
    out: dict[str, Any] = {
        "model.model_type": model_type,
        "model.text_model_type": text_type if text is not cfg else None,
        "model.architectures": cfg.get("architectures"),
        "model.num_attention_heads": heads,
        "model.num_kv_heads": kv_heads({**text, "model_type": text_type}, heads),
        "model.num_layers": _count(_first(text, LAYER_KEYS)),
        "model.hidden_size": hidden,
        "model.intermediate_size": _count(_first(text, INTERMEDIATE_KEYS)),
        "model.moe_intermediate_size": _count(text.get("moe_intermediate_size")),
        "model.num_experts": _count(_first(text, EXPERT_KEYS)),
        "model.vocab_size": _count(_first(text, VOCAB_KEYS)),
        "model.max_position_embeddings": _count(text.get("max_position_embeddings")),
        "model.dtype": _dtype(_first(cfg, ("torch_dtype", "dtype")) or _first(text, ("torch_dtype", "dtype"))),
        "model.needs_remote_code": bool(cfg.get("auto_map")),
        "model.sliding_window": _count(text.get("sliding_window")) if text.get("use_sliding_window", True) else None,
        "model.tied_embeddings": tied_embeddings(cfg, text, text_type),
    }
    out.update(_moe_layout(text, text_type, out["model.num_layers"], out["model.num_experts"]))
    ffn = text.get("ffn_config")  # DBRX
    if isinstance(ffn, dict):
        out["model.intermediate_size"] = out["model.intermediate_size"] or _count(ffn.get("ffn_hidden_size"))
        out["model.num_experts"] = out["model.num_experts"] or _count(ffn.get("moe_num_experts"))
    out.update(layer_kinds({**text, "model_type": text_type}, out["model.num_layers"]))
    derived, key = derived_max_len(text, tokenizer_config)
    out["model.derived_max_model_len"] = derived
    out["model.derived_max_model_len_key"] = key
    out.update(quant_facts(cfg.get("quantization_config") or text.get("quantization_config")))
    out.update(_head_dim_facts(text, text_type, heads, hidden))
    out["model.linear_mixer_params"] = linear_mixer_params(text, hidden) if out.get("model.linear_layers") else None
    out["model.attn_output_gate"] = True if text.get("attn_output_gate") is True else None
    vision = cfg.get("vision_config")
    if isinstance(vision, dict):
        out["model.vision_num_heads"] = _count(_first(vision, HEAD_KEYS))
        out["model.vision_params"] = vision_params(vision, hidden)
        out.update(vision_profile(vision, cfg))
    return {k: v for k, v in out.items() if v is not None}


def linear_mixer_params(text: dict, hidden: int | None) -> int | None:
    """One gated-delta-net linear-attention layer's projections (Qwen3-Next, Qwen3.5; vLLM's
    GatedDeltaNetAttention): in_proj_qkvz (q and k over the key heads, v and the gate z over the value heads),
    in_proj_ba (two scalars per value head) and out_proj. None where the config names no such layer."""
    nk, dk = _count(text.get("linear_num_key_heads")), _count(text.get("linear_key_head_dim"))
    nv, dv = _count(text.get("linear_num_value_heads")), _count(text.get("linear_value_head_dim"))
    if not (hidden and nk and dk and nv and dv):
        return None
    return hidden * (2 * nk * dk + 2 * nv * dv) + hidden * 2 * nv + nv * dv * hidden


def tied_embeddings(cfg: dict, text: dict, text_type: str | None) -> bool:
    """Whether lm_head is the embedding itself: config.json's `tie_word_embeddings` where it says (the text part's
    first), else the class default, which transformers sets True for the Gemma family and False for Llama,
    Qwen, Mistral and most others."""
    for part in (text, cfg):
        if isinstance(part.get("tie_word_embeddings"), bool):
            return part["tie_word_embeddings"]
    return str(text_type or cfg.get("model_type") or "").startswith("gemma")


def vision_widths(vision: dict) -> tuple[int | None, int | None]:
    """The vision tower's width and its MLP's (intermediate_size, else width x mlp_ratio, else 4 x width).
    Qwen2-VL names its width `embed_dim` (its `hidden_size` is the text model's), so `embed_dim` is read first."""
    width = _count(_first(vision, ("embed_dim", "hidden_size", "width")))
    if not width:
        return None, None
    inner = _count(vision.get("intermediate_size"))
    if inner is None and isinstance(vision.get("mlp_ratio"), (int, float)):
        inner = int(width * vision["mlp_ratio"])
    return width, inner or 4 * width


def vision_params(vision: dict, text_hidden: int | None) -> int | None:
    """The vision tower's parameters and its projector's, as the families' code builds them: `layers` blocks of
    attention (4 h^2) and an MLP (2 h i; 3 h i gated, where the activation is SiLU: Qwen2.5-VL, Pixtral), then
    a projector from h (times spatial_merge_size^2 where patches are merged) to the text model's hidden size
    through one hidden layer of the input's width (vision_widths). None: a field is missing."""
    layers = _count(_first(vision, ("depth", "num_hidden_layers", "num_layers")))
    width, inner = vision_widths(vision)
    if not (layers and width and inner):
        return None
    layers += _count(vision.get("num_global_layers")) or 0            # Mllama's global encoder
    gated = any(w in str(vision.get("hidden_act", "")).lower() for w in ("silu", "swish"))
    blocks = layers * (4 * width * width + (3 if gated else 2) * width * inner)
    merged = width * (_count(vision.get("spatial_merge_size")) or 1) ** 2
    out = _count(vision.get("out_hidden_size")) or text_hidden or width
    return blocks + merged * merged + merged * out


# Qwen2-VL/2.5-VL (max_pixels 12845056 = 16384 x 28^2) and Qwen3-VL/3.5 (longest_edge 16777216 = 16384 x 32^2)
# processors: the largest image is 16384 tokens after the merge, whatever the patch size
DYNAMIC_MAX_TOKENS = 16384


def vision_profile(vision: dict, cfg: dict) -> dict[str, Any]:
    """What vLLM's profile run feeds the vision tower (gpu_model_runner.profile_run: a dummy batch of the largest
    images): the tokens one image becomes and the bytes alive at the tower's peak for it, in 16 bits -- a
    block's residual and MLP input (2 x width) and its MLP's hidden state before and after the activation
    (2 x intermediate), per patch. A fixed-size tower (image_size, patch_size: SigLIP, Pixtral) gives
    (image_size / patch_size)^2 patches; a dynamic-resolution one (spatial_merge_size without image_size:
    Qwen-VL) the processor's largest image, DYNAMIC_MAX_TOKENS x merge^2 patches."""
    width, inner = vision_widths(vision)
    merge = _count(vision.get("spatial_merge_size")) or 1
    size, patch = _count(vision.get("image_size")), _count(vision.get("patch_size"))
    if not (width and inner):
        return {}
    if size and patch:
        patches = (size // patch) ** 2
        shuffle = as_float(vision.get("pixel_shuffle_ratio")) or 1.0       # Llama 4: 0.5, a quarter of the patches
        tokens = _count(cfg.get("mm_tokens_per_image")) or max(1, int(patches * shuffle ** 2) // merge ** 2)
    elif merge > 1:
        tokens, patches = DYNAMIC_MAX_TOKENS, DYNAMIC_MAX_TOKENS * merge ** 2
    else:
        return {}
    return {"model.vision_tokens_per_item": tokens,
            "model.vision_peak_bytes_per_item": patches * (2 * width + 2 * inner) * 2}


def _moe_layout(text: dict, model_type: str | None, layers: int | None, experts: int | None) -> dict[str, Any]:
    """An MoE's MLP beside its routed experts, as the model code builds it: the shared expert(s) every token
    passes (Qwen2-MoE's `shared_expert_intermediate_size`, DeepSeek's `n_shared_experts` x
    `moe_intermediate_size`, Llama 4's one shared expert of `intermediate_size`) and its dense layers
    (DeepSeek's `first_k_dense_replace`, Llama 4's layers between `interleave_moe_layer_step`, which use
    `intermediate_size_mlp`)."""
    if not experts:
        return {}
    llama4 = str(model_type or "").startswith("llama4")
    shared = _count(text.get("shared_expert_intermediate_size"))
    if shared is None and _count(text.get("n_shared_experts")) and _count(text.get("moe_intermediate_size")):
        shared = _count(text["n_shared_experts"]) * _count(text["moe_intermediate_size"])
    if shared is None and llama4:
        shared = _count(text.get("intermediate_size"))
    dense, width = _count(text.get("first_k_dense_replace")), _count(text.get("intermediate_size"))
    step = _count(text.get("interleave_moe_layer_step"))
    if llama4 and layers and step and step > 1:
        dense, width = layers - layers // step, _count(text.get("intermediate_size_mlp")) or width
    return {"model.shared_expert_intermediate_size": shared,
            "model.dense_layers": dense if dense and layers and dense < layers else None,
            "model.dense_intermediate_size": width if dense else None}


def _head_dim_facts(text: dict, model_type: str | None, heads: Any, hidden: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv_lora = _count(text.get("kv_lora_rank"))
    rope_dim = _count(text.get("qk_rope_head_dim"))
    nope_dim = _count(text.get("qk_nope_head_dim"))
    out["model.kv_lora_rank"] = kv_lora
    out["model.qk_rope_head_dim"] = rope_dim
    out["model.qk_nope_head_dim"] = nope_dim
    out["model.q_lora_rank"] = _count(text.get("q_lora_rank"))
    out["model.v_head_dim"] = _count(text.get("v_head_dim"))
    use_mla = model_type in MLA_TYPES and kv_lora is not None
    out["model.use_mla"] = use_mla
    if use_mla:
        # vLLM's head size with MLA: the latent (kv_lora_rank) plus the rotary part, one KV head.
        out["model.head_dim"] = kv_lora + (rope_dim or 0)
    elif _count(text.get("head_dim")) is not None:  # explicit head_dim wins (Qwen3, Gemma)
        out["model.head_dim"] = _count(text["head_dim"])
    elif isinstance(hidden, int) and isinstance(heads, int) and heads:
        out["model.head_dim"] = hidden // heads
    return out
