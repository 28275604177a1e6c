"""Platform remedies (no GPU, CUDA_VISIBLE_DEVICES, driver, compute capability) and their refine hooks, on real log
lines run through the engine (remedy_context / diagnose, tests/remedies/conftest.py), with fake-NVML facts."""
import pytest

from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.facts import Facts
from vllm_doctor.facts.nvml import collect_gpu_facts
from vllm_doctor.remedies import gpu_arch, platform

ORDINAL = "RuntimeError: CUDA error: invalid device ordinal"
NO_GPUS = "RuntimeError: No CUDA GPUs are available"


def nvml_facts(machine, env=None):
    facts = Facts()
    collect_gpu_facts(facts, machine, environ=env or {})
    return facts


def test_mig_gpu_gets_a_mig_uuid(fake_nvml, remedy_context):
    facts = nvml_facts(fake_nvml.a100_mig(), {"CUDA_VISIBLE_DEVICES": "1"})
    ctx = remedy_context(ORDINAL, facts=facts, command="CUDA_VISIBLE_DEVICES=1 vllm serve m",
                         rule="cuda-visible-devices")
    fix = platform.fix_visible_devices(ctx)
    assert SetEnv("CUDA_VISIBLE_DEVICES", fake_nvml.MIG_3G["uuid"]) in fix.edits
    assert fake_nvml.MIG_3G["uuid"] in fix.summary
    assert any("MIG" in n for n in fix.notes)


def test_visible_devices_picks_existing_least_used_gpus(fake_nvml, remedy_context):
    facts = nvml_facts(fake_nvml.rtx4090_x2(), {"CUDA_VISIBLE_DEVICES": "2"})
    facts.set("args.tensor_parallel_size", 1, "log")
    ctx = remedy_context(ORDINAL, facts=facts, command="CUDA_VISIBLE_DEVICES=2 vllm serve m",
                         rule="cuda-visible-devices")
    assert SetEnv("CUDA_VISIBLE_DEVICES", "1") in platform.fix_visible_devices(ctx).edits  # GPU 0 is busy (20 GiB used)


def test_mixed_devices_sets_pci_bus_order(remedy_context):
    ctx = remedy_context(["Detected different devices in the system: RTX 3090, GTX 1080 Ti. Please make sure to set "
                          "`CUDA_DEVICE_ORDER=PCI_BUS_ID` to avoid unexpected behavior.", ORDINAL],
                         command="CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 2", rule="cuda-visible-devices")
    assert ctx.capture("device_names") == "RTX 3090, GTX 1080 Ti"
    assert SetEnv("CUDA_DEVICE_ORDER", "PCI_BUS_ID") in platform.fix_visible_devices(ctx).edits


def test_no_gpu_in_docker_without_gpus_flag(remedy_context):
    ctx = remedy_context(NO_GPUS, command="docker run -p 8000:8000 vllm/vllm-openai --model m", rule="no-gpu")
    assert platform.fix_no_gpu(ctx).edits == [DockerOption("--gpus", "all")]


def test_no_gpu_in_docker_with_gpus_flag_is_not_blamed_on_the_flag(remedy_context):
    for given in ("--gpus all", "--runtime=nvidia", "--device nvidia.com/gpu=all"):
        ctx = remedy_context(NO_GPUS, command=f"docker run {given} vllm/vllm-openai --model m", rule="no-gpu")
        assert DockerOption("--gpus", "all") not in platform.fix_no_gpu(ctx).edits, given


def test_docker_without_container_toolkit_keeps_the_command_and_names_the_toolkit(remedy_context):
    ctx = remedy_context('docker: Error response from daemon: could not select device driver "" with capabilities: '
                         '[[gpu]].', command="docker run --gpus all vllm/vllm-openai --model m", rule="no-gpu")
    fix = platform.fix_no_gpu(ctx)
    assert fix.edits == [] and "NVIDIA Container Toolkit" in fix.summary and "your command is right" in fix.summary


