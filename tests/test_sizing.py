"""vllm_math.sizing, the one reader of weight bytes and KV bytes per token (AWQ, MLA and KV-head replication
included); tests/remedies/test_memory_sizing.py checks that `plan`, `check` and the memory remedies agree on them."""
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.facts.shape import ModelShape
from vllm_doctor.vllm_math.sizing import GIB, LoadArgs, Sizing, parse_len

MODELS = ROOT / "tests" / "fixtures" / "models"
AWQ_CHECKPOINT = 18 * GIB          # Qwen/Qwen3-32B-AWQ's four safetensors shards: 18.00 GB


def sizing(model: str | Path, **args) -> Sizing:
    facts = Facts()
    load_model_facts(str(model if isinstance(model, Path) else MODELS / model), facts)
    return Sizing(ModelShape.from_facts(facts), LoadArgs(**args))


def awq_with_checkpoint(tmp_path: Path) -> Path:
    """The AWQ fixture with a shard index stating the checkpoint's size (no weights needed)."""
    model = tmp_path / "qwen3-32b-awq"
    shutil.copytree(MODELS / "qwen3-32b-awq", model)
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": AWQ_CHECKPOINT},
                                                                    "weight_map": {}}))
    return model


# ----------------------------------------------------------------- the numbers themselves

@pytest.mark.parametrize("model, tp, pp, kv_dtype, expected", [
    ("llama-3-70b", 8, 1, None, 2 * 80 * 1 * 128 * 2),       # 8 KV heads / tp 8 = 1 per GPU
    ("llama-3-70b", 16, 1, None, 2 * 80 * 1 * 128 * 2),      # tp 16 > 8 KV heads: replicated, still 1 per GPU
    ("llama-3-70b", 2, 1, None, 2 * 80 * 4 * 128 * 2),
    ("deepseek-v3", 1, 1, None, 61 * (512 + 64) * 2),        # MLA: one latent per token ...
    ("deepseek-v3", 8, 1, None, 61 * (512 + 64) * 2),        # ... not split across tensor-parallel ranks
    ("qwen2.5-7b", 2, 2, "fp8", 2 * 14 * 2 * 128 * 1),       # the largest pipeline stage: 14 of 28 layers
    ("qwen3-32b-awq", 4, 1, None, 2 * 64 * 2 * 128 * 2),     # AWQ weights; the KV cache stays fp16
])
def test_kv_bytes_per_token(model, tp, pp, kv_dtype, expected):
    kv = sizing(model, kv_cache_dtype=kv_dtype).kv_per_token(tp, pp)
    assert kv.bytes == expected and "per token" in kv.formula


def test_awq_weights_from_the_checkpoint_else_estimated(tmp_path):
    measured = sizing(awq_with_checkpoint(tmp_path)).weights()
    assert (measured.bytes, measured.source) == (AWQ_CHECKPOINT, "checkpoint size")   # loaded as stored
    estimated = sizing("qwen3-32b-awq").weights()
    assert estimated.estimated and "x 0.55 bytes" in estimated.source
    # 4-bit layers (0.55 bytes/parameter) + fp16 embeddings and lm_head: within 10 % of the real 18 GiB
    assert abs(estimated.bytes - AWQ_CHECKPOINT) < 0.1 * AWQ_CHECKPOINT
    plain = sizing("qwen2.5-32b").weights()
    assert plain.bytes > 3 * estimated.bytes / 2   # a 16-bit 32B model is far bigger than its AWQ version


def test_weights_follow_the_load_dtype():
    shape = ModelShape(heads=40, kv_heads=40, layers=40, hidden=5120, dtype="float16", weight_bytes=26 * GIB)
    assert Sizing(shape).weights().bytes == 26 * GIB
    fp32 = Sizing(shape, LoadArgs(dtype="float")).weights()
    assert (fp32.bytes, fp32.source) == (52 * GIB, "checkpoint size x 2 (--dtype float32)")
    online = Sizing(shape, LoadArgs(quantization="fp8")).weights()
    assert online.bytes == 13 * GIB and "--quantization fp8" in online.source
    # a float32 checkpoint with --dtype auto is loaded in 16 bits (vLLM's _resolve_auto_dtype)
    f32 = ModelShape(heads=40, layers=40, hidden=5120, dtype="float32", weight_bytes=52 * GIB)
    assert Sizing(f32).load_dtype() == "float16" and Sizing(f32).weights().bytes == 26 * GIB


@pytest.mark.parametrize("text, tokens", [("4096", 4096), ("32k", 32000), ("32K", 32768), ("1m", 1000000),
                                          ("1M", 1 << 20), ("25.6k", 25600), (8192, 8192), ("auto", None),
                                          ("-1", None), (None, None), ("xx", None), (True, None)])
def test_parse_len(text, tokens):
    assert parse_len(text) == tokens
