"""install-broken and startup-stalled: the real lines, the rule the engine picks, and the fix it hands back."""
from __future__ import annotations

from conftest import ROOT
from vllm_doctor.remedies import install, stall

# vLLM 0.7.2's registry subprocess failing (the shape of real/platform rg16-rg18, logs_corpus/config c20)
INSPECT = """ERROR 02-16 18:30:15 registry.py:306] Error in inspecting model architecture 'Qwen2ForCausalLM'
ERROR 02-16 18:30:15 registry.py:306] Traceback (most recent call last):
ERROR 02-16 18:30:15 registry.py:306]   File "/venv/lib/python3.11/site-packages/vllm/model_executor/models/registry.py", line 507, in _run_in_subprocess
ERROR 02-16 18:30:15 registry.py:306]     returned.check_returncode()
ERROR 02-16 18:30:15 registry.py:306] subprocess.CalledProcessError: Command '['/venv/bin/python', '-m', 'vllm.model_executor.models.registry']' returned non-zero exit status 1.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/vllm/model_executor/models/registry.py", line 354, in _raise_for_unsupported
    raise ValueError(
ValueError: Model architectures ['Qwen2ForCausalLM'] are not supported for now. Supported architectures: dict_keys(['LlamaForCausalLM'])
"""


def test_inspection_failure_before_not_supported_is_a_broken_install(diagnose):
    d = diagnose(INSPECT, command="vllm serve Qwen/Qwen2.5-7B-Instruct")
    assert [f.rule for f in d.findings][:1] == ["install-broken"]
    top = d.findings[0]
    assert top.unchanged and top.fix_command is None
    assert "Qwen2ForCausalLM is supported" in top.fix.summary and "--model-impl" not in top.fix.summary


def test_undefined_symbol_means_reinstall_with_its_torch(remedy_context):
    text = ("ImportError: /usr/local/lib/python3.10/dist-packages/vllm/_C.cpython-310-x86_64-linux-gnu.so: "
            "undefined symbol: _ZN2at4_ops15to_dtype_layout4callERKNS_6TensorE")
    fix = install.fix_install(remedy_context(text, facts={"vllm.version": "0.6.3"}, rule="install-broken"))
    assert "pip install vllm==0.6.3" in fix.summary and "undefined symbol" in fix.summary and fix.edits == []


def test_missing_module_is_installed(remedy_context):
    text = "ERROR 10-25 00:26:24 registry.py:272] ModuleNotFoundError: No module named 'transformers'"
    fix = install.fix_install(remedy_context(text, rule="install-broken"))
    assert fix.summary.startswith("Install transformers")


def test_a_precursor_with_nothing_after_it_when_never_ready(diagnose):
    # real/platform rg28: DEBUG/INFO lines only, the container has no NVML
    d = diagnose("DEBUG 08-02 02:39:50 [__init__.py:56] CUDA platform is not available because: NVML Shared Library "
                 "Not Found\nINFO 08-02 02:39:50 [__init__.py:248] No platform detected, vLLM is running on "
                 "UnspecifiedPlatform\n")
    assert [f.rule for f in d.findings] == ["no-gpu"]


def test_a_precursor_the_server_outlived_is_nothing(diagnose):
    d = diagnose("INFO 08-02 02:39:50 [__init__.py:248] No platform detected, vLLM is running on UnspecifiedPlatform\n"
                 "INFO 08-02 02:40:50 [launcher.py:28] Available routes are:\n"
                 "INFO:     Application startup complete.\n")
    assert d.findings == []


WAITS = "".join(f"(APIServer pid=300606) DEBUG 09-02 17:29:{s:02d} [utils.py:777] Waiting for 1 local, 0 remote "
                "core engine proc(s) to start.\n" for s in (6, 16, 26))


def test_a_log_that_ends_waiting_is_stalled_with_its_phase(diagnose):
    d = diagnose("INFO 09-02 17:28:50 [gpu_model_runner.py:1] Starting to load model zai-org/GLM-4.5-Air...\n" + WAITS,
                 command="vllm serve zai-org/GLM-4.5-Air --tensor-parallel-size 4")
    top = d.findings[0]
    assert top.rule == "startup-stalled" and len(top.evidence) == 1   # one line for the repeated wait
    assert top.facts["phase"] == "loading the weights"
    assert top.env == {"VLLM_LOGGING_LEVEL": "DEBUG", "NCCL_DEBUG": "INFO"}
    assert top.fix_command.startswith("VLLM_LOGGING_LEVEL=DEBUG NCCL_DEBUG=INFO vllm serve")


