"""`check` knows what the log mode knows: every rule is either predicted before launch (and a test below or
in test_check.py shows it) or listed with the reason it cannot be. The list of reasons may only shrink."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli
from test_check import MODELS, rules
import test_check

from vllm_doctor.checks.preflight import COULD_NOT_CHECK, exit_code

# rule -> the test that shows `check` predicting it (module:function)
PREDICTED = {
    "cli-invalid-choice": "test_check_parity:test_kv_cache_dtype_fp4_for_0_32",
    "cli-unknown-arg": "test_check:test_unknown_and_removed_flags_for_version",
    "compute-capability": "test_check:test_bf16_on_old_gpu",
    "cuda-oom-load": "test_check:test_memory_predictions",
    "gpu-memory-utilization-too-high": "test_check_parity:test_utilization_out_of_range",
    "kv-cache-insufficient": "test_check:test_memory_predictions",
    "max-model-len-too-large": "test_check:test_max_model_len_beyond_derived",
    "model-not-found": "test_check_parity:test_a_local_model_path_that_is_not_there",
    "nccl-network": "test_cluster_checks:test_duplicate_vllm_host_ip_names_the_node_and_the_variable",
    "cluster-version-mismatch": "test_cluster_checks:test_versions_differ_across_nodes",
    "nccl-p2p": "test_check:test_p2p_is_informational",
    "nccl-shm": "test_check:test_shm_in_docker_and_small_container",
    "no-gpu": "test_check_parity:test_a_machine_without_gpus",
    "parallel-exceeds-gpus": "test_check:test_world_size_exceeds_visible_gpus",
    "port-in-use": "test_check:test_port_taken_uses_probe",
    "pp-unsupported": "test_check_parity:test_pipeline_on_a_release_without_it",
    "tp-heads-indivisible": "test_check:test_seed_case_vicuna_tp3_on_three_gpus",
    "tp-kv-heads-indivisible": "test_check:test_kv_heads_and_vocab_rules",
    "tp-shape-indivisible": "test_check:test_kv_heads_and_vocab_rules",
    "transformers-too-old": "test_check_parity:test_a_model_type_transformers_does_not_know",
    "trust-remote-code": "test_check_parity:test_a_config_with_auto_map_needs_remote_code",
}

# rule -> why `check` cannot predict it before launch. This list may only shrink.
CANNOT = {
    "arch-unsupported": "needs vLLM's model registry of that release (architectures it implements), which the "
                        "doctor does not ship",
    "cuda-fork": "a property of the user's Python script (CUDA initialised before vLLM forks its workers), not of "
                 "the launch command",
    "cuda-oom-runtime": "depends on the traffic after start-up (batch shapes, sampling); start-up profiling bounds "
                        "only the start",
    "cuda-visible-devices": "an invalid ordinal shows when torch initialises CUDA in each worker; NVML's view of "
                            "the devices is not torch's",
    "driver-too-old": "needs the CUDA version the server's torch was built for, which only the server's install "
                      "knows",
    "install-broken": "a broken install shows only when vLLM is imported on the server",
    "nccl-generic": "NCCL errors come from communicator set-up on the real fabric",
    "nccl-timeout": "a collective that never completes shows only at run time",
    "startup-stalled": "a hang prints nothing to predict; it shows only as time passing",
}
MAX_CANNOT = 9        # lower it when a rule moves to PREDICTED; never raise it


def test_every_rule_is_predicted_or_has_a_reason(catalog):
    # the server family is what `health` reads on a running server: no launch to predict it from
    ids = {r.id for r in catalog.rules.values() if r.family != "server"}
    assert ids == set(PREDICTED) | set(CANNOT), ids ^ (set(PREDICTED) | set(CANNOT))
    assert not set(PREDICTED) & set(CANNOT)
    assert len(CANNOT) <= MAX_CANNOT
    import test_check_parity
    import test_cluster_checks
    modules = {"test_check": test_check, "test_check_parity": test_check_parity,
               "test_cluster_checks": test_cluster_checks}
    for rule, where in PREDICTED.items():
        module, name = where.split(":")
        assert callable(getattr(modules[module], name, None)), (rule, where)


def _prediction(d, rule):
    found = [f for f in d.findings if f.rule == rule]
    assert found, (rule, rules(d), d.notices)
    return found[0]


# -- the four launches of the issue ------------------------------------------------------------------

def test_a_config_with_auto_map_needs_remote_code(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/tinyremote")
    f = _prediction(d, "trust-remote-code")
    assert "--trust-remote-code" in f.fix_command
    assert exit_code(d) == 1
    # the flag given: nothing to predict for it
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/tinyremote --trust-remote-code")
    assert "trust-remote-code" not in rules(d)


@pytest.mark.parametrize("value, version, phrase", [
    ("1.5", "0.32.0", "less than or equal to 1"),
    ("0", "0.32.0", "greater than 0"),
    ("1.5", "0.8.5", "must be less than 1.0"),
])
def test_utilization_out_of_range(check, value, version, phrase):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b --gpu-memory-utilization {value}",
              vllm_version=version)
    f = _prediction(d, "gpu-memory-utilization-too-high")
    assert phrase in f.evidence[0].message
    new = f.fix_command.split("--gpu-memory-utilization ")[1].split()[0]
    assert 0 < float(new) <= 1, f.fix_command


def test_kv_cache_dtype_fp4_for_0_32(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b --kv-cache-dtype fp4", vllm_version="0.32.0")
    f = _prediction(d, "cli-invalid-choice")
    assert "invalid choice: 'fp4'" in f.evidence[0].message
    assert "--kv-cache-dtype fp4" not in f.fix_command
    # the values real builds accept are not flagged
    for ok in ("fp8", "fp8_e5m2", "bfloat16", "auto"):
        d = check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b --kv-cache-dtype {ok}", vllm_version="0.32.0")
        assert "cli-invalid-choice" not in rules(d), ok


def test_an_uncached_model_without_gpu_facts_could_not_be_checked():
    # a model neither on this machine nor in the shipped table (test_model_table: a listed one is answered)
    r = run_cli("check", "--no-live", "--vllm-version", "0.32.0", "--", "vllm", "serve",
                "acme-corp/llama-70b-private", "-tp", "3")
    out = r.stdout.decode()
    assert r.returncode == COULD_NOT_CHECK == 3, (out, r.stderr.decode())
    assert "no failure predicted" not in out and "could not check" in out
    assert "heads / KV heads / shapes vs tensor parallel: no model config" in out
    assert "memory: weights and KV cache per GPU: no GPU facts" in out
    r = run_cli("check", "--no-live", "--format", "json", "--", "vllm", "serve", "acme-corp/llama-70b-private",
                "-tp", "3")
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "unchecked"
    skipped = {c["check"] for c in doc["coverage"] if not c["ran"] and c["essential"]}
    assert "memory: weights and KV cache per GPU" in skipped


def test_a_green_light_needs_the_checks_that_matter(check):
    """Control for the above: with the config and the GPUs known, every essential check runs and the
    same layout that fits gives exit 0."""
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-3-70b -tp 8 --max-model-len 4096")
    assert d.findings == [] and d.unchecked == [] and exit_code(d) == 0
    assert all(c.ran for c in d.coverage if c.essential)


def test_given_gpus_stand_for_the_target_machine():
    r = run_cli("check", "--no-live", "--gpus", "3", "--gpu-memory", "80", "--", "vllm", "serve",
                f"{MODELS}/vicuna-13b", "-tp", "3")
    assert r.returncode == 1 and "tp-heads-indivisible" in r.stdout.decode()
    r = run_cli("check", "--no-live", "--gpus", "1", "--gpu-memory", "80", "--", "vllm", "serve",
                f"{MODELS}/qwen2.5-7b")
    assert r.returncode == 0, r.stdout.decode()
    r = run_cli("check", "--no-live", "--gpus", "1", "--", "vllm", "serve", f"{MODELS}/qwen2.5-7b")
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1


# -- the other rules `check` now predicts --------------------------------------------------------------

def test_a_model_type_transformers_does_not_know(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/future-type")
    f = _prediction(d, "transformers-too-old")
    assert f.facts["model_type"] == "qwen9" and f.confidence == "medium"
    # a type the installed transformers knows: nothing
    assert "transformers-too-old" not in rules(check("h100_sxm_x8", f"vllm serve {MODELS}/qwen2.5-7b"))


def test_a_local_model_path_that_is_not_there(catalog, tmp_path):
    from vllm_doctor.checks.preflight import predict

    missing = tmp_path / "Qwen2.5-7B-Instrcut"
    d = predict(f"vllm serve {missing}", catalog, live=True, port_probe=None, nvml=None, environ={})
    assert "model-not-found" in rules(d)
    # inside a container the path is the container's: not checked here
    d = predict(f"docker run --gpus all vllm/vllm-openai --model {missing}", catalog, live=True, port_probe=None,
                environ={})
    assert "model-not-found" not in rules(d)


def test_a_machine_without_gpus(check):
    d = check("no_driver", f"vllm serve {MODELS}/qwen2.5-7b")
    assert "no-gpu" in rules(d), (rules(d), d.notices)


def test_pipeline_on_a_release_without_it(check):
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-3-70b -pp 2", vllm_version="0.4.0")
    assert "pp-unsupported" in rules(d)
    d = check("h100_sxm_x8", f"vllm serve {MODELS}/llama-3-70b -pp 2 --max-model-len 4096", vllm_version="0.8.5")
    assert "pp-unsupported" not in rules(d)