def test_nvml_unknown_error_recreates_the_container_instead_of_blaming_the_driver(remedy_context):
    fix = platform.fix_no_gpu(remedy_context("Failed to initialize NVML: Unknown Error", command="vllm serve m",
                                             rule="no-gpu"))
    assert fix.summary.startswith("Recreate the container") and "Install" not in fix.summary
    live = platform.fix_no_gpu(remedy_context(NO_GPUS, command="vllm serve m", rule="no-gpu",
                                              facts={"gpu.nvml_error": "NVML could not be initialised: Unknown Error"}))
    assert live.summary.startswith("Recreate the container")


def test_no_gpu_without_driver(fake_nvml, remedy_context):
    ctx = remedy_context("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                         "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
                         facts=nvml_facts(fake_nvml.no_driver()), command="vllm serve m", rule="no-gpu")
    fix = platform.fix_no_gpu(ctx)
    assert "driver" in fix.summary
    assert any("NVML" in a for a in fix.arithmetic)


def test_no_gpu_empty_visible_devices(fake_nvml, remedy_context):
    facts = nvml_facts(fake_nvml.rtx4090_x2(), {"CUDA_VISIBLE_DEVICES": ""})
    ctx = remedy_context(NO_GPUS, facts=facts, command='CUDA_VISIBLE_DEVICES="" vllm serve m', rule="no-gpu")
    assert SetEnv("CUDA_VISIBLE_DEVICES", "0,1") in platform.fix_no_gpu(ctx).edits


def test_no_gpu_ray_actor_and_cpu_torch_and_802(remedy_context):
    ray = remedy_context("(RayWorkerWrapper pid=5512, ip=10.0.0.2) " + NO_GPUS, command="vllm serve m", rule="no-gpu")
    assert "Ray" in platform.fix_no_gpu(ray).summary
    cpu = remedy_context("AssertionError: Torch not compiled with CUDA enabled", rule="no-gpu")
    assert "CUDA build" in platform.fix_no_gpu(cpu).summary
    fm = remedy_context("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
                        "before calling NumCudaDevices() that might have already set an error? Error 802: system not "
                        "yet initialized", rule="no-gpu")
    assert "fabricmanager" in platform.fix_no_gpu(fm).summary


def test_bf16_on_turing_uses_float16(remedy_context):
    ctx = remedy_context("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                         "Your Tesla T4 GPU has compute capability 7.5. You can use float16 instead by explicitly "
                         "setting the `dtype` flag in CLI, for example: --dtype=half.", command="vllm serve m",
                         rule="compute-capability")
    fix = gpu_arch.fix_compute_capability(ctx)
    assert fix.edits == [SetFlag("--dtype", "float16")]
    assert "--dtype float16" in fix.summary and "7.5" in fix.summary


def test_quantization_needing_newer_gpu(remedy_context):
    ctx = remedy_context("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum "
                         "capability: 89. Current capability: 80.", command="vllm serve m --quantization fp8",
                         rule="compute-capability")
    fix = gpu_arch.fix_compute_capability(ctx)
    assert "8.9" in " ".join(fix.arithmetic)
    assert fix.edits and fix.edits[0].flag == "--quantization"


def test_driver_too_old_reports_cuda_version(fake_nvml, remedy_context):
    ctx = remedy_context("RuntimeError: The NVIDIA driver on your system is too old (found version 11080). Please "
                         "update your GPU driver by downloading and installing a new version from the URL: "
                         "http://www.nvidia.com/Download/index.aspx", facts=nvml_facts(fake_nvml.a100_pcie_x3()),
                         rule="driver-too-old")
    fix = platform.fix_driver(ctx)
    assert "CUDA 11.8" in fix.arithmetic[0]
    assert any("535.104.05" in a for a in fix.arithmetic)


def test_device_ordinal_refine(diagnose):
    more_ranks = diagnose(ORDINAL, facts={"args.tensor_parallel_size": 4})
    assert more_ranks.findings[0].rule == "parallel-exceeds-gpus"
    cvd = diagnose(ORDINAL, command="CUDA_VISIBLE_DEVICES=3,4 vllm serve m -tp 2")
    assert cvd.findings[0].rule == "cuda-visible-devices"
    assert cvd.findings[0].confidence == "high"


