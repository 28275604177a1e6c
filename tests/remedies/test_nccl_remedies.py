"""NCCL remedies against facts collected from the fake NVML machines (the fake_nvml fixture, tests/conftest.py)."""
from types import SimpleNamespace

import pytest

from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.remedies import nccl
from vllm_doctor.remedies.base import RemedyContext


def match(pattern, line_ip=None, **captures):
    return SimpleNamespace(pattern=SimpleNamespace(name=pattern), captures=captures,
                           line=SimpleNamespace(ip=line_ip, raw="", message="", proc=None))


class FakeCommand:
    def __init__(self, text):
        self.text = text

    def render(self):
        return self.text

    def get(self, flag):
        return None


def ctx(matches, facts=None, command=None):
    caps = {}
    for m in matches:
        for k, v in m.captures.items():
            caps.setdefault(k, v)
    return RemedyContext(rule=None, captures=caps, matches=matches, facts=facts or Facts(),
                         command=FakeCommand(command) if command else None)


def nvml_facts(machine):
    facts = Facts()
    collect_gpu_facts(facts, machine, environ={})
    return facts


PEER = dict(src_file="/w/csrc/custom_all_reduce.cuh", src_line="307",
            cuda_error="peer access is not supported between these two devices")


def test_p2p_on_nvlink_box_with_working_p2p_does_not_blame_hardware(fake_nvml):
    facts = nvml_facts(fake_nvml.h100_sxm_x8())
    fix = nccl.fix_p2p(ctx([match("cuda-error-peer", cuda_error=PEER["cuda_error"])], facts))
    assert SetEnv("NCCL_P2P_DISABLE", "1") not in fix.edits
    assert SetEnv("VLLM_SKIP_P2P_CHECK", "0") in fix.edits
    assert "not the cause" in fix.summary
    assert any("driver" in n for n in fix.notes)
    # the workaround is still offered, as an alternative with its cost
    assert fix.alternatives and SetFlag("--disable-custom-all-reduce") in fix.alternatives[0].edits


def test_p2p_on_pcie_box_without_p2p_disables_custom_allreduce(fake_nvml):
    facts = nvml_facts(fake_nvml.a100_pcie_x3())
    fix = nccl.fix_p2p(ctx([match("custom-allreduce-peer", **PEER)], facts))
    assert fix.edits == [SetFlag("--disable-custom-all-reduce")]
    assert "--disable-custom-all-reduce" in fix.summary
    assert "no P2P" in " ".join(fix.arithmetic)
    assert any("slower" in n for n in fix.notes)


def test_p2p_nccl_failure_on_4090_sets_nccl_p2p_disable(fake_nvml):
    facts = nvml_facts(fake_nvml.rtx4090_x2())
    fix = nccl.fix_p2p(ctx([match("nccl-failed-to-peer", peer_dev="1", cuda_errno="217")], facts))
    assert SetEnv("NCCL_P2P_DISABLE", "1") in fix.edits
    assert "NCCL_P2P_DISABLE=1" in fix.summary


def test_p2p_reads_topology_pasted_in_the_log():
    rows = [match("topo-row", topo_gpu="0", topo_row="X \tPIX"), match("topo-row", topo_gpu="1", topo_row="PIX\t X")]
    fix = nccl.fix_p2p(ctx([match("custom-allreduce-peer", **PEER)] + rows))
    assert "PIX" in " ".join(fix.arithmetic)
    assert any("ACS" in n and "IOMMU" in n for n in fix.notes)  # same switch: BIOS/ACS is the real fix


def test_shm_in_docker_adds_ipc_host():
    facts = Facts()
    facts.set("env.shm_total_bytes", 64 * 1024 * 1024, "snapshot")
    m = match("shm-extend", shm_path="/dev/shm/nccl-x", shm_bytes="9637892")
    fix = nccl.fix_shm(ctx([m], facts, "docker run --gpus all vllm/vllm-openai --model m -tp 2"))
    assert fix.edits == [DockerOption("--ipc", "host")]
    assert DockerOption("--shm-size", "16g") in fix.alternatives[0].edits
    assert "64.0 MiB" in " ".join(fix.arithmetic)
    assert any("/dev/shm/nccl-*" in n for n in fix.notes)  # cleanup is a note, never run


def test_shm_inside_container_without_docker_command():
    facts = Facts()
    facts.set("env.in_container", True, "env")
    fix = nccl.fix_shm(ctx([match("shm-create-segment", shm_size="7340032")], facts, "vllm serve m -tp 8"))
    assert not any(isinstance(e, DockerOption) for e in fix.edits)
    assert "--ipc=host" in fix.summary and SetEnv("NCCL_SHM_DISABLE", "1") in fix.edits


def test_shm_on_bare_metal_falls_back_to_shm_disable():
    facts = Facts()
    facts.set("env.in_container", False, "env")
    fix = nccl.fix_shm(ctx([match("shm-fallocate", os_error="No space left on device")], facts, "vllm serve m -tp 2"))
    assert fix.edits == [SetEnv("NCCL_SHM_DISABLE", "1")]
    assert any("leaked" in n for n in fix.notes)


