"""Normalise a model's config (a plain dict: config.json, or a transformers config's to_dict()) into
`model.*` facts, following the attribute names vLLM itself looks at (see docs/reference/vllm-messages.md §4 and
vLLM's ModelConfig.get_total_num_kv_heads / get_head_size / _get_and_verify_max_len).
"""
from __future__ import annotations

from typing import Any

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
MLA_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2", "kimi_linear",
             "longcat_flash", "pangu_ultra_moe")


def _first(cfg: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return None


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
        return attn["kv_n_heads"]
    value = _first(text, KV_HEAD_KEYS)
    return heads if value is None else value


def derived_max_len(text: dict, tokenizer_config: dict | None = None) -> tuple[float | int, str | None]:
    """vLLM's derived max_model_len and the key it names in the error message."""
    derived: float = float("inf")
    key_used = None
    for key in MAX_LEN_KEYS:
        value = text.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < derived:
                key_used = key
            derived = min(derived, value)
    if text.get("model_max_length"):  # Command-R / Cohere: this key wins outright
        key_used, derived = "model_max_length", text["model_max_length"]
    if tokenizer_config and isinstance(tokenizer_config.get("model_max_length"), (int, float)):
        derived = min(derived, tokenizer_config["model_max_length"])
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
        factor = rope.get("factor", factor)
        if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
            derived = rope["original_max_position_embeddings"]
    return derived * factor


def _dtype(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).replace("torch.", "")


def quant_facts(qcfg: Any) -> dict[str, Any]:
    if not isinstance(qcfg, dict):
        return {}
    out: dict[str, Any] = {"model.quant_method": qcfg.get("quant_method")}
    group = _first(qcfg, ("group_size", "q_group_size"))
    bits = _first(qcfg, ("bits", "w_bit", "num_bits"))
    groups = qcfg.get("config_groups")  # compressed-tensors keeps them per group
    if isinstance(groups, dict):
        for grp in groups.values():
            weights = grp.get("weights") if isinstance(grp, dict) else None
            if isinstance(weights, dict):
                group = group if group is not None else weights.get("group_size")
                bits = bits if bits is not None else weights.get("num_bits")
    out["model.quant_group_size"] = group
    out["model.quant_bits"] = bits
    out["model.quant_weight_block_size"] = qcfg.get("weight_block_size")
    return out


def normalise(cfg: dict, tokenizer_config: dict | None = None) -> dict[str, Any]:
    """Config dict -> {fact key: value}; None values are dropped."""
    text = text_part(cfg)
    heads = _first(text, HEAD_KEYS)
    hidden = _first(text, HIDDEN_KEYS)
    model_type = cfg.get("model_type")
    text_type = text.get("model_type", model_type)
    out: dict[str, Any] = {
        "model.model_type": model_type,
        "model.text_model_type": text_type if text is not cfg else None,
        "model.architectures": cfg.get("architectures"),
        "model.num_attention_heads": heads,
        "model.num_kv_heads": kv_heads({**text, "model_type": text_type}, heads),
        "model.num_layers": _first(text, LAYER_KEYS),
        "model.hidden_size": hidden,
        "model.intermediate_size": _first(text, INTERMEDIATE_KEYS),
        "model.moe_intermediate_size": text.get("moe_intermediate_size"),
        "model.num_experts": _first(text, EXPERT_KEYS),
        "model.vocab_size": _first(text, VOCAB_KEYS),
        "model.max_position_embeddings": text.get("max_position_embeddings"),
        "model.dtype": _dtype(_first(cfg, ("torch_dtype", "dtype")) or _first(text, ("torch_dtype", "dtype"))),
        "model.needs_remote_code": bool(cfg.get("auto_map")),
        "model.sliding_window": text.get("sliding_window") if text.get("use_sliding_window", True) else None,
    }
    ffn = text.get("ffn_config")  # DBRX
    if isinstance(ffn, dict):
        out["model.intermediate_size"] = out["model.intermediate_size"] or ffn.get("ffn_hidden_size")
        out["model.num_experts"] = out["model.num_experts"] or ffn.get("moe_num_experts")
    derived, key = derived_max_len(text, tokenizer_config)
    out["model.derived_max_model_len"] = derived
    out["model.derived_max_model_len_key"] = key
    out.update(quant_facts(cfg.get("quantization_config") or text.get("quantization_config")))
    out.update(_head_dim_facts(text, text_type, heads, hidden))
    vision = cfg.get("vision_config")
    if isinstance(vision, dict):
        out["model.vision_num_heads"] = _first(vision, HEAD_KEYS)
    return {k: v for k, v in out.items() if v is not None}


def _head_dim_facts(text: dict, model_type: str | None, heads: Any, hidden: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv_lora = text.get("kv_lora_rank")
    rope_dim = text.get("qk_rope_head_dim")
    nope_dim = text.get("qk_nope_head_dim")
    out["model.kv_lora_rank"] = kv_lora
    out["model.qk_rope_head_dim"] = rope_dim
    out["model.qk_nope_head_dim"] = nope_dim
    use_mla = model_type in MLA_TYPES and kv_lora is not None
    out["model.use_mla"] = use_mla
    if use_mla:
        # vLLM's head size with MLA: the latent (kv_lora_rank) plus the rotary part, one KV head.
        out["model.head_dim"] = kv_lora + (rope_dim or 0)
    elif text.get("head_dim") is not None:  # explicit head_dim wins (Qwen3, Gemma)
        out["model.head_dim"] = text["head_dim"]
    elif isinstance(hidden, int) and isinstance(heads, int) and heads:
        out["model.head_dim"] = hidden // heads
    return out