def test_a_wait_then_ready_is_no_stall(diagnose):
    d = diagnose(WAITS + "INFO 09-02 17:30:06 [core.py:1] init engine (profile, create kv cache, warmup model) took "
                 "60.1 seconds\n(APIServer pid=300606) INFO:     Application startup complete.\n")
    assert d.findings == []


def test_a_wait_then_an_error_is_the_error(diagnose):
    d = diagnose(WAITS + "ValueError: Total number of attention heads (40) must be divisible by tensor parallel "
                 "size (3).\n")
    assert [f.rule for f in d.findings][:1] == ["tp-heads-indivisible"]


def test_nccl_init_start_without_complete_is_a_hang_in_nccl(diagnose):
    start = ("node-{r}:561:561 [{r}] NCCL INFO comm 0x1476dca0 rank {r} nranks 2 cudaDev {r} nvmlDev {r} busId 23000 "
             "commId 0xa015ae7e0a50005d - Init START\n")
    done = ("node-0:561:561 [0] NCCL INFO comm 0x1476dca0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 23000 "
            "commId 0xa015ae7e0a50005d - Init COMPLETE\n")
    assert [f.rule for f in diagnose(start.format(r=0) + start.format(r=1)).findings] == ["nccl-timeout"]
    assert [f.rule for f in diagnose(start.format(r=0) + start.format(r=1) + done).findings] == ["nccl-timeout"]
    both = start.format(r=0) + start.format(r=1) + done + done.replace("rank 0", "rank 1")
    assert diagnose(both).findings == []


def test_phase_names_follow_start_up_order():
    assert stall.phase_reached({"weights_loading", "weights_loaded"}) == "the memory-profiling run"
    assert stall.phase_reached(set()).startswith("engine start-up")



def test_ranks_on_different_nccl_libraries_say_both_versions(remedy_context):
    """NCCL_VERSION_CODE is major*10000 + minor*100 + patch from 2.9 (22105 = 2.21.5), major*1000 + ... before."""
    assert (install.nccl_version("22105"), install.nccl_version("21903"), install.nccl_version("2708")) == \
        ("2.21.5", "2.19.3", "2.7.8")
    text = ("gpu-b:7:91 [0] init.cc:729 NCCL WARN Mismatched NCCL version detected : rank 1 version 22105 rank 0 "
            "version 21903")
    fix = install.fix_cluster_versions(remedy_context(text, rule="cluster-version-mismatch"))
    assert fix.arithmetic == ["rank 1: NCCL 2.21.5; rank 0: NCCL 2.19.3"] and "VLLM_NCCL_SO_PATH" in fix.summary


def test_two_ranks_on_one_gpu_name_its_bus_id(remedy_context):
    """NCCL prints the GPU's bus id as int64ToBusId's hex (0x4b000 = 0000:4b:00.0); the fix gives each rank its own."""
    from vllm_doctor.remedies import platform

    assert (platform.bus_id("4b000"), platform.bus_id("10"), platform.bus_id("101000")) == \
        ("0000:4b:00.0", "0000:00:01.0", "0001:01:00.0")
    text = "ISTD-1:1422836:1422836 [0] init.cc:943 NCCL WARN Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 4b000"
    fix = platform.fix_visible_devices(remedy_context(text, rule="cuda-visible-devices"))
    assert "0000:4b:00.0" in fix.arithmetic[0] and "its own GPU" in fix.summary


# Ray's autoscaler saying no node type can fulfil a placement group's bundle is why vLLM's placement-group wait
# never ends: a start-up cut while it waits (logs_corpus/parallel/v0111's first 14 lines) is parallel-exceeds-gpus;
# without that line the wait says nothing of why (startup-stalled); after the server served, no finding.
PG_LOG = ROOT / "logs_corpus" / "parallel" / "v0111-ray-pg-timeout.log"
AUTOSCALER = "No available node types can fulfill resource request"


