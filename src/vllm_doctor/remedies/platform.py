"""Remedies for GPU availability / platform failures: no GPU, CUDA_VISIBLE_DEVICES, driver (compute capability:
remedies/gpu_arch.py)."""
from __future__ import annotations

from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.remedies.context import RemedyContext


def _ray_lines(ctx: RemedyContext) -> bool:
    """The evidence came from a Ray actor (an `ip=` prefix, a Ray process name)."""
    return any(m.line.ip or (m.line.proc or "").startswith("Ray") or "RayWorker" in m.line.raw for m in ctx.matches)


def _gives_gpus(command) -> bool:
    """A `docker run` that hands the container GPUs (--gpus, --runtime nvidia, a CDI nvidia.com/gpu device)."""
    opts = command.docker_options()
    return ("--gpus" in opts or (opts.get("--runtime") or "").startswith("nvidia")
            or any((v or "").startswith("nvidia.com/gpu") for v in command.docker_values("--device")))


def gpu_devices(ctx: RemedyContext) -> list[dict]:
    return [d for d in ctx.gpus if "error" not in d]


def visible_value(ctx: RemedyContext, need: int | None = None) -> tuple[str | None, list[str]]:
    """A CUDA_VISIBLE_DEVICES value naming GPUs that exist, `need` of them (all usable ones when None).

    Whole GPUs are named by index (with CUDA_DEVICE_ORDER=PCI_BUS_ID these are nvidia-smi's indices); a GPU in
    MIG mode cannot be used whole, only one MIG instance, by its MIG-… UUID, and a CUDA process sees at most one
    MIG device. Least-used GPUs first."""
    devs = gpu_devices(ctx)
    notes: list[str] = []
    whole = [d for d in devs if not d.get("mig_mode")]
    migs = [(d, m) for d in devs if d.get("mig_mode") for m in (d.get("mig_devices") or []) if m.get("uuid")]
    whole.sort(key=lambda d: (d.get("memory_used_mib") or 0, d.get("index", 0)))
    if need is None:
        need = len(whole) or (1 if migs else 0)
    if need and len(whole) >= need:
        chosen = sorted(whole[:need], key=lambda d: d.get("index", 0))
        if migs:
            notes.append("GPU(s) " + ", ".join(str(d["index"]) for d, _ in migs[:1])
                         + " are in MIG mode and cannot be used whole; they are left out.")
        return ",".join(str(d["index"]) for d in chosen), notes
    if migs and need <= 1:
        d, m = migs[0]
        notes.append(f"GPU {d.get('index')} ({d.get('name', '')}) is MIG-partitioned: a process can use one MIG "
                     f"instance, named by its UUID ({m.get('name', 'MIG device')}).")
        return m["uuid"], notes
    if migs and need > 1:
        notes.append("MIG instances cannot be combined for tensor parallelism (one MIG device per process).")
    return None, notes


