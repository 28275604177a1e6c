"""Platform remedies (no GPU, CUDA_VISIBLE_DEVICES, driver, compute capability) with fake-NVML facts."""
from types import SimpleNamespace

from vllm_doctor.refine import device_ordinal, oom_phase
from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.remedies import platform
from vllm_doctor.remedies.base import RemedyContext


def match(pattern, ip=None, **captures):
    return SimpleNamespace(pattern=SimpleNamespace(name=pattern), captures=captures,
                           line=SimpleNamespace(ip=ip, raw="", message="", proc=None))


class FakeCommand:
    def __init__(self, text, flags=None):
        self.text, self.flags = text, flags or {}

    def render(self):
        return self.text

    def get(self, flag):
        return self.flags.get(flag)


def ctx(matches, facts=None, command=None, flags=None):
    caps = {}
    for m in matches:
        for k, v in m.captures.items():
            caps.setdefault(k, v)
    return RemedyContext(rule=None, captures=caps, matches=matches, facts=facts or Facts(),
                         command=FakeCommand(command, flags) if command else None)


def nvml_facts(machine, env=None):
    facts = Facts()
    collect_gpu_facts(facts, machine, environ=env or {})
    return facts


def test_mig_gpu_gets_a_mig_uuid(fake_nvml):
    facts = nvml_facts(fake_nvml.a100_mig(), {"CUDA_VISIBLE_DEVICES": "1"})
    fix = platform.fix_visible_devices(ctx([match("invalid-device-ordinal")], facts,
                                           "CUDA_VISIBLE_DEVICES=1 vllm serve m"))
    assert SetEnv("CUDA_VISIBLE_DEVICES", fake_nvml.MIG_3G["uuid"]) in fix.edits
    assert fake_nvml.MIG_3G["uuid"] in fix.summary
    assert any("MIG" in n for n in fix.notes)


def test_visible_devices_picks_existing_least_used_gpus(fake_nvml):
    facts = nvml_facts(fake_nvml.rtx4090_x2(), {"CUDA_VISIBLE_DEVICES": "2"})
    facts.set("args.tensor_parallel_size", 1, "log")
    fix = platform.fix_visible_devices(ctx([match("invalid-device-ordinal")], facts,
                                           "CUDA_VISIBLE_DEVICES=2 vllm serve m"))
    assert SetEnv("CUDA_VISIBLE_DEVICES", "1") in fix.edits  # GPU 0 is busy (20 GiB used)


def test_mixed_devices_sets_pci_bus_order():
    fix = platform.fix_visible_devices(ctx([match("mixed-devices", device_names="RTX 3090, GTX 1080 Ti"),
                                            match("invalid-device-ordinal")], command="vllm serve m -tp 2"))
    assert SetEnv("CUDA_DEVICE_ORDER", "PCI_BUS_ID") in fix.edits


def test_no_gpu_in_docker_without_gpus_flag():
    fix = platform.fix_no_gpu(ctx([match("no-cuda-gpus")], command="docker run -p 8000:8000 vllm/vllm-openai --model m"))
    assert fix.edits == [DockerOption("--gpus", "all")]


def test_no_gpu_in_docker_with_gpus_flag_is_not_blamed_on_the_flag():
    fix = platform.fix_no_gpu(ctx([match("no-cuda-gpus")], command="docker run --gpus all vllm/vllm-openai --model m"))
    assert DockerOption("--gpus", "all") not in fix.edits


def test_docker_without_container_toolkit_keeps_the_command_and_names_the_toolkit():
    fix = platform.fix_no_gpu(ctx([match("docker-no-gpu-driver", device_driver="")],
                                  command="docker run --gpus all vllm/vllm-openai --model m"))
    assert fix.edits == [] and "NVIDIA Container Toolkit" in fix.summary and "your command is right" in fix.summary


