"""ModelShape: the model.* facts read once, with provenance, on the real config.json fixtures."""
from pathlib import Path

import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.vllm_math.parallel import valid_tp_sizes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


def shape_of(name: str) -> ModelShape:
    facts = Facts()
    load_model_facts(str(FIXTURES / name), facts)
    return ModelShape.from_facts(facts)


@pytest.mark.parametrize("name, heads, kv, layers, head_dim, vocab, inter", [
    ("llama-3-70b", 64, 8, 80, 128, 128256, 28672),
    ("qwen2.5-7b", 28, 4, 28, 128, 152064, 18944),
    ("qwen2.5-32b", 40, 8, 64, 128, 152064, 27648),
    ("vicuna-13b", 40, 40, 40, 128, 32000, 13824),
    ("qwen3-8b", 32, 8, 36, 128, 151936, 12288),
    ("qwen3-32b-awq", 64, 8, 64, 128, 151936, 25600),
])
def test_dense_shapes(name, heads, kv, layers, head_dim, vocab, inter):
    s = shape_of(name)
    assert (s.heads, s.kv_heads, s.layers, s.head_dim, s.vocab, s.intermediate) == \
        (heads, kv, layers, head_dim, vocab, inter)
    assert s.known and not s.use_mla and s.experts is None
    assert s.provenance["heads"] == "config.json"
    assert s.describe("vocab") == f"{vocab} (model.vocab_size, config.json)"


def test_mixtral_moe():
    s = shape_of("mixtral-8x7b")
    assert s.experts == 8 and s.heads == 32 and s.kv_heads == 8 and s.dtype == "bfloat16"
    assert s.quant_method is None and s.quant_group is None


def test_deepseek_v3_mla():
    s = shape_of("deepseek-v3")
    assert s.use_mla and s.mla and s.kv_lora_rank == 512 and s.qk_rope_head_dim == 64
    assert s.head_dim == 576                  # vLLM's get_head_size with MLA: latent + rope part
    assert s.experts == 256 and s.moe_intermediate == 2048
    assert s.quant_method == "fp8" and s.quant_group is None
    assert s.derived_max_len == 163840 and s.derived_max_len_key == "max_position_embeddings"


def test_internvl_vision_heads_limit_tp():
    s = shape_of("internvl2-8b")
    assert s.heads == 32 and s.kv_heads == 8 and s.vision_heads == 16
    assert s.tp_kwargs()["vision_heads"] == 16
    # 32 divides the 32 text heads but not the 16 vision-tower heads
    assert valid_tp_sizes(s.heads, max_tp=32, **s.tp_kwargs()) == [1, 2, 4, 8, 16]


def test_awq_quantization_fields():
    s = shape_of("qwen3-32b-awq")
    assert s.quant_method == "awq" and s.quant_group == 128 and s.quant_bits == 4 and s.dtype == "float16"
    assert s.hidden == 5120 and s.heads * s.head_dim == 8192   # explicit head_dim, not hidden // heads
    # the group size rules tp 16 out: 25600 / 16 = 1600, 1600 % 128 = 64
    assert 16 not in valid_tp_sizes(s.heads, max_tp=16, **s.tp_kwargs())
    assert s.tp_kwargs()["quant_group"] == 128


def test_falcon_40b_from_either_revision_is_the_same_shape():
    new, old = shape_of("falcon-40b"), shape_of("falcon-40b-refinedweb")
    assert (new.heads, new.kv_heads, new.layers, new.head_dim) == \
        (old.heads, old.kv_heads, old.layers, old.head_dim) == (128, 8, 60, 64)


def test_empty_facts_are_unknown():
    s = ModelShape.from_facts(Facts())
    assert not s.known and s.heads is None and s.total_kv_heads is None and s.provenance == {}
    assert ModelShape.from_facts(None) == s
    assert s.tp_kwargs() == dict(kv_heads=None, vocab=None, intermediate=None, moe_intermediate=None,
                                 quant_group=None, vision_heads=None, head_dim=None)


def test_numbers_are_coerced_and_head_dim_derived():
    f = Facts()
    for key, value in {"model.num_attention_heads": "40", "model.hidden_size": "5,120",
                       "model.quant_group_size": -1, "model.use_mla": False}.items():
        f.set(key, value, "log")
    s = ModelShape.from_facts(f)
    assert s.heads == 40 and s.hidden == 5120 and s.head_dim == 128
    assert s.source("head_dim") == "derived" and s.source("heads") == "log"
    assert s.quant_group is None               # -1 (per-channel) is no group
    assert s.total_kv_heads == 40              # MHA without a KV-head count, as vLLM defaults


def test_log_captures_replace_facts_with_their_provenance():
    s = shape_of("vicuna-13b")
    t = s.with_values(heads=48, kv_heads=None)
    assert t.heads == 48 and t.kv_heads == 40 and t.describe("heads") == "48 (log)"
    assert t.describe("kv_heads") == "40 (model.num_kv_heads, config.json)"
    assert s.heads == 40                       # frozen: the original is unchanged
    derived = ModelShape(heads=40, hidden=5120).with_values(heads=20)
    assert ModelShape(heads=40, hidden=5120)._derive().head_dim == 128 and derived.head_dim == 256