def _before_vllm(ctx: RemedyContext, found: dict) -> Fix | None:
    """Causes outside vLLM and the command: a CPU-only torch, CUDA's init errors, the host's container toolkit,
    a container that lost its GPU device files. `found` holds the arithmetic and facts_used so far."""
    nvml_error = ctx.fact("gpu.nvml_error")
    if ctx.has_pattern("cpu-only-torch"):
        return Fix(summary="Install a CUDA build of PyTorch: this torch is CPU-only (`pip install vllm` brings the "
                           "matching CUDA wheel; check `python -c 'import torch; print(torch.version.cuda)'`)",
                   notes=["A `+cpu` torch wheel (or one installed from the CPU index) cannot use any GPU."], **found)
    errno = ctx.capture("cuda_errno")
    if errno == "802":
        return Fix(summary="Start nvidia-fabricmanager (NVSwitch system): CUDA reports 'system not yet initialized' "
                           "(cudaGetDeviceCount error 802) until the fabric manager runs",
                   notes=["`systemctl enable --now nvidia-fabricmanager`; its version must equal the driver's."],
                   **found)
    # the container runtime refused to start the container: the host needs the repair, the command is right
    for pattern, summary, check in _CONTAINER_REFUSALS:
        if ctx.has_pattern(pattern):
            summary = summary.format(cdi_devices=ctx.capture("cdi_devices") or "the GPUs",
                                     container_error=ctx.capture("container_error") or "initialization error",
                                     hook_status=ctx.capture("hook_status") or "non-zero",
                                     short_nodes=ctx.capture("short_nodes") or "every",
                                     of_nodes=f" (of {ctx.capture('total_nodes')})" if ctx.capture("total_nodes")
                                     else "")
            return Fix(summary=summary, notes=[check, "The container never started, so nothing of vLLM ran yet."],
                       **found)
    if ctx.has_pattern("nvml-unknown-error") or "Unknown Error" in str(nvml_error or ""):
        # NVML answers "Unknown Error" when a running container lost its /dev/nvidia* access (usually a
        # `systemctl daemon-reload` on the host): the driver is fine, the container is stale
        return Fix(summary="Recreate the container (docker rm + docker run, or delete the pod): it lost access to "
                           "the GPU device files, which NVML reports as 'Unknown Error'; the driver is not the problem",
                   notes=["Usually caused by `systemctl daemon-reload` on the host with the cgroupfs/systemd setup of "
                          "the NVIDIA Container Toolkit; if `nvidia-smi` fails on the host too, the GPU or driver is "
                          "in a bad state (check `dmesg` for Xid errors)."], **found)
    if ctx.has_pattern("cuda-unknown-error"):
        # cudaErrorUnknown from cudaGetDeviceCount: the CUDA driver cannot reach the GPU, whatever the variable
        return Fix(summary="CUDA could not initialise the GPU (cudaErrorUnknown): in a container, recreate it (docker "
                           "rm + docker run, or delete the pod); on the host, check that `nvidia-smi` works and that "
                           "the nvidia-uvm module is loaded (`lsmod | grep nvidia_uvm`), else reboot",
                   notes=["torch's text blames a CUDA_VISIBLE_DEVICES changed after start; that is the rare cause. "
                          "Common ones: a container that lost its GPU device files (a host `systemctl "
                          "daemon-reload`), the GPU after a suspend/resume, a driver in a bad state (`dmesg` shows "
                          "Xid errors)."], **found)
    return None


def _hides_every_gpu(ctx: RemedyContext, cvd: str) -> bool:
    visible = ctx.fact("gpu.visible") or {}
    return (cvd.strip() == "" or bool(visible.get("invalid")) or bool(visible.get("duplicates"))
            or bool(visible.get("set") and visible.get("count") == 0))