def test_nvml_unknown_error_recreates_the_container_instead_of_blaming_the_driver():
    fix = platform.fix_no_gpu(ctx([match("nvml-unknown-error")], command="vllm serve m"))
    assert fix.summary.startswith("Recreate the container") and "Install" not in fix.summary
    facts = Facts()
    facts.set("gpu.nvml_error", "NVML could not be initialised: Unknown Error", "nvml")
    live = platform.fix_no_gpu(ctx([match("no-cuda-gpus")], facts, "vllm serve m"))
    assert live.summary.startswith("Recreate the container")


def test_no_gpu_without_driver(fake_nvml):
    facts = nvml_facts(fake_nvml.no_driver())
    fix = platform.fix_no_gpu(ctx([match("no-driver")], facts, "vllm serve m"))
    assert "driver" in fix.summary
    assert any("NVML" in a for a in fix.arithmetic)


def test_no_gpu_empty_visible_devices(fake_nvml):
    facts = nvml_facts(fake_nvml.rtx4090_x2(), {"CUDA_VISIBLE_DEVICES": ""})
    fix = platform.fix_no_gpu(ctx([match("no-cuda-gpus")], facts, 'CUDA_VISIBLE_DEVICES="" vllm serve m'))
    assert SetEnv("CUDA_VISIBLE_DEVICES", "0,1") in fix.edits


def test_no_gpu_ray_actor_and_cpu_torch_and_802():
    assert "Ray" in platform.fix_no_gpu(ctx([match("no-cuda-gpus", ip="10.0.0.2")], command="vllm serve m")).summary
    assert "CUDA build" in platform.fix_no_gpu(ctx([match("cpu-only-torch")])).summary
    assert "fabricmanager" in platform.fix_no_gpu(ctx([match("cuda-get-device-count", cuda_errno="802")])).summary


def test_bf16_on_turing_uses_float16():
    fix = platform.fix_compute_capability(ctx([match("bf16", gpu_name="Tesla T4", cc_major="7", cc_minor="5")],
                                              command="vllm serve m"))
    assert fix.edits == [SetFlag("--dtype", "float16")]
    assert "--dtype float16" in fix.summary and "7.5" in fix.summary


def test_quantization_needing_newer_gpu():
    fix = platform.fix_compute_capability(ctx([match("quant-min-capability", quantization="fp8",
                                                     min_capability="89", capability="80")],
                                              command="vllm serve m --quantization fp8", flags={"--quantization": "fp8"}))
    assert "8.9" in " ".join(fix.arithmetic)
    assert fix.edits and fix.edits[0].flag == "--quantization"


def test_driver_too_old_reports_cuda_version(fake_nvml):
    facts = nvml_facts(fake_nvml.a100_pcie_x3())
    fix = platform.fix_driver(ctx([match("torch-driver-too-old", driver_cuda="11080")], facts))
    assert "CUDA 11.8" in fix.arithmetic[0]
    assert any("535.104.05" in a for a in fix.arithmetic)


def test_device_ordinal_refine():
    def rctx(**facts):
        f = Facts()
        for k, v in facts.items():
            f.set(k.replace("__", "."), v, "log")
        return SimpleNamespace(match=match("invalid-device-ordinal"), facts=f)
    assert device_ordinal.classify(rctx(args__tensor_parallel_size=4)) == "parallel-exceeds-gpus"
    assert device_ordinal.classify(
        rctx(args__tensor_parallel_size=2, launch__command="CUDA_VISIBLE_DEVICES=3,4 vllm serve m -tp 2")) is None


def test_oom_refine_for_visible_devices_set_in_code():
    f = Facts()
    f.set("log.cvd_set_in_code", "3", "log")
    r = SimpleNamespace(match=match("oom", gpu="0", other_pid="4042162"), facts=f)
    assert oom_phase.classify_oom_visible_devices(r) == "cuda-visible-devices"
    r.match = match("oom", gpu="3")
    assert oom_phase.classify_oom_visible_devices(r) is None
