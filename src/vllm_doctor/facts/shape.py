"""The model's shape, read from the `model.*` facts once: heads, KV heads, layers, MLP sizes, MLA latent,
quantization, weight bytes, lengths, each with the source it came from.

`plan`, `check` and the remedies all take a :class:`ModelShape` instead of reading `model.*` keys
themselves, so that a head count or a group size means the same thing everywhere. Numbers are
coerced by :mod:`vllm_doctor.numbers` only; a value a log capture gives (``heads`` in an error
message) replaces the fact through :meth:`ModelShape.with_values`, which records that source too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from vllm_doctor.numbers import as_int

# field -> the fact it is read from (docs/DESIGN.md's key list; written by facts/model_config.py)
INT_FIELDS = {
    "heads": "model.num_attention_heads",
    "kv_heads": "model.num_kv_heads",
    "layers": "model.num_layers",
    "hidden": "model.hidden_size",
    "head_dim": "model.head_dim",
    "intermediate": "model.intermediate_size",
    "moe_intermediate": "model.moe_intermediate_size",
    "experts": "model.num_experts",
    "shared_expert_intermediate": "model.shared_expert_intermediate_size",
    "dense_layers": "model.dense_layers",
    "dense_intermediate": "model.dense_intermediate_size",
    "vocab": "model.vocab_size",
    "max_position": "model.max_position_embeddings",
    "derived_max_len": "model.derived_max_model_len",
    "sliding_window": "model.sliding_window",
    "full_attention_layers": "model.full_attention_layers",
    "sliding_layers": "model.sliding_layers",
    "linear_layers": "model.linear_layers",
    "linear_mixer_params": "model.linear_mixer_params",
    "quant_group": "model.quant_group_size",
    "quant_bits": "model.quant_bits",
    "quant_bits_attention": "model.quant_bits_attention",
    "quant_bits_mlp": "model.quant_bits_mlp",
    "quant_bits_lm_head": "model.quant_bits_lm_head",
    "kv_lora_rank": "model.kv_lora_rank",
    "qk_rope_head_dim": "model.qk_rope_head_dim",
    "qk_nope_head_dim": "model.qk_nope_head_dim",
    "q_lora_rank": "model.q_lora_rank",
    "v_head_dim": "model.v_head_dim",
    "vision_heads": "model.vision_num_heads",
    "vision_params": "model.vision_params",
    "vision_tokens_per_item": "model.vision_tokens_per_item",
    "vision_peak_bytes_per_item": "model.vision_peak_bytes_per_item",
    "weight_bytes": "model.weight_bytes",
}
TEXT_FIELDS = {
    "model_type": "model.model_type",
    "derived_max_len_key": "model.derived_max_model_len_key",
    "dtype": "model.dtype",
    "quant_method": "model.quant_method",
    "weight_bytes_method": "model.weight_bytes_method",
}
BOOL_FIELDS = {"use_mla": "model.use_mla", "tied_embeddings": "model.tied_embeddings",
               "attn_output_gate": "model.attn_output_gate"}
FACT_KEYS = {**INT_FIELDS, **TEXT_FIELDS, **BOOL_FIELDS}
DERIVED = "derived"       # provenance of a value computed from other fields (head_dim = hidden // heads)
CAPTURE = "capture"       # provenance of a value taken from the evidence (a log capture)


@dataclass(frozen=True)
class ModelShape:
    heads: int | None = None
    kv_heads: int | None = None              # as the config says (vLLM's get_total_num_kv_heads)
    layers: int | None = None
    hidden: int | None = None
    head_dim: int | None = None              # MLA: kv_lora_rank + qk_rope_head_dim (vLLM's get_head_size)
    intermediate: int | None = None
    moe_intermediate: int | None = None
    experts: int | None = None
    shared_expert_intermediate: int | None = None     # an MoE's shared expert(s), every token (facts/model_config)
    dense_layers: int | None = None                   # an MoE's layers without experts ...
    dense_intermediate: int | None = None             # ... and their MLP width
    vocab: int | None = None
    max_position: int | None = None
    derived_max_len: int | None = None
    derived_max_len_key: str | None = None
    sliding_window: int | None = None
    full_attention_layers: int | None = None     # set only when the model mixes kinds of layers
    sliding_layers: int | None = None
    linear_layers: int | None = None             # linear attention / state-space (Mamba) layers
    linear_mixer_params: int | None = None       # one linear-attention layer's projections (gated delta net)
    attn_output_gate: bool = False               # the query projection also yields an output gate
    model_type: str | None = None
    dtype: str | None = None                 # the checkpoint's torch_dtype
    quant_method: str | None = None          # a pre-quantized checkpoint (awq, gptq, fp8, ...)
    quant_group: int | None = None           # > 0 only (-1, per-channel, is no group)
    quant_bits: int | None = None
    quant_bits_attention: int | None = None  # a mixed scheme's parts (modelopt MIXED_PRECISION: FP8 attention,
    quant_bits_mlp: int | None = None        # NVFP4 experts and lm_head); None: the part at quant_bits, lm_head
    quant_bits_lm_head: int | None = None    # unquantized
    use_mla: bool = False
    tied_embeddings: bool = False            # lm_head is the embedding (counted once)
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None     # MLA: the query/key part without rotary embedding
    q_lora_rank: int | None = None          # MLA: the query latent (None: a full query projection)
    v_head_dim: int | None = None
    vision_heads: int | None = None
    vision_params: int | None = None         # the vision tower's and projector's (kept in 16 bits)
    vision_tokens_per_item: int | None = None      # the largest image, as vLLM's encoder profile feeds it
    vision_peak_bytes_per_item: int | None = None
    weight_bytes: int | None = None          # checkpoint size on disk (headers, index or file sizes)
    weight_bytes_method: str | None = None
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_facts(cls, facts: Any) -> "ModelShape":
        """Every `model.*` fact the sizing needs, read once (a None or missing facts object: all unknown)."""
        values: dict[str, Any] = {}
        provenance: dict[str, str] = {}

        def take(name: str, value: Any) -> None:
            if value is not None:
                values[name] = value
                provenance[name] = _source(facts, FACT_KEYS[name])

        for name, key in INT_FIELDS.items():
            take(name, as_int(_get(facts, key)))
        for name, key in TEXT_FIELDS.items():
            raw = _get(facts, key)
            take(name, None if raw in (None, "") else str(raw))
        for name, key in BOOL_FIELDS.items():
            if _get(facts, key) is True:
                take(name, True)
        if values.get("quant_group") is not None and values["quant_group"] <= 0:
            del values["quant_group"], provenance["quant_group"]
        return cls(**values, provenance=provenance)._derive()

    def with_values(self, source: str = CAPTURE, **values: Any) -> "ModelShape":
        """A copy with these fields replaced (None values are ignored), their provenance set to `source`."""
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            return self
        provenance = {**self.provenance, **{k: source for k in given}}
        if self.provenance.get("head_dim") == DERIVED and "head_dim" not in given and {"heads", "hidden"} & set(given):
            given["head_dim"] = None                    # derived from the old heads/hidden: derive it again
            del provenance["head_dim"]
        return dataclasses.replace(self, **given, provenance=provenance)._derive()

    def _derive(self) -> "ModelShape":
        if self.head_dim is None and self.hidden and self.heads:
            # vLLM's get_head_size without an explicit head_dim: hidden_size // num_attention_heads
            return dataclasses.replace(self, head_dim=self.hidden // self.heads,
                                       provenance={**self.provenance, "head_dim": DERIVED})
        return self

    # ------------------------------------------------------------------ questions
    @property
    def known(self) -> bool:
        """The attention-head count is known (without it no tensor-parallel size can be checked)."""
        return bool(self.heads)

    @property
    def total_kv_heads(self) -> int | None:
        """KV heads for the KV cache: the config's, else one per attention head (MHA), as vLLM defaults."""
        return self.kv_heads or self.heads

    @property
    def mla(self) -> bool:
        """DeepSeek-style latent attention with a known latent size."""
        return bool(self.use_mla and self.kv_lora_rank)

    def tp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of vllm_math.parallel.valid_tp_sizes / why_invalid / rank_plans (heads apart)."""
        return dict(kv_heads=self.kv_heads, vocab=self.vocab, intermediate=self.intermediate,
                    moe_intermediate=self.moe_intermediate, quant_group=self.quant_group,
                    vision_heads=self.vision_heads, head_dim=self.head_dim)

    def source(self, name: str) -> str | None:
        """Where a field's value came from: a fact source ('config.json', 'log', ...), 'derived', or None."""
        return self.provenance.get(name)

    def describe(self, name: str) -> str | None:
        """'32000 (model.vocab_size, config.json)'; '40 (log)' for a log capture; None when unknown."""
        value = getattr(self, name)
        if value is None:
            return None
        src = self.provenance.get(name)
        if src == CAPTURE:
            return f"{value} (log)"
        if src == DERIVED:
            return f"{value} (derived)"
        return f"{value} ({FACT_KEYS[name]}{', ' + src if src else ''})"


def _get(facts: Any, key: str) -> Any:
    if facts is None:
        return None
    try:
        return facts.get(key)
    except Exception:  # noqa: BLE001 - a facts object without that key
        return None


def _source(facts: Any, key: str) -> str:
    source = getattr(facts, "source", None)
    try:
        return (source(key) if callable(source) else None) or "facts"
    except Exception:  # noqa: BLE001
        return "facts"
