"""GPU facts from NVML (the pynvml module of nvidia-ml-py, imported lazily).

Every NVML failure becomes a fact, never a crash: start-up failures set gpu.nvml_error with a one-line
hint; a per-field failure (NotSupported on this GPU, a vanished process) just leaves that field out.
No NVML, or an NVML that lists no GPU, means "unknown", never "zero GPUs": only a working NVML that lists
devices sets gpu.* facts (a gpu.count = 0 would contradict every log written on a GPU machine).
The `nvml` parameter takes any object shaped like pynvml, so tests inject a fake machine.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Mapping

from . import Facts
from .visible import map_visible_devices

SOURCE = "nvml"
_NA = object()  # one sentinel for "NVML could not tell us" (after nvitop's libnvml)
MIB = 1024 * 1024
NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long fields

P2P_CAPS = {"read": "NVML_P2P_CAPS_INDEX_READ", "write": "NVML_P2P_CAPS_INDEX_WRITE",
            "nvlink": "NVML_P2P_CAPS_INDEX_NVLINK"}
# nvmlDeviceGetTopologyCommonAncestor levels in nvidia-smi's words.
TOPOLOGY_NAMES = {"NVML_TOPOLOGY_INTERNAL": "X", "NVML_TOPOLOGY_SINGLE": "PIX", "NVML_TOPOLOGY_MULTIPLE": "PXB",
                  "NVML_TOPOLOGY_HOSTBRIDGE": "PHB", "NVML_TOPOLOGY_NODE": "NODE", "NVML_TOPOLOGY_SYSTEM": "SYS"}


def _call(nvml: Any, name: str, *args: Any) -> Any:
    """Call nvml.<name>; a missing function or any NVMLError yields the sentinel."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return _NA
    try:
        return fn(*args)
    except (nvml.NVMLError, ctypes.ArgumentError):  # ArgumentError: a malformed constant, see _cap
        return _NA


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def init_error_hint(exc: BaseException, nvml: Any = None) -> str:
    """A one-line human hint for why NVML could not start."""
    if isinstance(exc, ImportError):
        return "pynvml (nvidia-ml-py) is not installed: GPU facts unavailable"
    value = getattr(exc, "value", None)

    def is_(const: str) -> bool:
        return nvml is not None and value is not None and value == getattr(nvml, const, object())

    if is_("NVML_ERROR_LIBRARY_NOT_FOUND"):
        return ("NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine, or a container "
                "started without GPU access (--gpus all / NVIDIA container runtime)")
    if is_("NVML_ERROR_DRIVER_NOT_LOADED"):
        return "no NVIDIA driver loaded (nvidia kernel module missing): GPU facts unavailable"
    if is_("NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return ("NVIDIA driver/library version mismatch (driver upgraded without a reboot?): reboot or reload "
                "the nvidia kernel modules")
    if is_("NVML_ERROR_NO_PERMISSION"):
        return "no permission to open the NVIDIA devices (/dev/nvidia*): GPU facts unavailable"
    return f"NVML failed to start ({type(exc).__name__}: {exc}): GPU facts unavailable"


