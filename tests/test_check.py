"""`vllm-doctor check`: predicted failures of a launch command, on fake machines (fake NVML snapshots)."""
import json

import pytest

from conftest import run_cli

from vllm_doctor.facts import Facts  # noqa: E402
from vllm_doctor.facts.snapshot import save_snapshot  # noqa: E402
from vllm_doctor.checks.preflight import exit_code, predict  # noqa: E402
from vllm_doctor.cli.check import split_argv  # noqa: E402

MODELS = "tests/fixtures/models"


def cli(*args):
    r = run_cli(*args)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def rules(diagnosis):
    return [f.rule for f in diagnosis.findings]


def test_seed_case_vicuna_tp3_on_three_gpus(check):
    d = check("a100_pcie_x3", f"vllm serve {MODELS}/vicuna-13b -tp 3")
    top = d.findings[0]
    assert top.rule == "tp-heads-indivisible"
    assert top.title.startswith("Predicted: ") and top.facts["predicted"] is True
    assert top.facts["heads"] == 40 and top.facts["tp"] == 3
    assert top.confidence == "high"
    assert "-tp 2" in top.fix_command or "--tensor-parallel-size 2" in top.fix_command
    alts = " ".join(c or "" for _, c in top.alternatives)
    assert "--pipeline-parallel-size 3" in alts
    assert exit_code(d) == 1


def test_healthy_command_on_8xh100_predicts_nothing(check):
    for model in ("llama-3-70b", "vicuna-13b", "mixtral-8x7b", "qwen2.5-32b"):
        d = check("h100_sxm_x8", f"vllm serve {MODELS}/{model} -tp 8 --max-model-len 4096")
        assert d.findings == [], (model, rules(d))
        assert exit_code(d) == 0


def test_kv_heads_and_vocab_rules(check):
    # qwen2.5-7b: 28 heads -> tp 8 fails on heads first
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b -tp 8")
    assert rules(d)[0] == "tp-heads-indivisible"
    assert "--tensor-parallel-size 4" in d.findings[0].fix_command or "-tp 4" in d.findings[0].fix_command


def test_world_size_exceeds_visible_gpus(check):
    d = check("a100_pcie_x3", f"vllm serve {MODELS}/llama-2-13b -tp 4")
    f = d.findings[0]
    assert f.rule == "parallel-exceeds-gpus"
    assert "World size (4) is larger than the number of available GPUs (3)" in f.evidence[0].message
    assert "-tp 2" in f.fix_command or "--tensor-parallel-size 2" in f.fix_command


def test_memory_predictions(check):
    # 70B bf16 (~131 GiB) on one H100: the weights alone do not fit
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-3-70b")
    assert rules(d) == ["cuda-oom-load"]
    assert d.findings[0].facts["weights_per_gpu_gib"] > 80
    # qwen2.5-32b tp 2: 128 KiB per token per GPU (2 x 64 layers x 4 KV heads x 128 x 2 bytes), so 8192
    # tokens need 1 GiB and the model's 32768 need 4 GiB. The utilization that leaves ~2.5 GiB of KV cache
    # comes from the memory model's own figure at 0.40 (weights ~30.5 GiB, activation peak, non-torch with
    # tp 2), so a refit of its coefficients moves the launch, not the test
    probe = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-32b -tp 2 --gpu-memory-utilization 0.40").findings[0]
    assert probe.rule == "kv-cache-insufficient" and probe.facts["kv_bytes_per_token"] == 2 * 64 * 4 * 128 * 2
    util = round(0.40 + (2.5 - probe.facts["available_gib"]) / probe.facts["gpu_total_gib"], 2)
    assert 0.40 < util < 0.6, util
    d = check("h100_sxm_x8",
              f"vllm serve {MODELS}/qwen2.5-32b -tp 2 --gpu-memory-utilization {util} --max-model-len 8192")
    assert d.findings == []
    d = check("h100_sxm_x8",
              f"vllm serve {MODELS}/qwen2.5-32b -tp 2 --gpu-memory-utilization {util}")
    f = d.findings[0]
    assert f.rule == "kv-cache-insufficient" and f.facts["predicted"] is True
    assert f.facts["needed_gib"] > f.facts["available_gib"] > 0
    est = f.facts["estimated_max_len"]
    assert f.facts["kv_bytes_per_token"] == 2 * 64 * 4 * 128 * 2
    assert 8192 < est < 32768 and est % 16 == 0
    # the remedy ranks: the lowered utilization first, the shorter context (with headroom below the
    # estimate: 5 %, whole blocks) as an alternative
    from vllm_doctor.vllm_math.memory import len_with_headroom

    new_u = float(f.fix_command.split("--gpu-memory-utilization ")[1].split()[0])
    # the raised share holds one request of the model's 32768 tokens, with the least increase in 0.01 steps
    gained = lambda u: f.facts["available_gib"] + (u - util) * f.facts["gpu_total_gib"]  # noqa: E731
    assert gained(new_u) >= f.facts["needed_gib"] > gained(new_u - 0.01), (new_u, f.facts)
    safe = len_with_headroom(est)
    assert safe < est and any(f"--max-model-len {safe}" in (c or "") for _, c in f.alternatives)