def fix_no_gpu(ctx: RemedyContext) -> Fix:
    nvml_error = ctx.fact("gpu.nvml_error")
    physical = ctx.fact("gpu.physical_count")
    arithmetic, facts_used = [], {}
    if nvml_error:
        arithmetic.append(f"NVML: {nvml_error}")
        facts_used["gpu.nvml_error"] = nvml_error
    if physical is not None:
        arithmetic.append(f"NVML sees {physical} GPU(s) on this machine")
    found = {"arithmetic": arithmetic, "facts_used": facts_used}
    early = _before_vllm(ctx, found)
    if early is not None:
        return early
    if ctx.fact("log.os") == "macOS":
        return Fix(summary="Run vLLM's CPU build on this Mac (built from source as vLLM's CPU installation docs "
                           "describe for Apple silicon) or the vllm-metal plugin: macOS has no CUDA GPU, and a vLLM "
                           "built for CUDA finds no platform there",
                   notes=["`Failed to infer device type` on a Mac means the installed vLLM has no platform for it "
                          "(or, in early-2025 releases, did not recognise an Apple-silicon CPU: vllm#12227)."],
                   **found)
    if ctx.is_docker and not _gives_gpus(ctx.command):
        return Fix(summary="Start the container with --gpus all: `docker run` without --gpus gives it no GPU",
                   edits=[DockerOption("--gpus", "all")],
                   notes=["Needs the NVIDIA Container Toolkit on the host (`nvidia-ctk runtime configure`)."], **found)
    cvd = ctx.env("CUDA_VISIBLE_DEVICES")
    if cvd is not None and _hides_every_gpu(ctx, cvd):
        value, vnotes = visible_value(ctx, ctx.world_size)
        arithmetic.append(f"CUDA_VISIBLE_DEVICES={cvd!r} leaves this process no GPU")
        if value:
            return Fix(summary=f"Set CUDA_VISIBLE_DEVICES={value}: the current value ({cvd!r}) hides every GPU",
                       edits=[SetEnv("CUDA_VISIBLE_DEVICES", value)], notes=vnotes, **found)
        return Fix(summary=f"Unset or correct CUDA_VISIBLE_DEVICES (now {cvd!r}): it hides every GPU",
                   notes=vnotes, **found)
    if _ray_lines(ctx):
        return Fix(summary="Give the Ray actors GPUs: the worker ran in a Ray actor that was scheduled with zero GPUs "
                           "(check `ray status`, start the nodes with `ray start --num-gpus N`, and do not set "
                           "CUDA_VISIBLE_DEVICES in the actor's runtime_env)", **found)
    if ctx.in_container:
        return Fix(summary="Restart the container with GPUs (docker `--gpus all`, Kubernetes `nvidia.com/gpu` limits): "
                           "this container sees no NVIDIA GPU",
                   notes=["Inside the container `nvidia-smi` must list the GPUs before vLLM can."], **found)
    if ctx.has_pattern("no-driver") or nvml_error:
        return Fix(summary="Install or load the NVIDIA driver: no driver was found (`nvidia-smi` must work first)",
                   notes=["After installing a driver, reboot (or `modprobe nvidia`) so the kernel module is loaded."],
                   **found)
    return Fix(summary="No GPU is visible: check `nvidia-smi`, CUDA_VISIBLE_DEVICES and, in a container, --gpus all",
               notes=["`Failed to infer device type` means vLLM found no platform (no CUDA GPU, no driver, or a CPU "
                      "build); VLLM_LOGGING_LEVEL=DEBUG shows why each platform was rejected."], **found)


# (pattern, the host's repair, the check that must pass before vLLM can start): the container never started
_CONTAINER_REFUSALS = (
    ("docker-no-gpu-driver",
     "Install and configure the NVIDIA Container Toolkit on the host (`nvidia-ctk runtime configure --runtime=docker`, "
     "then restart docker): docker could not find a GPU device driver; your command is right",
     "`docker run --rm --gpus all ubuntu nvidia-smi` must list the GPUs before vLLM can."),
    ("cdi-unresolvable",
     "Generate the CDI specification of the GPUs on the host (`sudo nvidia-ctk cdi generate "
     "--output=/etc/cdi/nvidia.yaml`; again after every driver upgrade): the container runtime has none for "
     "{cdi_devices}; your command is right",
     "`nvidia-ctk cdi list` must list the device before the container can use it."),
    ("container-init-error",
     "Make the NVIDIA driver work on the host first (`nvidia-smi` there must list the GPUs: install or load the "
     "driver, reboot after an upgrade): the container toolkit could not reach it ({container_error})",
     "`nvidia-smi` on the host must list the GPUs before any container can use them."),
    ("k8s-insufficient-gpu",
     "Give the pod GPUs a node has free: the scheduler found {short_nodes} node(s) short of the nvidia.com/gpu it "
     "asks for{of_nodes}. Lower its nvidia.com/gpu limit (with --tensor-parallel-size to match), free GPUs held by "
     "other pods, or add a GPU node; your vLLM command is not the problem",
     "`kubectl describe nodes` must show a node whose allocatable nvidia.com/gpu, less what is allocated, covers the "
     "pod's limit (a node without the NVIDIA device plugin advertises none)."),
    ("container-hook-failed",         # last: a reason the toolkit printed beside it is read by the entries above
     "Make the GPUs usable by containers on the host: the NVIDIA Container Toolkit's hook refused to start the "
     "container (exit status {hook_status}); its reason is the `nvidia-container-cli: …` line after it, cut here. "
     "Most often the driver is not loaded or the toolkit is not configured; your command is right",
     "`docker run --rm --gpus all ubuntu nvidia-smi` must list the GPUs before vLLM can."),
)


