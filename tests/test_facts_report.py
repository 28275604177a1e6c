"""`vllm-doctor facts`: sizes in GiB for a person, raw numbers in the JSON snapshot (which --facts reads)."""
import json

from conftest import run_cli
from vllm_doctor.facts import Facts
from vllm_doctor.facts.gather import gather_facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.facts.snapshot import load_snapshot, save_snapshot
from vllm_doctor.reports.facts_report import fact_text, gpu_lines, render_facts_text, render_snapshot, size_text

GIB, MIB = 1 << 30, 1 << 20


def test_size_text():
    assert size_text(85520809984) == "79.6 GiB"
    assert size_text(64 * MIB) == "64 MiB"        # docker's default /dev/shm must not read as 0.1 GiB
    assert size_text(0) == "0.0 GiB"


def test_fact_sizes_by_key_suffix():
    assert fact_text("env.shm_total_bytes", 8 * GIB) == "8.0 GiB"
    assert fact_text("model.weight_bytes", 26_031_738_880) == "24.2 GiB"
    assert fact_text("log.weights_gib", 12.25) == "12.2 GiB"
    assert fact_text("model.weight_bytes_method", "safetensors") == "safetensors"
    assert fact_text("env.in_container", True) == "True"   # a bool is no size
    assert fact_text("doctor.machine_facts", {"used": False, "reason": "--no-live"}) == "not used: --no-live"


def test_gpu_lines_in_gib(fake_nvml):
    facts = Facts()
    collect_gpu_facts(facts, fake_nvml.rtx4090_x2(), environ={})
    first = gpu_lines(facts.get("gpu.devices")[0])
    used, total = 20312 / 1024, 24564 / 1024
    assert first[0].startswith("GPU 0: NVIDIA GeForce RTX 4090  ")
    assert f"{used:.1f} GiB used of {total:.1f} GiB, {total - used:.1f} GiB free" in first[0]
    assert first[1] == f"    pid 4242 python3 {20000 / 1024:.1f} GiB"
    assert first[2] == f"    pid 5151 (exited) {300 / 1024:.1f} GiB"
    mig = gpu_lines(_devices(fake_nvml.a100_mig())[0])
    assert mig[1].endswith(f"MIG 3g.40gb {40192 / 1024:.1f} GiB")


def _devices(nvml) -> list[dict]:
    facts = Facts()
    collect_gpu_facts(facts, nvml, environ={})
    return facts.get("gpu.devices")


def test_table_has_no_raw_sizes_and_says_nvml_error_once(fake_nvml):
    facts = Facts()
    notices = gather_facts(facts, environ={}, nvml=fake_nvml.h100_sxm_x8())
    facts.set("env.shm_total_bytes", 85520809984, "env", override=True)
    text = render_facts_text(facts, notices, color=False)
    assert "85520809984" not in text and "79.6 GiB" in text
    assert "MiB" not in text and "81,559" not in text
    assert text.count("GPU ") >= 8 and f"{81559 / 1024:.1f} GiB" in text
    broken = Facts()
    notices = gather_facts(broken, environ={}, nvml=fake_nvml.no_driver())
    assert render_facts_text(broken, notices, color=False).count("no NVIDIA driver loaded") == 1


def test_snapshot_keeps_raw_numbers_and_reads_back(fake_nvml, tmp_path):
    facts = Facts()
    gather_facts(facts, environ={}, nvml=fake_nvml.h100_sxm_x8())
    facts.set("env.shm_total_bytes", 85520809984, "env", override=True)
    data = json.loads(render_snapshot(facts))
    assert data == json.loads(json.dumps(save_snapshot(facts), default=str))
    assert data["facts"]["env.shm_total_bytes"]["value"] == 85520809984
    assert data["facts"]["gpu.devices"]["value"][0]["memory_total_mib"] == 81559
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    loaded = Facts()
    load_snapshot(path, loaded)
    assert loaded.get("gpu.devices")[0]["memory_total_mib"] == 81559


def test_cli_facts_of_a_snapshot_in_gib(fake_nvml, tmp_path):
    facts = Facts()
    collect_gpu_facts(facts, fake_nvml.a100_pcie_x3(), environ={})
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(save_snapshot(facts)))
    proc = run_cli("facts", "--facts", str(path))
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert "GPU 2: NVIDIA A100-PCIE-40GB  0.0 GiB used of 40.0 GiB, 40.0 GiB free" in out
    assert "40,960" not in out and "MiB" not in out
    raw = json.loads(run_cli("facts", "--facts", str(path), "--format", "json").stdout)
    assert raw["facts"]["gpu.devices"]["value"][2]["memory_total_mib"] == 40960