RAY_ORDINAL = [
    "(RayWorkerWrapper pid=320, ip=10.0.0.2) ERROR 05-03 11:58:28 [worker_base.py:620] Traceback (most recent call last):",
    '(RayWorkerWrapper pid=320, ip=10.0.0.2) ERROR 05-03 11:58:28 [worker_base.py:620]   File "/usr/lib/python3/dist-packages/'
    'vllm/worker/worker.py", line 176, in init_device',
    "(RayWorkerWrapper pid=320, ip=10.0.0.2) ERROR 05-03 11:58:28 [worker_base.py:620]     torch.cuda.set_device(self.device)",
    "(RayWorkerWrapper pid=320, ip=10.0.0.2) ERROR 05-03 11:58:28 [worker_base.py:620] " + ORDINAL,
]


def test_device_ordinal_without_the_variable_names_no_cause_where_ray_placed_the_process(diagnose):
    """Ray sets CUDA_VISIBLE_DEVICES per actor: with nothing showing the user's variable, the doctor names no
    rule (and says why); with the variable on the command line, the rule stands."""
    ray = diagnose(RAY_ORDINAL)
    assert [f.rule for f in ray.findings] == ["unrecognized"]
    assert "Ray gives each actor its own CUDA_VISIBLE_DEVICES" in ray.findings[0].explanation
    # the same lines with TP 4 and no variable: Ray's ranks live on other nodes, so no rank count is blamed either
    assert diagnose(RAY_ORDINAL, facts={"args.tensor_parallel_size": 4}).findings[0].rule == "unrecognized"
    shown = diagnose(RAY_ORDINAL, command="CUDA_VISIBLE_DEVICES=3,6 vllm serve m")
    assert shown.findings[0].rule == "cuda-visible-devices"


def test_device_ordinal_in_a_kv_connector_without_ray_names_no_cause(diagnose):
    lines = ["Traceback (most recent call last):",
             '  File "/usr/lib/python3/dist-packages/lmcache/v1/gpu_connector.py", line 281, in __init__',
             "    self.gpu_buffer = torch.empty(shape, device=device)", ORDINAL]
    d = diagnose(lines)
    assert [f.rule for f in d.findings] == ["unrecognized"]
    assert "KV connector" in d.findings[0].explanation and "Ray gives" not in d.findings[0].explanation


def test_device_ordinal_with_nothing_shown_is_a_low_confidence_guess(diagnose):
    bare = diagnose(ORDINAL)
    assert bare.findings[0].rule == "cuda-visible-devices"
    assert bare.findings[0].confidence == "low"
    assert any("nothing in the log or the command shows CUDA_VISIBLE_DEVICES" in n for n in bare.findings[0].notes)
    in_code = diagnose(['    os.environ["CUDA_VISIBLE_DEVICES"] = "3"', ORDINAL])
    assert (in_code.findings[0].rule, in_code.findings[0].confidence) == ("cuda-visible-devices", "high")


def test_oom_refine_for_visible_devices_set_in_code(diagnose):
    def oom(gpu):
        return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU {gpu} has a total "
                f"capacity of 44.53 GiB of which 0 bytes is free. Process 4042162 has 44.52 GiB memory in use. Of the "
                f"allocated memory 43.10 GiB is allocated by PyTorch, and 212.31 MiB is reserved by PyTorch but "
                f"unallocated.")
    facts = {"log.cvd_set_in_code": "3"}
    assert diagnose(oom(0), facts=facts).findings[0].rule == "cuda-visible-devices"
    assert diagnose(oom(3), facts=facts).findings[0].rule != "cuda-visible-devices"