def fix_visible_devices(ctx: RemedyContext) -> Fix:
    if ctx.has_pattern("no-cuda-gpus"):        # refine/ray_actor.py: a Ray actor that asked for no GPU
        proc = next((m.printed.proc for m in ctx.matches if m.pattern.name == "no-cuda-gpus"), None) or "the actor"
        return Fix(f"Give the Ray actor that builds the engine ({proc}) its GPUs: Ray set its CUDA_VISIBLE_DEVICES "
                   "to empty because it asked for none (Ray Data: `map_batches(..., num_gpus=1)` or a placement "
                   "group strategy for tensor parallelism; a `@ray.remote` actor: `num_gpus=`)", [],
                   notes=["vLLM's own Ray workers ask for their GPUs; the rank-0 worker runs in the process that "
                          "created the engine, so that process needs one too."])
    if ctx.has_pattern("hip-cuda-mismatch"):
        return _hip_cuda_mismatch(ctx)
    if ctx.has_pattern("duplicate-gpu") or ctx.has_pattern("multi-rank-gpu"):
        return _duplicate_gpu(ctx)
    if ctx.has_pattern("non-integer-device-id", "uuid-device-id"):
        device = ctx.capture("device_id") or "the UUID"
        return Fix(f"List the GPUs by index, not by UUID ({device}), in --device-ids (0.32+) or the device-control "
                   f"variable (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ZE_AFFINITY_MASK): "
                   f"{ctx.capture('device_name') or 'this platform'} takes only integers", [],
                   notes=["`nvidia-smi -L` / `rocm-smi --showuniqueid` maps UUIDs to indices."])
    cvd = ctx.env("CUDA_VISIBLE_DEVICES")
    visible = ctx.fact("gpu.visible") or {}
    need = ctx.world_size
    notes, arithmetic, facts_used = [], [], {}
    if cvd is not None:
        arithmetic.append(f"CUDA_VISIBLE_DEVICES={cvd!r}")
    if visible:
        facts_used["gpu.visible"] = {k: visible.get(k) for k in ("raw", "count", "invalid", "duplicates")}
        notes += visible.get("notes") or []
    if need:
        arithmetic.append(f"tensor × pipeline parallel size = {need} GPU(s) needed")
    edits: list = []
    mixed = ctx.has_pattern("mixed-devices") or any("mixed GPU models" in n for n in visible.get("notes") or [])
    value, vnotes = visible_value(ctx, need)
    notes += vnotes
    in_code = ctx.capture("cvd_in_code")
    if ctx.has_pattern("cvd-set-in-code"):
        notes.append(f"The script sets CUDA_VISIBLE_DEVICES={in_code or '…'!r} in Python: that only "
                     "works before torch initialises CUDA. Set it on the command line instead.")
        if in_code and not value:
            value = in_code
    if value and value != cvd:
        edits.append(SetEnv("CUDA_VISIBLE_DEVICES", value))
    if mixed:
        edits.append(SetEnv("CUDA_DEVICE_ORDER", "PCI_BUS_ID"))
        notes.append("With mixed GPU models CUDA numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; "
                     "then the indices match nvidia-smi. Names seen: " + (ctx.capture("device_names") or "?"))
    if value:
        summary = f"Set CUDA_VISIBLE_DEVICES={value} before launching" + \
                  (" with CUDA_DEVICE_ORDER=PCI_BUS_ID" if mixed else "") + \
                  ("" if cvd is None else f" (now {cvd!r})")
    elif ctx.has_pattern("empty-string") or (cvd is not None and not cvd.strip()):
        summary = "Unset CUDA_VISIBLE_DEVICES (it is empty, which hides every GPU) or list the GPUs to use"
        if _ray_lines(ctx):
            notes.append("Under Ray do not set CUDA_VISIBLE_DEVICES in the actor; Ray assigns GPUs itself.")
    elif mixed:
        summary = "Set CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA's GPU numbering matches nvidia-smi"
    else:
        summary = ("List existing GPUs in CUDA_VISIBLE_DEVICES (indices as nvidia-smi shows them with "
                   "CUDA_DEVICE_ORDER=PCI_BUS_ID), as many as tensor × pipeline parallel size")
    return Fix(summary=summary, edits=edits, arithmetic=arithmetic, facts_used=facts_used, notes=notes)