def test_the_autoscalers_infeasible_request_names_the_waits_cause(diagnose):
    lines = PG_LOG.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if AUTOSCALER in ln)
    d = diagnose("".join(lines[:at + 1]))
    assert d.findings[0].rule == "parallel-exceeds-gpus"
    assert any(AUTOSCALER in ln.raw for ln in d.findings[0].evidence)
    assert "--tensor-parallel-size 2" in (d.findings[0].fix_command or "")
    before = diagnose("".join(lines[:at]))
    assert [f.rule for f in before.findings] == ["startup-stalled"]
    served = diagnose("".join(lines[:at]) + "INFO:     Application startup complete.\n" + lines[at])
    assert served.findings == [], [f.rule for f in served.findings]


# NCCL's strongstream WARN (vllm#7201, vllm#3069): an NCCL built before CUDA 11.3, or a driver before R465
GRAPH = ("node:3615176:3615176 [0] misc/strongstream.cc:53 NCCL WARN NCCL cannot be captured in a graph if either it "
         "wasn't built with CUDA runtime >= 11.3 or if the installed CUDA driver < R465.")


def test_nccl_refusing_graph_capture_is_the_library_vllm_loaded(diagnose):
    d = diagnose(GRAPH)
    assert [f.rule for f in d.findings][:1] == ["install-broken"]
    assert "VLLM_NCCL_SO_PATH" in d.findings[0].fix.summary


def test_nccl_refusing_graph_capture_is_the_driver_only_where_one_before_r465_is_seen(diagnose):
    assert [f.rule for f in diagnose(GRAPH, facts={"gpu.driver_version": "460.91.03"}).findings][:1] \
        == ["driver-too-old"]
    assert [f.rule for f in diagnose(GRAPH, facts={"gpu.driver_version": "535.104.05"}).findings][:1] \
        == ["install-broken"]


# vllm#14413's shape: Ray Data's actor built the engine (0.7.3, Ray executor) and was given no GPU
RAY_BACKEND = "INFO 03-07 05:55:40 ray_utils.py:327] Defaulting to use ray for distributed inference\n"
NO_GPU_IN = "({proc} pid=13019) ERROR 03-07 05:56:27 worker_base.py:581] RuntimeError: No CUDA GPUs are available\n"


def test_no_gpu_in_a_ray_actor_vllm_did_not_start_is_the_variable_ray_emptied(diagnose):
    d = diagnose(RAY_BACKEND + NO_GPU_IN.format(proc="_MapWorker"))
    assert [f.rule for f in d.findings][:1] == ["cuda-visible-devices"]
    assert "num_gpus" in d.findings[0].fix.summary


def test_no_gpu_in_vllms_own_ray_worker_or_without_ray_stays_no_gpu(diagnose):
    assert [f.rule for f in diagnose(RAY_BACKEND + NO_GPU_IN.format(proc="RayWorkerWrapper")).findings][:1] \
        == ["no-gpu"]
    assert [f.rule for f in diagnose(NO_GPU_IN.format(proc="_MapWorker")).findings][:1] == ["no-gpu"]


def _uvloop_missing(path: str) -> str:
    return ("Traceback (most recent call last):\n"
            f'  File "{path}", line 6, in <module>\n'
            "    import uvloop\n"
            "ModuleNotFoundError: No module named 'uvloop'\n")


def test_uvloop_missing_is_native_windows_only_where_the_paths_say_so(diagnose):
    # real/platform w403 (vllm#14813): vllm serve on native Windows, where uvloop does not build
    windows = diagnose(_uvloop_missing(r"D:\AI\.venv\Lib\site-packages\vllm\entrypoints\cli\serve.py")).findings[0]
    linux = diagnose(_uvloop_missing("/venv/lib/python3.12/site-packages/vllm/entrypoints/cli/serve.py")).findings[0]
    assert windows.rule == linux.rule == "install-broken"
    assert "Run vLLM on Linux" in windows.fix.summary and "WSL2" in windows.fix.summary
    assert "pip install uvloop" in linux.fix.summary and "Windows" not in linux.fix.summary