def test_free_memory_below_utilization(check):
    # GPU 0 of the 4090 box has 20 GB held by another process
    d = check("rtx4090_x2", f"vllm serve {MODELS}/qwen2.5-7b --max-model-len 4096")
    f = d.findings[0]
    assert f.rule == "gpu-memory-utilization-too-high"
    assert f.facts["free_gib"] < f.facts["requested_gib"]
    # another process holds the memory: free it and rerun as it is (or lower the utilization)
    assert f.fix is not None and (f.unchanged or "--gpu-memory-utilization" in (f.fix_command or "")), f.fix
    assert f.unchanged is (f.fix_command is None)


def test_max_model_len_beyond_derived(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b --max-model-len 16384")
    f = d.findings[0]
    assert f.rule == "max-model-len-too-large" and f.facts["derived"] == 4096
    assert "--max-model-len 4096" in f.fix_command
    ok = check("h100_sxm_x8",
               f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve {MODELS}/llama-2-13b --max-model-len 16384")
    assert "max-model-len-too-large" not in rules(ok)


def test_bf16_on_old_gpu(catalog, tmp_path):
    t4 = [{"index": i, "name": "Tesla T4", "memory_total_mib": 15360, "memory_used_mib": 0,
           "memory_free_mib": 15360, "compute_capability": "7.5"} for i in range(2)]
    path = tmp_path / "t4.json"
    facts = Facts()
    facts.set("gpu.count", 2, "snapshot")
    facts.set("gpu.devices", t4, "snapshot")
    path.write_text(json.dumps(save_snapshot(facts)))
    d = predict(f"vllm serve {MODELS}/qwen2.5-7b --dtype bfloat16 -tp 2 --max-model-len 2048", catalog,
                snapshot=str(path), live=False, port_probe=None)
    f = next(f for f in d.findings if f.rule == "compute-capability")
    assert f.confidence == "high" and f.facts["cc_major"] == 7
    assert "--dtype" in f.fix_command and "bfloat16" not in f.fix_command


def test_unknown_and_removed_flags_for_version(check):
    cmd = f"vllm serve {MODELS}/llama-2-13b --swap-space 4 --max-model-len 4096"
    d = check("h100_sxm_x8", cmd, vllm_version="0.19.0")
    f = d.findings[0]
    assert f.rule == "cli-unknown-arg" and "--swap-space" not in f.fix_command
    old = check("h100_sxm_x8", cmd, vllm_version="0.10.0")
    assert "cli-unknown-arg" not in rules(old)
    bad = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b --dtype bf16")
    f = bad.findings[0]
    assert f.rule == "cli-invalid-choice" and "--dtype bfloat16" in f.fix_command


def test_port_taken_uses_probe(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b --port 8123",
              port_probe=lambda port: port == 8123)
    f = d.findings[0]
    assert f.rule == "port-in-use" and f.facts["port"] == 8123
    assert "--port 8124" in f.fix_command
    free = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b",
                 port_probe=lambda port: False)
    assert free.findings == []


def test_shm_in_docker_and_small_container(check):
    d = check("h100_sxm_x8",
              f"docker run --gpus all vllm/vllm-openai --model {MODELS}/llama-2-13b -tp 2")
    f = next(f for f in d.findings if f.rule == "nccl-shm")
    assert "--ipc" in f.fix_command or "--shm-size" in f.fix_command
    ok = check("h100_sxm_x8",
               f"docker run --gpus all --ipc=host vllm/vllm-openai --model {MODELS}/llama-2-13b -tp 2")
    assert "nccl-shm" not in rules(ok)
    small = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b -tp 2",
                  extra={"env.in_container": True, "env.shm_total_bytes": 64 << 20})
    assert "nccl-shm" in rules(small)
    single = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-2-13b",
                   extra={"env.in_container": True, "env.shm_total_bytes": 64 << 20})
    assert "nccl-shm" not in rules(single)


