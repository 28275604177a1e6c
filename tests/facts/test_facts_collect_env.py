"""collect_env parsing (both layouts), finding a pasted block in a log, snapshots, gather_facts."""
import json
from pathlib import Path

import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.facts.collect_env import find_collect_env_block, parse_collect_env
from vllm_doctor.facts.gather import gather_facts
from vllm_doctor.facts.snapshot import SnapshotError, load_snapshot, save_snapshot

DATA = Path(__file__).parent / "data"
MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
OLD = (DATA / "collect_env_old.txt").read_text()
NEW = (DATA / "collect_env_new.txt").read_text()


def test_old_layout():
    out = parse_collect_env(OLD)
    assert out["gpu.count"] == 4
    assert out["gpu.devices"][2] == {"index": 2, "name": "NVIDIA A100-SXM4-80GB"}
    assert out["gpu.driver_version"] == "535.104.05"
    assert out["vllm.version"] == "0.4.0.post1"
    assert out["env.versions"]["torch"] == "2.1.2+cu121"
    assert out["env.nccl_version"] == "2.18.1"
    assert out["env.cuda_runtime_version"] == "11.8.89"
    assert out["gpu.topology"][0] == ["X", "NV12", "NV12", "NV12"]
    assert out["gpu.p2p"]["nvlink"][3] == ["OK", "OK", "OK", "X"]


def test_new_bannered_layout():
    out = parse_collect_env(NEW)
    assert [d["name"] for d in out["gpu.devices"]] == ["NVIDIA H100 NVL"] * 2
    assert out["gpu.driver_version"] == "575.51.03"
    assert out["vllm.version"] == "0.11.0"
    assert out["env.versions"]["transformers"] == "4.57.1"
    assert "env.cuda_runtime_version" not in out  # "Could not collect"
    assert out["gpu.topology"] == [["X", "SYS"], ["SYS", "X"]]
    assert out["gpu.p2p"]["nvlink"][0][1] == "NS"
    assert out["env.vars"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert out["env.vars"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "HF_TOKEN_PATH" not in out["env.vars"] and "TORCHINDUCTOR_COMPILE_THREADS" not in out["env.vars"]


def test_single_gpu_on_the_key_line():
    out = parse_collect_env("PyTorch version: 2.5.1+cu121\nGPU models and configuration: GPU 0: NVIDIA GeForce RTX 4090\n"
                            "Nvidia driver version: 535.183.01\n")
    assert out["gpu.count"] == 1 and out["gpu.devices"][0]["name"] == "NVIDIA GeForce RTX 4090"


@pytest.mark.parametrize("text", [OLD, NEW])
def test_find_block_inside_a_log(text):
    log = ["$ vllm serve meta-llama/Llama-2-13b-hf -tp 4",
           "INFO 02-18 21:25:53 __init__.py:190] Automatically detected platform cuda.",
           *text.splitlines(),
           "(APIServer pid=1) INFO 11-30 23:40:24 [api_server.py:1] vLLM API server version 0.11.0"]
    block = find_collect_env_block(log)
    assert block is not None
    assert block.splitlines()[0] == text.splitlines()[0]
    assert "vLLM API server" not in block
    assert parse_collect_env(block)["gpu.driver_version"]


def test_no_block_in_a_plain_log():
    assert find_collect_env_block(["INFO 05-12 10:11:12 llm_engine.py:98] hello", "ValueError: x"]) is None


def test_snapshot_round_trip(tmp_path):
    facts = Facts()
    facts.set("gpu.count", 8, "nvml")
    facts.set("gpu.devices", [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}], "nvml")
    facts.set("model.num_attention_heads", 64, "config.json")
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(save_snapshot(facts)))
    loaded = Facts()
    load_snapshot(path, loaded)
    assert loaded.get("gpu.count") == 8 and loaded.get("gpu.devices")[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert loaded.source("model.num_attention_heads") == "snapshot"
    assert json.loads(path.read_text())["kind"] == "vllm-doctor-facts"


def test_snapshot_accepts_collect_env_text(tmp_path):
    path = tmp_path / "env.txt"
    path.write_text(NEW)
    facts = Facts()
    load_snapshot(path, facts)
    assert facts.get("gpu.count") == 2 and facts.source("gpu.count") == "snapshot"


@pytest.mark.parametrize("content, words", [
    ("{broken", "invalid JSON"),
    ('{"kind": "other"}', "not a vllm-doctor facts snapshot"),
    ('{"kind": "vllm-doctor-facts", "schema_version": 9, "facts": {}}', "schema_version"),
    ('{"kind": "vllm-doctor-facts", "schema_version": 1, "facts": {"gpu.count": 3}}', "must be an object"),
    ("just some text", "neither"),
])
def test_malformed_snapshot(tmp_path, content, words):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(SnapshotError) as err:
        load_snapshot(path, Facts())
    assert words in str(err.value) and "\n" not in str(err.value)


def test_missing_snapshot_file(tmp_path):
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path / "nope.json", Facts())


def test_gather_everything(fake_nvml):
    facts = Facts()
    notices = gather_facts(facts, model=str(MODELS / "llama-3-70b"), environ={"CUDA_VISIBLE_DEVICES": "0,1"},
                           nvml=fake_nvml.h100_sxm_x8())
    assert notices == []
    assert facts.get("gpu.count") == 2 and facts.get("model.num_kv_heads") == 8
    assert facts.get("env.vars") == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_gather_no_driver_notice(fake_nvml):
    notices = gather_facts(Facts(), environ={}, nvml=fake_nvml.no_driver())
    assert any("no NVIDIA driver" in n for n in notices)


def test_gather_no_nvml_is_unknown_not_zero_gpus(fake_nvml):
    # a log asking for 8 GPUs read (with this machine's facts) where NVML cannot start: the GPU count is
    # unknown, so there is no gpu.count at all and nothing contradicts the log
    facts = Facts()
    facts.set("args.tensor_parallel_size", 8, "log")
    notices = gather_facts(facts, environ={}, nvml=fake_nvml.no_driver())
    assert "gpu.count" not in facts and "gpu.devices" not in facts
    assert facts.conflicts == []
    assert facts.source("gpu.nvml_error") == "nvml"          # why the GPUs are unknown, for the remedies
    assert any("no NVIDIA driver" in n for n in notices)
    assert not any("elsewhere" in n or "asks for" in n for n in notices)


def test_gather_log_gpu_count_beats_live(fake_nvml):
    facts = Facts()
    facts.set("gpu.count", 4, "log")
    gather_facts(facts, environ={}, nvml=fake_nvml.h100_sxm_x8())
    assert facts.get("gpu.count") == 4 and facts.source("gpu.count") == "log"
    assert facts.get("gpu.devices")[0]["name"] == "NVIDIA H100 80GB HBM3"


def test_gather_not_live_skips_machine(tmp_path, fake_nvml):
    nvml = fake_nvml.h100_sxm_x8()
    snap = tmp_path / "env.txt"
    snap.write_text(OLD)
    facts = Facts()
    gather_facts(facts, live=False, snapshot=str(snap), nvml=nvml)
    assert nvml.calls == [] and "env.vars" not in facts
    assert facts.get("gpu.count") == 4


def test_gather_model_from_log_args():
    facts = Facts()
    facts.set("args.model", str(MODELS / "qwen2.5-7b"), "log")
    gather_facts(facts, live=False)
    assert facts.get("model.num_attention_heads") == 28
