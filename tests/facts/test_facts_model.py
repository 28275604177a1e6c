"""Model facts: aliases, multimodal nesting, derived max length, weights, cache resolution."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts, resolve_model_dir
from vllm_doctor.facts.model_config import derived_max_len, normalise
from vllm_doctor.facts.weights import estimate_weights

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


def load(name):
    facts = Facts()
    notice = load_model_facts(str(FIXTURES / name), facts)
    return facts, notice


@pytest.mark.parametrize("name, heads, kv, layers, head_dim, vocab, derived", [
    ("vicuna-13b", 40, 40, 40, 128, 32000, 4096),
    ("llama-2-13b", 40, 40, 40, 128, 32000, 4096),
    ("llama-3-70b", 64, 8, 80, 128, 128256, 8192),
    ("qwen2.5-7b", 28, 4, 28, 128, 152064, 32768),
    ("qwen2.5-32b", 40, 8, 64, 128, 152064, 32768),
    ("mixtral-8x7b", 32, 8, 32, 128, 32000, 32768),
    ("qwen3-8b", 32, 8, 36, 128, 151936, 40960),
    ("falcon-40b", 128, 8, 60, 64, 65024, 2048),
    ("falcon-40b-refinedweb", 128, 8, 60, 64, 65024, 2048),
    ("internvl2-8b", 32, 8, 32, 128, 92553, 65536),
    ("tinyremote", 40, 40, 2, 8, 32000, 4096),
])
def test_fixture_shapes(name, heads, kv, layers, head_dim, vocab, derived):
    facts, _ = load(name)
    assert facts.get("model.num_attention_heads") == heads
    assert facts.get("model.num_kv_heads") == kv
    assert facts.get("model.num_layers") == layers
    assert facts.get("model.head_dim") == head_dim
    assert facts.get("model.vocab_size") == vocab
    assert facts.get("model.derived_max_model_len") == derived
    assert facts.source("model.num_attention_heads") == "config.json"


def test_deepseek_v3_mla_moe_fp8_and_yarn():
    facts, notice = load("deepseek-v3")
    assert facts.get("model.use_mla") is True
    assert facts.get("model.kv_lora_rank") == 512 and facts.get("model.qk_rope_head_dim") == 64
    assert facts.get("model.head_dim") == 576  # latent 512 + rope 64, as vLLM sizes MLA KV
    assert facts.get("model.num_experts") == 256 and facts.get("model.moe_intermediate_size") == 2048
    assert facts.get("model.quant_method") == "fp8"
    assert facts.get("model.quant_weight_block_size") == [128, 128]
    # yarn: original_max_position_embeddings 4096 x factor 40
    assert facts.get("model.derived_max_model_len") == 163840


def test_mixtral_experts_and_dtype():
    facts, _ = load("mixtral-8x7b")
    assert facts.get("model.num_experts") == 8
    assert facts.get("model.dtype") == "bfloat16"
    assert facts.get("model.use_mla") is False


def test_internvl_text_and_vision_parts():
    facts, notice = load("internvl2-8b")
    assert facts.get("model.model_type") == "internvl_chat"
    assert facts.get("model.text_model_type") == "internlm2"
    assert facts.get("model.vision_num_heads") == 16
    assert facts.get("model.needs_remote_code") is True
    assert facts.get("model.config_loader") == "json"
    assert "remote code" in notice


def test_remote_code_model_is_read_as_json_not_executed():
    facts, notice = load("tinyremote")
    assert facts.get("model.needs_remote_code") is True
    assert facts.get("model.model_type") == "tinyremote"
    assert notice and "auto_map" in notice


def test_native_model_with_auto_map_does_not_need_remote_code():
    facts, notice = load("deepseek-v3")  # transformers knows deepseek_v3 natively
    assert notice is None
    assert facts.get("model.has_auto_map") is True
    assert facts.get("model.needs_remote_code") is False


def test_vllm_own_config_types_do_not_need_remote_code():
    facts, _ = load("falcon-40b-refinedweb")  # vLLM ships RWConfig for RefinedWeb
    assert facts.get("model.needs_remote_code") is False


def test_trust_remote_code_is_never_true(monkeypatch):
    import transformers

    seen = []
    real = transformers.AutoConfig.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", spy)
    for name in ("tinyremote", "internvl2-8b", "llama-3-70b"):
        load(name)
    assert seen and set(seen) == {False}


def test_complete_plain_config_is_read_without_transformers():
    """transformers (~1 s to import) is asked only when config.json leaves a question open."""
    facts, _ = load("llama-3-70b")
    assert facts.get("model.config_loader") == "json" and facts.get("model.num_kv_heads") == 8
    facts, _ = load("tinyremote")   # auto_map: only transformers can say whether it is native
    assert facts.get("model.needs_remote_code") is True


@pytest.mark.parametrize("cfg, kv", [
    ({"num_attention_heads": 32, "num_key_value_heads": 8}, 8),
    ({"n_head": 71, "n_head_kv": 1}, 1),
    ({"num_attention_heads": 32, "num_kv_heads": 4}, 4),
    ({"num_attention_heads": 32, "multi_query_group_num": 2}, 2),  # ChatGLM
    ({"num_attention_heads": 64, "num_attention_groups": 8}, 8),   # Step3p5
    ({"n_heads": 48, "attn_config": {"kv_n_heads": 8}}, 8),       # MPT / DBRX
    ({"n_head": 71, "multi_query": True}, 1),                      # Falcon-7B, GPTBigCode
    ({"model_type": "falcon", "num_attention_heads": 128, "num_kv_heads": 8, "multi_query": True,
      "new_decoder_architecture": True}, 8),                        # new arch ignores multi_query
    ({"num_attention_heads": 40}, 40),                              # default: MHA
])
def test_kv_head_aliases(cfg, kv):
    assert normalise(cfg)["model.num_kv_heads"] == kv


@pytest.mark.parametrize("cfg, key, value", [
    ({"n_layer": 24}, "model.num_layers", 24),
    ({"num_layers": 28}, "model.num_layers", 28),
    ({"ffn_dim": 16384}, "model.intermediate_size", 16384),
    ({"num_local_experts": 8}, "model.num_experts", 8),
    ({"n_routed_experts": 64}, "model.num_experts", 64),
    ({"num_experts": 128}, "model.num_experts", 128),
    ({"dtype": "bfloat16"}, "model.dtype", "bfloat16"),
    ({"torch_dtype": "torch.float16"}, "model.dtype", "float16"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}, "model.quant_group_size", 128),
    ({"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64}}, "model.quant_group_size", 64),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "group_size": 32}}}}}, "model.quant_bits", 4),
])
def test_other_aliases(cfg, key, value):
    assert normalise({"num_attention_heads": 8, "hidden_size": 512, **cfg})[key] == value


def test_explicit_head_dim_wins_over_hidden_by_heads():
    # Qwen3-32B shape: hidden 5120 / 64 heads = 80, but head_dim is 128
    out = normalise({"model_type": "qwen3", "hidden_size": 5120, "num_attention_heads": 64, "head_dim": 128})
    assert out["model.head_dim"] == 128
    assert normalise({"hidden_size": 5120, "num_attention_heads": 64})["model.head_dim"] == 80


@pytest.mark.parametrize("cfg, expected, key", [
    ({"max_position_embeddings": 4096, "seq_length": 2048}, 2048, "seq_length"),  # min over the keys
    ({"n_positions": 1024}, 1024, "n_positions"),
    ({"max_position_embeddings": 8192, "model_max_length": 131072}, 131072, "model_max_length"),  # Cohere
    ({}, 2048, None),  # vLLM's default
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384, "max_position_embeddings"),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 8192, "max_position_embeddings"),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072, "max_position_embeddings"),
    ({"max_position_embeddings": 131072, "rope_scaling": {"type": "longrope", "factor": 32.0}}, 131072, "max_position_embeddings"),
    ({"max_position_embeddings": 32768, "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 32768}}, 131072, "max_position_embeddings"),  # transformers v5 name
    ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, 4096, "max_position_embeddings"),
    ({"model_type": "gemma3_text", "max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 131072, "max_position_embeddings"),
])
def test_derived_max_len_follows_vllm(cfg, expected, key):
    assert derived_max_len(cfg) == (expected, key)


def test_tokenizer_model_max_length_caps_derived(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "zzz_custom", "num_attention_heads": 4,
                                                    "hidden_size": 64, "max_position_embeddings": 4096}))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    facts = Facts()
    load_model_facts(str(model), facts)
    assert facts.get("model.derived_max_model_len") == 2048


def _write_safetensors(path: Path, tensors: dict, pad: int = 0):
    header = json.dumps(tensors).encode()
    data_len = max((t["data_offsets"][1] for t in tensors.values() if isinstance(t, dict) and "data_offsets" in t),
                   default=0)
    # the data part is written sparse-free but tiny; only the header is read
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * pad)
    return data_len


def test_weights_from_safetensors_headers(tmp_path):
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [1024, 1024], "data_offsets": [0, 2 * 1024 * 1024]},
        "b": {"dtype": "BF16", "shape": [1024], "data_offsets": [2 * 1024 * 1024, 2 * 1024 * 1024 + 2048]}})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {
        "c": {"dtype": "F8_E4M3", "shape": [4096], "data_offsets": [0, 4096]}})
    size, dtypes, method = estimate_weights(tmp_path)
    assert size == 2 * 1024 * 1024 + 2048 + 4096
    assert dtypes == ["BF16", "F8_E4M3"]
    assert method == "safetensors headers"


def test_weights_fall_back_to_index_then_file_sizes(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 26031728640},
                                                                       "weight_map": {}}))
    assert estimate_weights(tmp_path)[::2] == (26031728640, "safetensors index")
    other = tmp_path / "bin"
    other.mkdir()
    (other / "pytorch_model.bin").write_bytes(b"\0" * 1000)
    (other / "training_args.bin").write_bytes(b"\0" * 50)
    assert estimate_weights(other)[::2] == (1000, "file sizes")


def test_weight_bytes_fact(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text((FIXTURES / "llama-2-13b" / "config.json").read_text())
    _write_safetensors(model / "model.safetensors", {"w": {"dtype": "F16", "shape": [8], "data_offsets": [0, 16]}})
    facts = Facts()
    load_model_facts(str(model), facts)
    assert facts.get("model.weight_bytes") == 16


def test_resolves_hf_cache_snapshot(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    snap = repo / "snapshots" / "a09a35458c702b33eeacc393d103063234e8bc28"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a09a35458c702b33eeacc393d103063234e8bc28")
    (snap / "config.json").write_text((FIXTURES / "qwen2.5-7b" / "config.json").read_text())
    env = {"HF_HOME": str(tmp_path)}
    assert resolve_model_dir("Qwen/Qwen2.5-7B-Instruct", env) == snap
    assert resolve_model_dir("Qwen/Qwen2.5-7B-Instruct", {"HF_HUB_CACHE": str(tmp_path / "hub")}) == snap
    assert resolve_model_dir("Qwen/Other", env) is None
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    facts = Facts()
    assert load_model_facts("Qwen/Qwen2.5-7B-Instruct", facts) is None
    assert facts.get("model.num_kv_heads") == 4


def test_missing_model_is_a_notice_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    facts = Facts()
    notice = load_model_facts("nobody/nothing", facts)
    assert "not found" in notice
    assert facts.with_prefix("model.") == {}


def test_broken_config_json_is_a_notice(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    facts = Facts()
    assert "not valid JSON" in load_model_facts(str(tmp_path), facts)


def test_log_facts_win_over_config():
    facts = Facts()
    facts.set("model.num_attention_heads", 41, "log")
    load_model_facts(str(FIXTURES / "vicuna-13b"), facts)
    assert facts.get("model.num_attention_heads") == 41
    assert facts.conflicts and facts.conflicts[0][0] == "model.num_attention_heads"


def test_no_transformers_import_without_a_model():
    code = ("import sys\nfrom vllm_doctor.facts import Facts\nfrom vllm_doctor.facts.gather import gather_facts\n"
            "from vllm_doctor.facts.collect_env import parse_collect_env\n"
            "gather_facts(Facts(), live=False)\n"
            "print('transformers' in sys.modules, 'torch' in sys.modules, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert out.split() == ["False", "False", "False"]