def test_p2p_is_informational(check):
    d = check("a100_pcie_x3", f"vllm serve {MODELS}/llama-2-13b -tp 2")
    f = next(f for f in d.findings if f.rule == "nccl-p2p")
    assert f.severity == "info" and f.confidence == "low"
    assert f.facts["pairs_without_p2p"] == ["0-1"]
    assert exit_code(d) == 0


def test_split_argv():
    assert split_argv(["--format", "json", "vllm", "serve", "m", "-tp", "2"]) == (
        ["--format", "json"], ["vllm", "serve", "m", "-tp", "2"])
    assert split_argv(["--no-live", "--", "vllm", "serve", "m"]) == (["--no-live"], ["vllm", "serve", "m"])


def test_cli_seed_case_json_and_exit_codes(machine_snapshot):
    snap = machine_snapshot("a100_pcie_x3")
    rc, out, err = cli("check", "--no-live", "--facts", snap, "--format", "json", "--",
                       "vllm", "serve", f"{MODELS}/vicuna-13b", "-tp", "3")
    assert rc == 1, err
    data = json.loads(out)
    assert data["findings"][0]["rule"] == "tp-heads-indivisible"
    assert data["findings"][0]["facts"]["predicted"] is True
    assert "-tp 2" in data["findings"][0]["fix"]["command"]
    snap8 = machine_snapshot("h100_sxm_x8")
    rc, out, err = cli("check", "--no-live", "--facts", snap8, "--cmd", f"vllm serve {MODELS}/llama-3-70b -tp 8")
    assert rc == 0 and "Traceback" not in err
    rc, out, err = cli("check", "--no-live", "--facts", snap, "--format", "markdown", "vllm", "serve",
                       f"{MODELS}/vicuna-13b", "-tp", "3")
    assert rc == 1 and "tp-heads-indivisible" in out


@pytest.mark.parametrize("args", [[], ["--", "ls", "-la"], ["--facts", "/nonexistent.json", "--", "vllm", "serve", "m"],
                                  ["--vllm-version", "abc", "--no-live", "--", "vllm", "serve", "m"],
                                  ["--cmd", "vllm serve m", "--", "vllm", "serve", "m"]])
def test_cli_bad_input_is_one_line_exit_2(args):
    rc, out, err = cli("check", *args)
    assert rc == 2
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_several_predicted_failures_get_one_combined_command(check):
    """vicuna-13b (40 heads, 4096 positions) at -tp 3 --max-model-len 100000: two predicted failures, one
    command that fixes both (as the log diagnosis gives)."""
    d = check("a100_pcie_x3", f"vllm serve {MODELS}/vicuna-13b -tp 3 --max-model-len 100000")
    assert {"tp-heads-indivisible", "max-model-len-too-large"} <= set(rules(d)), rules(d)
    combined = d.combined
    assert combined is not None and combined.form == "command"
    assert set(combined.rules) >= {"tp-heads-indivisible", "max-model-len-too-large"}
    from vllm_doctor.command import Command, SetEnv, SetFlag

    new = Command.parse(combined.command)
    for f in d.findings:
        for edit in (f.fix.edits if f.fix and f.rule in combined.rules else []):
            if isinstance(edit, SetFlag):
                assert new.get(edit.flag) == (edit.value if edit.value is not None else True), edit
            elif isinstance(edit, SetEnv):
                assert new.env.get(edit.name) == edit.value, edit


def test_a_snapshot_replaces_this_machines_facts_without_no_live(machine_snapshot):
    """The laptop + cluster-snapshot workflow: `check --facts SNAPSHOT` (no --no-live) on a machine whose NVML
    is missing or different uses the snapshot's GPUs (the world-size check once returned early on this
    machine's NVML probe error and said "no --facts snapshot")."""
    snap = machine_snapshot("a100_pcie_x3")
    rc, out, err = cli("check", "--facts", snap, "--format", "json", "--",
                       "vllm", "serve", f"{MODELS}/llama-3-70b", "-tp", "4")
    assert rc == 1, (out, err)
    data = json.loads(out)
    assert data["findings"][0]["rule"] == "parallel-exceeds-gpus", [f["rule"] for f in data["findings"]]
    assert "no --facts snapshot" not in out
    ran = {c["check"]: c["ran"] for c in data["coverage"]}
    assert ran["world size vs visible GPUs"] is True and ran["memory: weights and KV cache per GPU"] is True
    # plan with the same snapshot: its three 40 GiB GPUs, not this machine's
    rc, out, err = cli("plan", f"{MODELS}/llama-3-70b", "--facts", snap, "--format", "json")
    plan = json.loads(out)
    assert (plan["gpus"], plan["gpu_memory_gib"]) == (3, 40.0), (rc, err)


