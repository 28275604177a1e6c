"""Environment facts: variables (secrets never stored), containers, /dev/shm, versions."""
import os

from vllm_doctor.facts import Facts
from vllm_doctor.facts.env import collect_env_facts, container_kind, env_vars


def test_env_vars_selected_and_secrets_masked():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_P2P_DISABLE": "1", "VLLM_API_KEY": "sk-abc", "HF_TOKEN": "hf_xyz",
           "VLLM_PORT": "8001", "HOME": "/root", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "NCCL_IB_SECRET": "x"}
    out = env_vars(env)
    assert out["CUDA_VISIBLE_DEVICES"] == "0,1" and out["NCCL_P2P_DISABLE"] == "1" and out["VLLM_PORT"] == "8001"
    assert "HOME" not in out
    assert "sk-abc" not in out.values() and "hf_xyz" not in out.values() and "x" not in out.values()
    assert out["HF_TOKEN"].startswith("<set")


def test_container_detection(tmp_path):
    assert container_kind({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path) == "kubernetes"
    assert container_kind({}, tmp_path) is None
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("0::/system.slice/docker-4f1a.scope\n")
    assert container_kind({}, tmp_path) == "docker"
    (tmp_path / "run").mkdir()
    (tmp_path / "run/.containerenv").write_text("")
    assert container_kind({}, tmp_path) == "podman"


def test_collect_env_facts(tmp_path):
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    facts = Facts()
    collect_env_facts(facts, {"NCCL_DEBUG": "INFO"}, root=tmp_path)
    st = os.statvfs(tmp_path / "dev" / "shm")
    assert facts.get("env.shm_total_bytes") == st.f_blocks * st.f_frsize
    assert facts.get("env.in_container") is False
    assert facts.get("env.vars") == {"NCCL_DEBUG": "INFO"}
    assert facts.get("env.versions")["transformers"]  # installed here, read from metadata
    assert facts.source("env.vars") == "env"
