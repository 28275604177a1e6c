"""PyTorch's own warning that this GPU's architecture is not in its build (torch/cuda/__init__.py, three wordings
across torch 1.x-2.13): a precursor of compute-capability. It explains the CUDA failure that follows, whether a
rule names that failure or not, and it is no finding in a run that served."""
import json

from conftest import run_cli

START = "INFO 03-10 10:00:01 [api_server.py:1090] vLLM API server version 0.8.5\n"
WARNINGS = {
    "sm_": "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch "
           "installation.\nThe current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 "
           "sm_86 sm_90.\n",
    "cuda capability": "    Found GPU0 Tesla K80 which is of cuda capability 3.7.\n    PyTorch no longer supports this "
                       "GPU because it is too old.\n    The minimum cuda capability supported by this library is 5.0.\n",
    "(CC)": "Found GPU0 NVIDIA GB10 which is of compute capability (CC) 12.1.\nThe following list shows the CCs "
            "this version of PyTorch was built for and the hardware CCs it supports:\n",
}
FAILURE = ("ERROR 03-10 10:00:09 [core.py:396] EngineCore failed to start.\n"
           "ERROR 03-10 10:00:09 [core.py:396] Traceback (most recent call last):\n"
           "ERROR 03-10 10:00:09 [core.py:396]   File \"/x/vllm/v1/worker/gpu_worker.py\", line 120, in init_device\n"
           "ERROR 03-10 10:00:09 [core.py:396]     torch.cuda.empty_cache()\n"
           "ERROR 03-10 10:00:09 [core.py:396] RuntimeError: CUDA error: {}\n")
SERVED = "INFO 03-10 10:00:30 [launcher.py:28] Available routes are:\nINFO:     Application startup complete.\n"


def _report(tmp_path, text: str) -> tuple[int, dict]:
    log = tmp_path / "arch.log"
    log.write_text(text)
    proc = run_cli("--no-live", "--format", "json", str(log))
    return proc.returncode, json.loads(proc.stdout)


def test_the_build_warning_explains_the_failure_that_follows(tmp_path):
    for kind, warning in WARNINGS.items():
        for error in ("invalid device function", "no kernel image is available for execution on the device"):
            rc, report = _report(tmp_path, START + warning + FAILURE.format(error))
            top = report["findings"][0]
            assert rc == 1 and top["rule"] == "compute-capability", (kind, error, top["rule"])
            assert "Install a PyTorch build with kernels for" in top["fix"]["summary"], (kind, top["fix"])
    rc, report = _report(tmp_path, START + WARNINGS["sm_"] + FAILURE.format("invalid device function"))
    assert "12.0" in report["findings"][0]["fix"]["summary"] and "cu128" in report["findings"][0]["fix"]["summary"]


def test_alone_in_a_run_that_served_it_is_no_finding(tmp_path):
    for warning in WARNINGS.values():
        rc, report = _report(tmp_path, START + warning + SERVED)
        assert rc == 0 and report["findings"] == [], report["findings"]


# torch 2.8-2.10's range check as vLLM 0.18 printed it on a GB10 (its process prefix on every line of the warning)
RANGE = ("(EngineCore pid=62) /usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:435: UserWarning: \n"
         "(EngineCore pid=62)     Found GPU0 NVIDIA GB10 which is of cuda capability 12.1.\n"
         "(EngineCore pid=62)     Minimum and Maximum cuda capability supported by this version of PyTorch is\n"
         "(EngineCore pid=62)     ({lo}) - ({hi})\n"
         "(EngineCore pid=62)     \n")
OOM = ("ERROR 03-10 10:00:09 [core.py:396] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
       "GPU 0 has a total capacity of 119.70 GiB of which 1.20 GiB is free.\n")


def test_a_gpu_that_runs_a_kernel_of_the_build_is_not_explained_by_the_warning(tmp_path):
    """Same major as a built capability, at or above its minor: the build's kernels run there (GB10 12.1 under a
    (8.0)-(12.0) build), so the failure that follows keeps its own rule, or stays unrecognized with a note."""
    rc, report = _report(tmp_path, START + RANGE.format(lo="8.0", hi="12.0") + OOM)
    assert rc == 1 and [f["rule"] for f in report["findings"]] == ["cuda-oom-runtime"], report["findings"]
    rc, report = _report(tmp_path, START + RANGE.format(lo="8.0", hi="12.0") + FAILURE.format("unspecified launch failure"))
    top = report["findings"][0]
    assert top["rule"] == "unrecognized" and "sm_120 kernels" in top["explanation"], top
    # a build whose newest kernels are of another major: the warning is the cause
    rc, report = _report(tmp_path, START + RANGE.format(lo="5.0", hi="9.0") + OOM)
    assert report["findings"][0]["rule"] == "compute-capability", report["findings"]

