"""`plan`, `check` and the memory remedies size a model through the one reader, vllm_math.sizing: for the same
model, launch arguments and layout they give the same KV-cache bytes per token and weight bytes (KV heads
replicated once tp > K, MLA, pipeline stages, an fp8 KV cache, --dtype float, an AWQ model with and without
its checkpoint's size)."""
import json
import shutil
from pathlib import Path

import pytest

from vllm_doctor.checks.plan import build_plan
from vllm_doctor.checks.checker import Checker
from vllm_doctor.checks.preflight import prepare
from vllm_doctor.facts import Facts
from vllm_doctor.facts.model import load_model_facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.facts.snapshot import save_snapshot
from vllm_doctor.remedies import memory
from vllm_doctor.vllm_math.sizing import GIB

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
AWQ_CHECKPOINT = 18 * GIB          # Qwen/Qwen3-32B-AWQ's four safetensors shards: 18.00 GB
NO_CACHE_BLOCKS = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                   "when initializing the engine.")

CASES = [  # model, tp, pp, extra flags, KV bytes per token per GPU worked out by hand
    ("llama-3-70b", 16, 1, [], 2 * 80 * 1 * 128 * 2),              # 8 KV heads, tp 16: one (replicated) per GPU
    ("deepseek-v3", 8, 1, [], 61 * (512 + 64) * 2),                # MLA latent, the same on every rank
    ("qwen2.5-7b", 2, 2, ["--kv-cache-dtype", "fp8"], 2 * 14 * 2 * 128 * 1),
    ("qwen3-32b-awq", 4, 1, [], 2 * 64 * 2 * 128 * 2),             # weights estimated at AWQ's bytes/parameter
    ("qwen3-32b-awq+checkpoint", 4, 1, [], 2 * 64 * 2 * 128 * 2),  # weights = the checkpoint's size
    ("vicuna-13b", 2, 1, ["--dtype", "float"], 2 * 40 * 20 * 128 * 4),
]


def model_dir(name: str, tmp_path: Path) -> Path:
    if not name.endswith("+checkpoint"):
        return MODELS / name
    model = tmp_path / name.split("+")[0]
    shutil.copytree(MODELS / model.name, model)   # a shard index stating the checkpoint's size, no weights
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": AWQ_CHECKPOINT}}))
    return model


@pytest.mark.parametrize("model, tp, pp, flags, per_token", CASES, ids=[f"{c[0]}-tp{c[1]}-pp{c[2]}" for c in CASES])
def test_plan_check_and_memory_remedy_agree(model, tp, pp, flags, per_token, tmp_path, fake_nvml, remedy_context):
    path = model_dir(model, tmp_path)
    machine = Facts()
    collect_gpu_facts(machine, fake_nvml.h100_sxm_x8(), environ={})
    snapshot = tmp_path / "h100.json"
    snapshot.write_text(json.dumps(save_snapshot(machine)))
    cmd = " ".join(["vllm serve", str(path), "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp),
                    *flags])

    # check: the facts `vllm-doctor check` gathers for this command, as its memory checks size them
    facts, command, _ = prepare(cmd, snapshot=str(snapshot), live=False)
    checked = Checker(facts, command, None).sizing_basis()

    # plan: the same model and launch arguments, this layout
    plan_facts = Facts()
    load_model_facts(str(path), plan_facts)
    for flag, name in (("--kv-cache-dtype", "kv_cache_dtype"), ("--dtype", "dtype")):
        if flag in flags:
            plan_facts.set(f"args.{name}", flags[flags.index(flag) + 1], "user")
    result = build_plan(plan_facts, model, tp * pp, 80.0)
    layout = next(x for x in result.layouts if (x.tp, x.pp) == (tp, pp))

    # a memory remedy: kv-cache-insufficient on the same command and facts, through the engine
    fix = memory.fix_kv_cache(remedy_context(NO_CACHE_BLOCKS, facts=facts, command=cmd))

    assert checked["kv_bytes_per_token"] == layout.kv_bytes_per_token == fix.facts_used["kv_bytes_per_token"] \
        == per_token
    assert checked["weight_bytes"] == fix.facts_used["weight_bytes"]
    assert result.weights_gib == pytest.approx(checked["weight_bytes"] / GIB, abs=1e-9)
    if model.endswith("+checkpoint"):
        assert checked["weight_bytes"] == AWQ_CHECKPOINT
    if "--dtype" in flags:   # float32 doubles the fp16 checkpoint's estimate as well
        assert "x 4 bytes" in checked["weights_source"]
