"""The shipped table of popular models' architectures (data/models/architectures.toml): consistent rows,
used by `check`/`plan` only when no config.json is on the machine, and said so."""
from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import ESSENTIAL, load_model_facts
from vllm_doctor.facts.model_config import normalise
from vllm_doctor.facts.model_table import BYTES_16BIT, NOTICE_MARK, all_models, lookup

ROWS = all_models()
HUB = re.compile(r"https://huggingface\.co/([\w.-]+/[\w.-]+)/blob/main/config\.json")


def test_the_table_covers_the_families_people_launch():
    ids = " ".join(i for row in ROWS for i in row.ids).lower()
    for family in ("llama-2", "llama-3-", "llama-3.1", "llama-3.2", "llama-3.3", "qwen2.5", "qwen3", "qwen3-30b-a3b",
                   "qwen2.5-vl", "mistral-7b", "mixtral", "deepseek-v3", "deepseek-r1-distill", "gemma-2", "gemma-3",
                   "phi-3", "phi-4", "gpt-oss", "vicuna", "llama-4", "glm-4.5", "kimi-k2"):
        assert family in ids, family
    all_ids = [i.lower() for row in ROWS for i in row.ids]
    assert len(all_ids) == len(set(all_ids)), "an id in two rows"


@pytest.mark.parametrize("row", ROWS, ids=[r.ids[0] for r in ROWS])
def test_each_row_is_a_consistent_config_with_its_source(row):
    m = HUB.fullmatch(row.source)
    assert m and m.group(1) in row.ids, row.source          # the config.json of one of the row's own ids
    values = normalise(row.config, None)
    assert all(values.get(key) for key in ESSENTIAL), {k: values.get(k) for k in ESSENTIAL}
    heads, kv = values["model.num_attention_heads"], values["model.num_kv_heads"]
    assert heads % kv == 0, (heads, kv)                     # grouped-query attention: whole groups
    text = row.config.get("text_config") or row.config
    if "head_dim" not in text and "kv_lora_rank" not in text:
        assert values["model.hidden_size"] % heads == 0
    assert values.get("model.derived_max_model_len", 0) >= 4096
    assert 0.3e9 <= row.parameters <= 1.1e12
    # 16-bit weights, or a quantized checkpoint smaller than that
    assert row.weight_bytes == int(row.parameters * BYTES_16BIT) or row.weight_bytes < row.parameters * BYTES_16BIT


def test_a_row_that_needs_remote_code_predicts_it(tmp_path):
    """Kimi K2's config.json has an auto_map transformers has no class for: the table says so, check asks
    for --trust-remote-code as it would with the config on disk."""
    proc = _check("--", "vllm", "serve", "moonshotai/Kimi-K2-Instruct", "-tp", "16", tmp_path=tmp_path)
    assert "error[trust-remote-code]" in proc.stdout.decode(), proc.stdout.decode()
    assert "--trust-remote-code" in proc.stdout.decode()


def test_lookup_takes_hub_ids_in_any_case_and_nothing_else():
    assert lookup("LMSYS/Vicuna-13B-v1.5").config["num_attention_heads"] == 40
    assert lookup("lmsys/vicuna-13b-v1.5/") is lookup("lmsys/vicuna-13b-v1.5")
    for other in ("./vicuna-13b-v1.5", "/models/Llama-2-13b-hf", "lmsys/vicuna-13b-v1.5-16k", "vicuna-13b-v1.5", ""):
        assert lookup(other) is None, other


def test_the_table_only_stands_in_for_a_missing_config(tmp_path, monkeypatch):
    """A config in the Hugging Face cache (a fine-tune published under the same id with another shape)
    wins over the table; without one, the table's numbers come with their source."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    facts = Facts()
    notice = load_model_facts("lmsys/vicuna-13b-v1.5", facts, table=True)
    assert NOTICE_MARK in notice and "Llama-2-13b-hf/blob/main/config.json" in notice
    assert facts.get("model.num_attention_heads") == 40 and facts.get("model.config_loader") == "model table"
    assert facts.source("model.num_attention_heads") == "model table"
    snap = tmp_path / "hf" / "hub" / "models--lmsys--vicuna-13b-v1.5" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    cfg = {**lookup("lmsys/vicuna-13b-v1.5").config, "num_attention_heads": 48, "num_key_value_heads": 48,
           "hidden_size": 6144}
    (snap / "config.json").write_text(json.dumps(cfg))
    facts = Facts()
    notice = load_model_facts("lmsys/vicuna-13b-v1.5", facts, table=True)
    assert (notice is None or NOTICE_MARK not in notice) and facts.get("model.num_attention_heads") == 48


def test_a_saved_log_is_diagnosed_without_the_table(tmp_path, monkeypatch):
    """The log prints the numbers its failure is about: its diagnosis reads no table (table=False)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    facts = Facts()
    assert "not found" in load_model_facts("lmsys/vicuna-13b-v1.5", facts)
    assert facts.get("model.num_attention_heads") is None


def _check(*argv, tmp_path):
    return run_cli("check", "--no-live", *argv, env={"HF_HOME": str(tmp_path / "empty-hf")})