def _cuda_version(value: Any) -> str | None:
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def _processes(nvml: Any, handle: Any) -> list[dict]:
    procs = _call(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    if procs is _NA:
        return []
    out = []
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        name = _call(nvml, "nvmlSystemGetProcessName", proc.pid)
        out.append({"pid": proc.pid, "name": None if name is _NA else _text(name),
                    "used_mib": None if used in (None, NOT_AVAILABLE) else used // MIB})
    return out


def _mig_devices(nvml: Any, handle: Any) -> list[dict]:
    count = _call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle)
    if count is _NA:
        return []
    out = []
    for i in range(count):
        mig = _call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
        if mig is _NA:
            continue  # empty slot (NVMLError_NotFound)
        entry: dict[str, Any] = {"index": i}
        for key, fn in (("uuid", "nvmlDeviceGetUUID"), ("name", "nvmlDeviceGetName"),
                        ("gpu_instance_id", "nvmlDeviceGetGpuInstanceId"),
                        ("compute_instance_id", "nvmlDeviceGetComputeInstanceId")):
            value = _call(nvml, fn, mig)
            if value is not _NA:
                entry[key] = _text(value)
        mem = _call(nvml, "nvmlDeviceGetMemoryInfo", mig)
        if mem is not _NA:
            entry["memory_total_mib"] = mem.total // MIB
        out.append(entry)
    return out


def _device(nvml: Any, index: int, handle: Any) -> dict:
    dev: dict[str, Any] = {"index": index}
    for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
        value = _call(nvml, fn, handle)
        if value is not _NA:
            dev[key] = _text(value)
    pci = _call(nvml, "nvmlDeviceGetPciInfo", handle)
    if pci is not _NA:
        dev["pci_bus_id"] = _text(pci.busId)
    mem = _call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    if mem is not _NA:
        dev.update(memory_total_mib=mem.total // MIB, memory_used_mib=mem.used // MIB,
                   memory_free_mib=mem.free // MIB)
    cc = _call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    if cc is not _NA:
        dev["compute_capability"] = f"{cc[0]}.{cc[1]}"
    mig = _call(nvml, "nvmlDeviceGetMigMode", handle)
    if mig is not _NA:  # (current, pending); NotSupported on GPUs without MIG
        dev["mig_mode"] = bool(mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
        dev["mig_devices"] = _mig_devices(nvml, handle) if dev["mig_mode"] else []
    dev["processes"] = _processes(nvml, handle)
    return dev


def _p2p(nvml: Any, handles: list) -> dict[str, list[list[str]]]:
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    out = {}
    for label, const in P2P_CAPS.items():
        cap = getattr(nvml, const, None)
        if isinstance(cap, tuple):  # nvidia-ml-py defines NVML_P2P_CAPS_INDEX_READ = 0, (a tuple)
            cap = cap[0]
        matrix = []
        for i, a in enumerate(handles):
            row = []
            for j, b in enumerate(handles):
                status = "X" if i == j else _call(nvml, "nvmlDeviceGetP2PStatus", a, b, cap)
                row.append(status if i == j else "?" if status is _NA or cap is None
                           else "OK" if status == ok else "NS")
            matrix.append(row)
        out[label] = matrix
    return out


def _topology(nvml: Any, handles: list) -> list[list[str]]:
    names = {getattr(nvml, const): name for const, name in TOPOLOGY_NAMES.items() if hasattr(nvml, const)}
    matrix = []
    for i, a in enumerate(handles):
        row = []
        for j, b in enumerate(handles):
            level = "X" if i == j else _call(nvml, "nvmlDeviceGetTopologyCommonAncestor", a, b)
            row.append(level if i == j else "?" if level is _NA else names.get(level, "?"))
        matrix.append(row)
    return matrix


def _import_pynvml() -> Any:
    import pynvml  # nvidia-ml-py; ~30 ms, so only when live GPU facts are wanted

    if not hasattr(pynvml, "nvmlInit"):
        raise ImportError("a 'pynvml' module without nvmlInit shadows nvidia-ml-py")
    return pynvml


def collect_gpu_facts(facts: Facts, nvml: Any = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    """Set gpu.* facts of this machine (source "nvml"); on failure set gpu.nvml_error instead.

    Returns a one-line notice when NVML works but lists no GPU (no fact is set then: the count is unknown)."""
    env = os.environ if environ is None else environ
    try:
        nvml = nvml if nvml is not None else _import_pynvml()
    except ImportError as exc:
        facts.set("gpu.nvml_error", init_error_hint(exc), SOURCE)
        return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        facts.set("gpu.nvml_error", init_error_hint(exc, nvml), SOURCE)
        return None
    try:
        return _collect(nvml, facts, env)
    finally:
        _call(nvml, "nvmlShutdown")


def _collect(nvml: Any, facts: Facts, env: Mapping[str, str]) -> str | None:
    count = _call(nvml, "nvmlDeviceGetCount")
    if count is _NA:
        facts.set("gpu.nvml_error", "NVML started but could not count the GPUs", SOURCE)
        return None
    if not count:
        return "NVML lists no GPU on this machine: GPU facts unknown"
    driver = _call(nvml, "nvmlSystemGetDriverVersion")
    if driver is not _NA:
        facts.set("gpu.driver_version", _text(driver), SOURCE)
    cuda = _call(nvml, "nvmlSystemGetCudaDriverVersion")
    if cuda is not _NA:
        facts.set("gpu.cuda_driver_version", _cuda_version(cuda), SOURCE)
    handles, devices = [], []
    for i in range(count):
        handle = _call(nvml, "nvmlDeviceGetHandleByIndex", i)
        if handle is _NA:  # e.g. GpuIsLost: keep the index so the numbering stays physical
            devices.append({"index": i, "error": "NVML could not open this GPU (fallen off the bus?)"})
            continue
        handles.append(handle)
        devices.append(_device(nvml, i, handle))
    facts.set("gpu.physical_count", count, SOURCE)
    facts.set("gpu.devices", devices, SOURCE)
    if len(handles) > 1:
        facts.set("gpu.p2p", _p2p(nvml, handles), SOURCE)
        facts.set("gpu.topology", _topology(nvml, handles), SOURCE)
    visible = map_visible_devices(env.get("CUDA_VISIBLE_DEVICES"), devices, env.get("CUDA_DEVICE_ORDER"))
    facts.set("gpu.visible", visible, SOURCE)
    # gpu.count is what CUDA (and so vLLM) can use: the visible devices when CUDA_VISIBLE_DEVICES is set.
    facts.set("gpu.count", visible["count"], SOURCE)
    return None