def bus_id(nccl_hex: str) -> str:
    """NCCL's int64 bus id (`4f000`) as nvidia-smi prints a PCI bus id (`0000:4f:00.0`; NCCL's int64ToBusId)."""
    n = int(nccl_hex, 16)
    return f"{n >> 20:04x}:{(n >> 12) & 0xff:02x}:{(n >> 4) & 0xff:02x}.{n & 0xf:x}"


def _duplicate_gpu(ctx: RemedyContext) -> Fix:
    """NCCL refused a communicator with two ranks on one GPU: each rank needs its own."""
    a, b, bus = ctx.capture("rank_a"), ctx.capture("rank_b"), ctx.capture("bus_id")
    arithmetic = [f"ranks {a} and {b} of one NCCL communicator both use the GPU at PCI bus {bus_id(bus)}"
                  " (`nvidia-smi --query-gpu=index,pci.bus_id --format=csv` names it)"] if a and b and bus else []
    notes = ["Usual causes: every process given the same CUDA_VISIBLE_DEVICES (one GPU each, the same one); a "
             "trainer or client joining vLLM's group from a GPU the server already uses (give the server and the "
             "client disjoint GPUs); Ray placing two workers on one GPU (fractional num_gpus, colocated placement "
             "groups)."]
    if _ray_lines(ctx):
        notes.append("Under Ray do not set CUDA_VISIBLE_DEVICES in the actor; Ray assigns GPUs itself.")
    return Fix(summary="Give each rank of the group its own GPU: as many distinct GPUs in CUDA_VISIBLE_DEVICES as "
                       "tensor × pipeline parallel size, and no other process of the group on them",
               edits=[], arithmetic=arithmetic, notes=notes)


def _hip_cuda_mismatch(ctx: RemedyContext) -> Fix:
    """ROCm: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES name different GPUs; vLLM wants one list."""
    hip, cuda = ctx.capture("hip_visible"), ctx.capture("cuda_visible")
    return Fix(summary=f"Make the two lists name the same GPUs: CUDA_VISIBLE_DEVICES={hip} (as HIP_VISIBLE_DEVICES),"
                       " or set only one of the two variables",
               edits=[SetEnv("CUDA_VISIBLE_DEVICES", hip)] if hip is not None else [],
               arithmetic=[f"HIP_VISIBLE_DEVICES={hip!r} vs CUDA_VISIBLE_DEVICES={cuda!r}: vLLM on ROCm reads both"])


_DRIVER_CUDA = {  # CUDA version -> minimum Linux driver (NVIDIA's compatibility table, major releases)
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.4": "550.54.14",
    "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
}


def nccl_graph_capture(arithmetic: list[str], facts_used: dict) -> Fix:
    """NCCL refused to be captured into a CUDA graph: the libnccl vLLM loaded was built with a CUDA runtime before
    11.3, or the driver is older than R465 (strongstream.cc); vLLM captures its all-reduces in CUDA graphs."""
    arithmetic.insert(0, "CUDA-graph capture of NCCL needs an NCCL built with CUDA ≥ 11.3 and a driver ≥ R465")
    return Fix(summary="Load an NCCL built for your CUDA: install a current NCCL (`pip install -U nvidia-nccl-cu12`, or "
                       "the one matching your CUDA) and point vLLM at its libnccl.so.2 with VLLM_NCCL_SO_PATH (or "
                       "remove the old libnccl from LD_LIBRARY_PATH); with a driver older than R465, upgrade the "
                       "driver; NCCL refused to be captured into a CUDA graph",
               arithmetic=arithmetic, facts_used=facts_used,
               alternatives=[Alternative("skip CUDA-graph capture: --enforce-eager", [SetFlag("--enforce-eager")],
                                         "slower decoding")],
               notes=["vLLM records its tensor-parallel all-reduces into CUDA graphs; an NCCL from a CUDA 11.0-11.2 "
                      "build (or a driver before R465) cannot be recorded and returns `invalid usage`."])


