"""GPU facts from NVML against fake machines; CUDA_VISIBLE_DEVICES mapping."""
import pynvml
import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.facts.nvml import collect_gpu_facts, init_error_hint
from vllm_doctor.facts.visible import map_visible_devices


def gpu_facts(nvml, env=None):
    facts = Facts()
    collect_gpu_facts(facts, nvml, environ=env or {})
    return facts


def test_fake_uses_real_pynvml_names_and_values(fake_nvml):
    for name in dir(fake_nvml):
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(fake_nvml, name), name
        elif name.startswith("NVMLError_"):
            assert hasattr(pynvml, name), name
    assert pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED).__class__.__name__ == "NVMLError_DriverNotLoaded"


def test_h100_nvlink_machine(fake_nvml):
    nvml = fake_nvml.h100_sxm_x8()
    facts = gpu_facts(nvml)
    assert facts.get("gpu.count") == 8 and facts.get("gpu.physical_count") == 8
    assert facts.get("gpu.driver_version") == "550.54.15"
    assert facts.get("gpu.cuda_driver_version") == "12.4"
    dev = facts.get("gpu.devices")[3]
    assert dev["name"] == "NVIDIA H100 80GB HBM3" and dev["compute_capability"] == "9.0"
    assert dev["memory_total_mib"] == 81559 and dev["memory_free_mib"] == 81558
    assert dev["pci_bus_id"] == "00000000:48:00.0"
    assert "mig_mode" not in dev  # NotSupported is skipped, not an error
    p2p = facts.get("gpu.p2p")
    assert all(cell in ("OK", "X") for row in p2p["nvlink"] for cell in row)
    assert p2p["read"][0][7] == "OK" and p2p["read"][2][2] == "X"
    topo = facts.get("gpu.topology")
    assert topo[0][1] == "NODE" and topo[0][5] == "SYS" and topo[6][6] == "X"
    assert facts.source("gpu.count") == "nvml"
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"


def test_a100_pcie_without_p2p(fake_nvml):
    facts = gpu_facts(fake_nvml.a100_pcie_x3())
    p2p = facts.get("gpu.p2p")
    assert p2p["read"][0][1] == "NS" and p2p["write"][2][0] == "NS" and p2p["nvlink"][1][2] == "NS"
    assert facts.get("gpu.topology")[0][1] == "PHB" and facts.get("gpu.topology")[0][2] == "SYS"
    assert facts.get("gpu.devices")[0]["mig_mode"] is False
    assert facts.get("gpu.devices")[0]["mig_devices"] == []


def test_rtx4090_p2p_not_supported_and_processes(fake_nvml):
    facts = gpu_facts(fake_nvml.rtx4090_x2())
    p2p = facts.get("gpu.p2p")
    assert p2p["read"][0][1] == "NS"
    assert p2p["nvlink"][0][1] == "?"  # the query itself is NotSupported
    procs = facts.get("gpu.devices")[0]["processes"]
    assert procs == [{"pid": 4242, "name": "python3", "used_mib": 20000},
                     {"pid": 5151, "name": None, "used_mib": 300}]  # vanished process keeps its pid
    assert facts.get("gpu.devices")[0]["memory_used_mib"] == 20312


def test_mig_partitioned_a100(fake_nvml):
    facts = gpu_facts(fake_nvml.a100_mig())
    dev = facts.get("gpu.devices")[0]
    assert dev["mig_mode"] is True
    assert [m["uuid"] for m in dev["mig_devices"]] == [fake_nvml.MIG_3G["uuid"], fake_nvml.MIG_2G["uuid"]]
    assert dev["mig_devices"][0]["memory_total_mib"] == 40192
    assert dev["mig_devices"][1]["gpu_instance_id"] == 3
    assert "gpu.p2p" not in facts  # one GPU: no pairs


@pytest.mark.parametrize("machine, words", [
    ("no_driver", "no NVIDIA driver loaded"),
    ("version_mismatch", "version mismatch"),
])
def test_init_failures_are_facts(machine, words, fake_nvml):
    facts = gpu_facts(getattr(fake_nvml, machine)())
    assert words in facts.get("gpu.nvml_error")
    assert "gpu.count" not in facts


def test_hints_for_library_missing():
    assert "not installed" in init_error_hint(ImportError("No module named 'pynvml'"))
    exc = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert "libnvidia-ml.so.1" in init_error_hint(exc, pynvml)


def test_real_pynvml_on_this_machine_never_raises():
    facts = Facts()
    collect_gpu_facts(facts, environ={})  # real module: either GPUs or a one-line error
    assert "gpu.count" in facts or "\n" not in facts.get("gpu.nvml_error")


DEVICES = [{"index": i, "uuid": f"GPU-{i}abc{i}-0000", "name": "NVIDIA A100-SXM4-80GB",
            "mig_devices": [{"uuid": f"MIG-{i}def", "gpu_instance_id": 1, "compute_instance_id": 0}]}
           for i in range(4)]


@pytest.mark.parametrize("value, physical, invalid, ignored, count", [
    (None, [0, 1, 2, 3], [], [], 4),
    ("2,0", [2, 0], [], [], 2),
    ("GPU-3abc", [3], [], [], 1),                      # unique UUID prefix
    ("1,7,2", [1], ["7"], ["2"], 1),                   # CUDA stops at the first invalid entry
    ("MIG-1def", [1], [], [], 1),
    ("MIG-GPU-2abc2-0000/1/0", [2], [], [], 1),        # legacy MIG syntax
    ("GPU-", [], ["GPU-"], [], 0),                      # ambiguous prefix
    ("", [], [], [], 0),
])
def test_visible_devices(value, physical, invalid, ignored, count):
    out = map_visible_devices(value, DEVICES)
    assert [d["physical_index"] for d in out["devices"]] == physical
    assert out["invalid"] == invalid and out["ignored"] == ignored and out["count"] == count


def test_duplicate_visible_device_hides_all():
    out = map_visible_devices("0,1,0", DEVICES)
    assert out["duplicates"] == ["0"] and out["count"] == 0
    assert any("repeated" in n for n in out["notes"])


def test_visible_mapping_sets_gpu_count(fake_nvml):
    facts = gpu_facts(fake_nvml.h100_sxm_x8(), {"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert facts.get("gpu.count") == 3 and facts.get("gpu.physical_count") == 8
    assert [d["physical_index"] for d in facts.get("gpu.visible")["devices"]] == [4, 5, 6]