def test_rocm_visibility_lists_that_disagree_are_made_to_match(diagnose):
    d = diagnose("ValueError: Inconsistent GPU visibility env vars: HIP_VISIBLE_DEVICES='0,1' vs "
                 "CUDA_VISIBLE_DEVICES='2,3'. Please set only one, or ensure they match.",
                 command="vllm serve m -tp 2")
    assert d.findings[0].rule == "cuda-visible-devices"
    assert d.findings[0].fix.edits == [SetEnv("CUDA_VISIBLE_DEVICES", "0,1")]


def test_a_physical_device_the_variable_does_not_list(diagnose):
    d = diagnose("RuntimeError: Physical device 3 for logical device 1 is not visible in CUDA_VISIBLE_DEVICES=0,2",
                 command="CUDA_VISIBLE_DEVICES=0,2 vllm serve m -tp 2")
    assert d.findings[0].rule == "cuda-visible-devices" and d.findings[0].confidence == "high"


HOOK = ("docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI "
        "runtime create failed: runc create failed: unable to start container process: error during container init: "
        "error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'")


def test_a_container_hook_that_failed_is_no_all_clear_and_its_reason_wins_when_shown(diagnose):
    """The toolkit's hook refused the container: with its reason cut, the host's GPU set-up is the fix; with the
    reason on the next line, that reason's own fix (a driver not loaded) or rule (a CUDA requirement) wins."""
    cut = diagnose(HOOK)
    assert [f.rule for f in cut.findings] == ["no-gpu"]
    assert "Container Toolkit's hook refused" in cut.findings[0].fix.summary
    shown = diagnose(HOOK + "\nnvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.")
    assert "could not reach it (nvml error: driver not loaded)" in shown.findings[0].fix.summary
    newer = diagnose(HOOK + "\nnvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please "
                            "update your driver to a newer version, or use an earlier cuda container: unknown")
    assert newer.findings[0].rule == "driver-too-old"


MAC_FRAME = ('  File "/Users/p1/miniconda3/lib/python3.12/site-packages/vllm/config.py", line 1528, in __init__\n'
             '    raise RuntimeError("Failed to infer device type")\n')


def test_no_gpu_on_a_mac_points_at_the_cpu_build_not_nvidia_smi(remedy_context):
    """Real vllm#12227: macOS's paths in the frames (/Users/…) place the run on a Mac, which has no CUDA GPU to look
    for; the same failure under a Linux path keeps the NVIDIA advice."""
    mac = remedy_context("Traceback (most recent call last):\n" + MAC_FRAME + "RuntimeError: Failed to infer device type",
                         rule="no-gpu")
    fix = platform.fix_no_gpu(mac)
    assert "Mac" in fix.summary and "nvidia-smi" not in fix.summary
    linux = remedy_context("Traceback (most recent call last):\n" + MAC_FRAME.replace("/Users/p1", "/home/p1")
                           + "RuntimeError: Failed to infer device type", rule="no-gpu")
    assert "nvidia-smi" in platform.fix_no_gpu(linux).summary


@pytest.mark.parametrize("line, words", [
    # real: NixOS/nixpkgs#406675 (RTX 5090) and vllm#29469 (GB10): a compiler older than the GPU
    ("ptxas /tmp/t.ptx, line 6; error   : PTX .version 8.4 does not support .target sm_120a", "knows sm_120a"),
    ("(EngineCore_DP0 pid=93) ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'", "knows sm_121a"),
    # real: pascal-pkgs-ci#23: a GPU older than Triton supports
    ("RuntimeError: Found Tesla P40 which is too old to be supported by the triton GPU compiler, which is used as the "
     "backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of CUDA capability 6.1",
     "compute capability 7.0 or newer"),
    # real: vllm#31740: FlashInfer's kernel built for another architecture
    ("RuntimeError: No supported CUDA architectures found for major versions [10].", "architecture 10.x"),
])
def test_a_kernel_compiler_that_cannot_build_for_this_gpu(line, words, remedy_context):
    fix = gpu_arch.fix_compute_capability(remedy_context(line, rule="compute-capability"))
    assert words in fix.summary and "--dtype" not in fix.summary