def fix_driver(ctx: RemedyContext) -> Fix:
    driver = ctx.fact("gpu.driver_version")
    cuda_driver = ctx.fact("gpu.cuda_driver_version")
    versions = ctx.fact("env.versions") or {}
    arithmetic, facts_used = [], {}
    if ctx.capture("driver_cuda"):
        n = int(ctx.capture("driver_cuda"))
        arithmetic.append(f"the driver supports CUDA {n // 1000}.{(n % 1000) // 10} (found version {n})")
    if driver:
        arithmetic.append(f"driver {driver}" + (f" (CUDA {cuda_driver})" if cuda_driver else ""))
        facts_used["gpu.driver_version"] = driver
    torch_v = versions.get("torch") if isinstance(versions, dict) else None
    if torch_v:
        arithmetic.append(f"torch {torch_v}")
    arithmetic.append("minimum drivers: " + ", ".join(f"CUDA {k} ≥ {v}" for k, v in _DRIVER_CUDA.items()))
    if ctx.has_pattern("nvml-mismatch"):
        summary = ("Reboot (or reload the nvidia kernel module): the driver was upgraded but the old kernel module is "
                   "still loaded (Driver/library version mismatch)")
    elif ctx.capture("required_cuda"):
        need = ctx.capture("required_cuda")
        minimum = _DRIVER_CUDA.get(need)
        arithmetic.insert(0, f"the image requires CUDA {need}" + (f": driver ≥ {minimum}" if minimum else ""))
        summary = (f"Upgrade the host's NVIDIA driver to one for CUDA {need}" + (f" (≥ {minimum})" if minimum else "")
                   + ", or run an image built for the CUDA your driver supports (`nvidia-smi` shows it); the "
                   "container runtime refused to start the container")
    elif ctx.has_pattern("driver-mismatch-803"):
        summary = ("Make the CUDA user-space driver match the kernel driver (CUDA error 803): reboot after a driver "
                   "upgrade; in a container, take the image's cuda-compat library (/usr/local/cuda/compat) off "
                   "LD_LIBRARY_PATH or use an image without it -- it shadows a newer host driver")
    elif ctx.has_pattern("nccl-graph-capture-old-cuda"):
        return nccl_graph_capture(arithmetic, facts_used)
    elif ctx.capture("rma_cuda"):
        arithmetic.insert(0, f"NCCL's one-sided RMA needs CUDA driver {ctx.capture('rma_cuda')}; this driver is CUDA "
                             f"{ctx.capture('found_cuda')}")
        summary = (f"Upgrade the NVIDIA driver to one for CUDA {ctx.capture('rma_cuda')} or later"
                   + (f" (≥ {_DRIVER_CUDA[ctx.capture('rma_cuda')]})" if ctx.capture("rma_cuda") in _DRIVER_CUDA
                      else "") + ": NCCL refused a one-sided RMA operation under the driver it found")
    elif ctx.has_pattern("forward-compat"):
        summary = ("Remove the cuda-compat (forward compatibility) library from LD_LIBRARY_PATH or upgrade the host "
                   "driver: forward compatibility only works on data-center GPUs")
    else:
        summary = ("Upgrade the NVIDIA driver, or install a vLLM/PyTorch build for an older CUDA (e.g. the cu118/cu121 "
                   "wheels): the driver is too old for this CUDA runtime")
    return Fix(summary=summary, arithmetic=arithmetic, facts_used=facts_used,
               notes=["No vLLM flag works around a driver that is too old."])