def test_a_missing_gpu_is_said_once_and_where_it_is_missing(tmp_path):
    """No GPU facts stop the GPU checks: each says why as it is (a snapshot with no GPU, --no-live, no NVML
    here), and NVML's own notice is not repeated under them."""
    from conftest import run_cli

    snapshot = tmp_path / "cpu.json"
    snapshot.write_text(run_cli("facts", "--format", "json").stdout.decode())
    cmd = ["--", "vllm", "serve", "lmsys/vicuna-13b-v1.5", "-tp", "2"]
    out = run_cli("check", "--facts", str(snapshot), *cmd).stdout.decode()
    assert "the snapshot lists no GPU" in out and "no NVML here" not in out
    out = run_cli("check", "--no-live", *cmd).stdout.decode()
    assert "no GPU facts (--no-live" in out and "no NVML here" not in out
    out = run_cli("check", *cmd).stdout.decode()
    assert out.count("NVML library (libnvidia-ml.so.1) not found") == 0 or "no NVML here" not in out


def test_a_model_that_fits_is_replicated_not_pipelined(check):
    """Qwen2.5-7B (28 heads) asked for -tp 8 on eight 80 GiB GPUs: the nearest valid size, 4, fills the GPUs with
    a second replica (--data-parallel-size 2) rather than a second pipeline stage; a release without
    --data-parallel-size (before 0.8.3) gets the pipeline layout, as before."""
    f = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b -tp 8").findings[0]
    assert f.rule == "tp-heads-indivisible"
    assert f.fix_command.endswith("-tp 4 --data-parallel-size 2"), f.fix_command
    assert "2 replicas use all 8 GPUs" in f.fix.summary and "pipeline-parallel-size 2" not in f.fix_command
    old = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b -tp 8", vllm_version="0.7.3").findings[0]
    assert "--data-parallel-size" not in (old.fix_command or "") and "--pipeline-parallel-size 2" in old.fix_command


# Qwen2-72B's shape quantized GPTQ-Int4 with 128-wide groups and the unpadded MLP (29568 = 231 x 128, as p11's
# log shows: 3696 x tp 8): no tp but 1 keeps every group on one rank (231 = 3 x 7 x 11, 64 heads)
QWEN72B_GPTQ = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192,
                "intermediate_size": 29568, "num_attention_heads": 64, "num_key_value_heads": 8,
                "num_hidden_layers": 80, "vocab_size": 152064, "max_position_embeddings": 32768,
                "torch_dtype": "float16", "tie_word_embeddings": False,
                "quantization_config": {"bits": 4, "group_size": 128, "desc_act": False, "quant_method": "gptq"}}


def test_a_model_that_fits_one_gpu_is_replicated_not_pipelined(check, tmp_path):
    """tp forced to 1 on 8 x 80 GB: ~41 GiB of weights leave a KV cache on one GPU (by the memory model `plan`
    uses), so the GPUs serve 8 replicas, not one copy cut into 8 pipeline stages."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN72B_GPTQ))
    d = check("h100_sxm_x8", f"vllm serve {tmp_path} -tp 8", vllm_version="0.10.1")
    top = d.findings[0]
    assert top.rule == "tp-shape-indivisible"
    assert "--data-parallel-size 8" in top.fix_command and "--pipeline-parallel-size" not in top.fix_command
    # the same verdict as `plan` for tp 1 on this GPU: one budget
    from vllm_doctor.checks.plan import build_plan
    from vllm_doctor.facts import Facts
    from vllm_doctor.facts.model import load_model_facts

    facts = Facts()
    load_model_facts(str(tmp_path), facts)
    facts.set("vllm.version", "0.10.1", "user")
    gib = d.facts.get("gpu.devices")[0]["memory_total_mib"] / 1024
    layouts = {(x.tp, x.pp): x for x in build_plan(facts, str(tmp_path), 8, gib).layouts}
    assert layouts[(1, 1)].fits is True


def test_a_model_that_fits_no_single_gpu_keeps_its_pipeline(check, tmp_path):
    """The same model on two 24 GB cards: no layout leaves a KV cache (~41 GiB of weights); the least short
    one comes first (two stages halve the weights per GPU), never a replica of a copy that fits nowhere."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN72B_GPTQ))
    d = check("rtx4090_x2", f"vllm serve {tmp_path} -tp 2", vllm_version="0.10.1")
    top = d.findings[0]
    assert top.rule == "tp-shape-indivisible"
    assert "--pipeline-parallel-size 2" in top.fix_command and "--data-parallel-size" not in top.fix_command
