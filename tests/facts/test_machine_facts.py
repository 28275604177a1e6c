"""No NVML is "GPUs unknown", never "zero GPUs"; and check, plan and run use this machine's facts as the
target's own (doctor.machine_facts says so, nothing says "written elsewhere").

The CLI tests put a stand-in `pynvml` first on PYTHONPATH whose nvmlInit fails like nvidia-ml-py's without
libnvidia-ml.so.1, so they behave the same on a machine with GPUs."""
import json
import sys

import pytest

from conftest import Gpu, FakeNVML, Machine, run_cli
from vllm_doctor.checks.preflight import predict
from vllm_doctor.facts import Facts
from vllm_doctor.facts import nvml as nvml_mod
from vllm_doctor.facts.gather import gather_facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.facts.origin import used_reason

MODEL = "tests/fixtures/models/vicuna-13b"
NO_LIBRARY = '''
NVML_ERROR_LIBRARY_NOT_FOUND = 12
class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value
def nvmlInit():
    raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
def nvmlShutdown():
    pass
'''
LEFT_OUT_WORDS = ("elsewhere", "left out", "says 0", "has none")


def empty_machine() -> FakeNVML:
    """A driver that starts but lists no GPU (a container with the driver's libraries, no device files)."""
    return FakeNVML(Machine(gpus=[], p2p={}, topology=lambda a, b: 0))


@pytest.fixture
def no_nvml_env(tmp_path):
    (tmp_path / "pynvml.py").write_text(NO_LIBRARY)
    return {"PYTHONPATH": str(tmp_path)}


def test_nvml_listing_no_gpu_sets_no_fact():
    facts = Facts()
    notice = collect_gpu_facts(facts, empty_machine(), environ={})
    assert list(facts.items()) == []           # no gpu.count = 0, no driver version either
    assert "lists no GPU" in notice


def test_nvml_module_missing_sets_only_the_reason(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(nvml_mod, "_import_pynvml", missing)
    facts = Facts()
    collect_gpu_facts(facts, environ={})
    assert [key for key, _ in facts.items()] == ["gpu.nvml_error"]
    assert "not installed" in facts.get("gpu.nvml_error")


@pytest.mark.parametrize("machine", ["empty", "no_driver"])
def test_no_gpus_here_never_contradicts_the_log(machine, fake_nvml):
    nvml = empty_machine() if machine == "empty" else fake_nvml.no_driver()
    facts = Facts()
    facts.set("gpu.count", 3, "log")
    notices = gather_facts(facts, environ={}, nvml=nvml)
    assert facts.get("gpu.count") == 3 and facts.source("gpu.count") == "log"
    assert facts.conflicts == []
    assert notices and not any(word in n for n in notices for word in LEFT_OUT_WORDS)


def test_working_nvml_still_disagrees_with_the_log(fake_nvml):
    # a real count from a working NVML is a fact: a log that says otherwise is a real conflict
    facts = Facts()
    facts.set("gpu.count", 4, "log")
    gather_facts(facts, environ={}, nvml=FakeNVML(Machine(gpus=[Gpu("NVIDIA L4", 23034, (8, 9))], p2p={},
                                                          topology=lambda a, b: 0)))
    assert facts.conflicts and facts.conflicts[0][2].value == 1 and facts.conflicts[0][2].source == "nvml"


def test_used_reason_by_caller():
    facts = Facts()
    assert used_reason(facts) == "the command runs on this machine"
    facts.set("doctor.live", True, "env")
    assert "server runs on this machine" in used_reason(facts)
    saved = Facts()
    saved.set("args.tensor_parallel_size", 3, "log")
    assert used_reason(saved) == "--live"


def test_check_in_process_with_no_driver(catalog, fake_nvml):
    d = predict(f"vllm serve {MODEL} -tp 3", catalog, nvml=fake_nvml.no_driver(), environ={}, port_probe=None)
    machine = d.facts.get("doctor.machine_facts")
    assert machine == {"used": True, "reason": "the command runs on this machine"}
    assert "gpu.count" not in d.facts and d.facts.conflicts == []
    assert not any(word in n for n in d.notices for word in LEFT_OUT_WORDS), d.notices


def _no_left_out(text: str) -> None:
    for word in LEFT_OUT_WORDS:
        assert word not in text, (word, text)


def test_check_cli_without_nvml(no_nvml_env):
    text = run_cli("check", "-vv", "--", "vllm", "serve", MODEL, "-tp", "3", env=no_nvml_env)
    out = text.stdout.decode() + text.stderr.decode()
    assert "Traceback" not in out and "the command runs on this machine" in out
    _no_left_out(out)
    report = json.loads(run_cli("check", "--format", "json", "--", "vllm", "serve", MODEL, "-tp", "3",
                                env=no_nvml_env).stdout)
    assert report["facts"]["doctor.machine_facts"]["value"]["used"] is True
    assert "gpu.count" not in report["facts"]


def test_plan_cli_without_nvml(no_nvml_env):
    proc = run_cli("plan", MODEL, "--gpus", "3", env=no_nvml_env)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    _no_left_out(out)
    assert "--gpu-memory GiB" in out and "?" not in out


def test_run_cli_without_nvml(no_nvml_env, tmp_path):
    server = tmp_path / "server.py"
    server.write_text("import sys\nprint('ValueError: Total number of attention heads (40) must be divisible "
                      "by tensor parallel size (3).')\nsys.exit(1)\n")
    report = tmp_path / "report.json"
    proc = run_cli("run", "--format", "json", "--report", str(report), "--", sys.executable, str(server),
                   env=no_nvml_env)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(report.read_text())
    machine = data["facts"]["doctor.machine_facts"]["value"]
    assert machine["used"] is True and "runs on this machine" in machine["reason"]
    assert "gpu.count" not in data["facts"]
    _no_left_out(" ".join(data["notices"]))