def test_shm_segment_missing_on_attach_is_not_called_too_small():
    facts = Facts()
    facts.set("env.in_container", False, "env")
    fix = nccl.fix_shm(ctx([match("shm-attach-segment", errno="2")], facts, "vllm serve m -tp 2"))
    assert fix.summary.startswith("The ranks do not share one /dev/shm") and "too small" not in fix.summary
    docker = nccl.fix_shm(ctx([match("shm-attach-segment", errno="2")], facts, "docker run --gpus all img -tp 2"))
    assert "do not share one /dev/shm" in docker.summary


def test_network_pins_the_interface_the_other_nodes_can_reach():
    ms = [match("socket-connect-failed", peer_addr="172.17.0.1<45613>", os_error="Connection refused"),
          match("nccl-socket-using", socket_ifs="[0]eth0:10.0.0.1<0>"),
          match("nccl-socket-using", line_ip="10.0.0.2", socket_ifs="[0]docker0:172.17.0.1<0>")]
    fix = nccl.fix_network(ctx(ms, command="vllm serve m -tp 8 -pp 2"))
    assert SetEnv("NCCL_SOCKET_IFNAME", "eth0") in fix.edits
    assert SetEnv("GLOO_SOCKET_IFNAME", "eth0") in fix.edits
    assert "docker0" in " ".join(fix.notes)
    assert "10.0.0.2" in " ".join(fix.arithmetic)


def test_network_refused_on_routable_interfaces_points_at_a_firewall():
    ms = [match("socket-connect-failed", peer_addr="10.0.0.2<45613>", os_error="Connection refused"),
          match("nccl-socket-using", socket_ifs="[0]eth0:10.0.0.1<0>"),
          match("nccl-socket-using", line_ip="10.0.0.2", socket_ifs="[0]eth0:10.0.0.2<0>")]
    fix = nccl.fix_network(ctx(ms, command="vllm serve m -tp 8 -pp 2"))
    assert "firewall" in " ".join(fix.notes)
    bad = nccl.fix_network(ctx(ms[:2] + [match("nccl-socket-using", line_ip="10.0.0.2",
                                               socket_ifs="[0]docker0:172.17.0.1<0>")], command="vllm serve m"))
    assert "firewall" not in " ".join(bad.notes)


def test_network_names_the_failed_connection_from_the_fatal_line_only():
    closed = match("connection-closed-by-peer", peer_addr="gpu-h-21<38127>")
    closed.kind = "supporting"
    ms = [match("socket-retries"), closed, match("nccl-socket-using", socket_ifs="[0]eth0:10.0.0.1<0>")]
    fix = nccl.fix_network(ctx(ms, command="vllm serve m -tp 8 -pp 2"))
    assert not any("gpu-h-21<38127>" in a for a in fix.arithmetic)
    ms[0] = match("socket-connect-failed", peer_addr="10.0.0.2<45613>", os_error="Connection refused")
    fix = nccl.fix_network(ctx(ms, command="vllm serve m -tp 8 -pp 2"))
    assert "connection to 10.0.0.2<45613> failed: Connection refused" in fix.arithmetic


def test_network_without_nccl_lines_asks_for_nccl_debug():
    fix = nccl.fix_network(ctx([match("gloo-full-mesh", gloo_error="no error")]))
    assert SetEnv("NCCL_DEBUG", "INFO") in fix.edits
    assert "GLOO_SOCKET_IFNAME" in fix.summary


def test_network_unique_ip_sets_vllm_host_ip_per_node():
    ms = [match("ray-unique-ip", n_nodes="2", n_ips="1", ips="['192.168.10.5']"),
          match("nccl-bootstrap-using", bootstrap_if="ens3", bootstrap_ip="192.168.10.5")]
    fix = nccl.fix_network(ctx(ms))
    assert SetEnv("VLLM_HOST_IP", "192.168.10.5") in fix.edits
    assert "VLLM_HOST_IP" in fix.summary


def test_watchdog_timeout_reruns_with_nccl_debug():
    m = match("watchdog", rank="1", seqnum="3", optype="ALLREDUCE", timeout_ms="600000", elapsed_ms="600049")
    fix = nccl.fix_timeout(ctx([m]))
    assert fix.edits == [SetEnv("NCCL_DEBUG", "INFO")]
    assert "ALLREDUCE #3 waited 600 s (timeout 600 s)" in fix.arithmetic[0]


def test_engine_core_timeout_raises_ready_timeout():
    fix = nccl.fix_timeout(ctx([match("engine-core-timeout", waited_s="600")]))
    assert SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", "1800") in fix.edits


@pytest.mark.parametrize("err, hint", [("unhandled system error", "/dev/shm"), ("unhandled cuda error", "P2P")])
def test_generic_names_the_usual_suspect(err, hint):
    fix = nccl.fix_generic(ctx([match("torch-nccl-error", nccl_error=err, nccl_version="2.21.5")]))
    assert fix.edits == [SetEnv("NCCL_DEBUG", "INFO")]
    assert "NCCL_DEBUG=INFO" in fix.summary
    assert any(hint in n for n in fix.notes)