def test_the_help_examples_answer_right_without_the_models(tmp_path):
    """check --help's first example on a machine that has never downloaded vicuna: the heads rule and the
    corrected command (it said "no failure predicted", exit 0), the table named as the source."""
    proc = _check("--", "vllm", "serve", "lmsys/vicuna-13b-v1.5", "-tp", "3", tmp_path=tmp_path)
    out = proc.stdout.decode()
    assert proc.returncode == 1, out
    assert "error[tp-heads-indivisible]" in out and "40 % 3 = 1" in out
    assert "run: vllm serve lmsys/vicuna-13b-v1.5 -tp 2" in out and NOTICE_MARK in out
    proc = _check("--", "vllm", "serve", "meta-llama/Meta-Llama-3-70B", "-tp", "3", tmp_path=tmp_path)
    assert proc.returncode == 1 and "64 % 3 = 1" in proc.stdout.decode()
    # plan's examples: the layouts of models it has no files of
    proc = run_cli("plan", "meta-llama/Llama-2-13b-hf", "--gpus", "3", "--gpu-memory", "40",
                   env={"HF_HOME": str(tmp_path / "empty-hf")})
    assert proc.returncode == 0 and "vllm serve meta-llama/Llama-2-13b-hf --tensor-parallel-size 1 " \
        "--data-parallel-size 3" in proc.stdout.decode(), proc.stdout.decode() + proc.stderr.decode()
    proc = run_cli("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "4", "--gpu-memory", "24", "--format", "json",
                   env={"HF_HOME": str(tmp_path / "empty-hf")})
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0 and plan["layouts"], proc.stderr
    assert {(lay["tp"], lay["pp"]) for lay in plan["layouts"]} >= {(1, 1), (2, 1), (4, 1)}


def test_memory_from_the_table_is_labelled_and_predicts(tmp_path):
    """check --help's last example (no model files here): the 70B does not load on four 24 GiB GPUs."""
    proc = _check("--gpus", "4", "--gpu-memory", "24", "--", "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct",
                  "-tp", "4", tmp_path=tmp_path)
    out = " ".join(proc.stdout.decode().split())       # the notes under the report wrap to the width
    assert proc.returncode == 1 and "error[cuda-oom-load]" in out, out
    assert "weights 131.50 GiB" in out and NOTICE_MARK in out      # 70.6e9 parameters x 2 bytes


def test_check_json_has_the_memory_figures_plan_and_the_remedy_share(tmp_path):
    """`check --format json` has a top-level `memory` (per GPU); its KV tokens are plan's for the same
    layout and the kv-cache-insufficient finding's (one memory model, vllm_math.budget)."""
    env = {"HF_HOME": str(tmp_path / "empty-hf")}
    model = "meta-llama/Llama-3.1-8B-Instruct"
    proc = run_cli("check", "--no-live", "--format", "json", "--gpus", "1", "--gpu-memory", "24", "--", "vllm",
                   "serve", model, env=env)
    report = json.loads(proc.stdout)
    memory = report["memory"]
    assert set(memory) >= {"weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency", "confidence",
                           "context_fits", "largest_max_model_len"}
    assert memory["max_model_len"] == 131072 and memory["context_fits"] is False
    finding = report["findings"][0]
    assert finding["rule"] == "kv-cache-insufficient"
    assert finding["facts"]["memory_model"]["kv_tokens"] == memory["kv_cache_tokens"]
    plan = json.loads(run_cli("plan", model, "--gpus", "1", "--gpu-memory", "24", "--format", "json", env=env).stdout)
    layout = next(lay for lay in plan["layouts"] if (lay["tp"], lay["pp"]) == (1, 1))
    assert layout["kv_cache_tokens"] == memory["kv_cache_tokens"], (layout, memory)
    text = " ".join(run_cli("check", "--no-live", "--gpus", "1", "--gpu-memory", "24", "--", "vllm", "serve", model,
                            env=env).stdout.decode().split())
    assert f"= {memory['kv_cache_tokens']:,} tokens; max_model_len 131,072 does not fit" in text, text


def test_the_weights_estimate_matches_each_published_parameter_count(tmp_path):
    """config.json alone (as `check` reads a model it has only the config of) gives every unquantized model of
    the table within 3 % of the parameter count its model card publishes: tied embeddings counted once
    (Llama-3.2-1B 1.24B, not 1.5B), vision towers and projectors counted (Qwen2.5-VL-7B 8.29B, Gemma-3, Llama 4)."""
    import json

    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.model import load_model_facts
    from vllm_doctor.facts.model_table import _rows
    from vllm_doctor.vllm_math.memory import dtype_bytes
    from vllm_doctor.vllm_math.sizing import Sizing

    off, seen = {}, set()
    for row in _rows().values():
        if row.ids[0] in seen or row.config.get("quantization_config"):
            continue
        seen.add(row.ids[0])
        folder = tmp_path / str(len(seen))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(row.config))
        facts = Facts()
        load_model_facts(str(folder), facts)
        sizing = Sizing.from_facts(facts)
        estimate = sizing.weights().bytes / dtype_bytes(sizing.load_dtype())
        off[row.ids[0]] = round((estimate - row.parameters) / row.parameters * 100, 1)
    assert len(off) >= 40
    assert {m: e for m, e in off.items() if abs(e) > 3.0} == {}
