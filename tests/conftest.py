from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The compiled rule catalog is cached per user (rules/catalog.py); tests keep theirs out of ~/.cache.
os.environ.setdefault("VLLM_DOCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="vllm-doctor-test-cache-"))
CORPUS_DEV = ROOT / "tests" / "data" / "corpus-dev"   # copies of the team's real vLLM 0.32 logs
REFERENCE = ROOT / "docs" / "reference"               # copies of the team's reference notes


@pytest.fixture(scope="session")
def catalog():
    from vllm_doctor.rules.catalog import load_catalog

    return load_catalog(ROOT / "rules")


def run_cli(*args, input=None, env=None, timeout=60):
    """Run the installed CLI the way a user does (a fresh interpreter), return CompletedProcess."""
    full_env = dict(os.environ, NO_COLOR="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "vllm_doctor", *args], input=input, capture_output=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


class Ran:
    """What run_main returns, like run_cli's CompletedProcess: the exit code and the two streams' bytes."""

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_main(*args) -> Ran:
    """The CLI's own main() with the arguments a user gives, in this interpreter and from the checkout (as
    run_cli): the same report as `python -m vllm_doctor`, without a process start per call, which was most of
    the time of the families that diagnose many files. The process boundary itself (exit codes, streams,
    signals) is what tests/test_cli*.py and the pipe tests check with run_cli. NO_COLOR as run_cli sets it."""
    import contextlib
    import io

    from vllm_doctor.cli.main import main

    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = os.environ.get("NO_COLOR")
    os.environ["NO_COLOR"] = "1"
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
            out.flush()
            err.flush()
    finally:
        if saved is None:
            os.environ.pop("NO_COLOR", None)
        else:
            os.environ["NO_COLOR"] = saved
    return Ran(code, out.buffer.getvalue(), err.buffer.getvalue())


# --------------------------------------------------------------------------- the fake_nvml fixture
# A fake pynvml module reproducing real machines (names, constants and exception classes as in
# nvidia-ml-py, so the code under test runs unchanged against the real module).

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_P2P_CAPS_INDEX_READ = (0,)  # sic: nvidia-ml-py defines it with a trailing comma
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
MIB = 1024 * 1024


class NVMLError(Exception):
    """Like pynvml: NVMLError(value) returns the subclass registered for that value."""
    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value):
        super().__init__(value)

    def __str__(self):
        return f"NVML error {self.value}"


def _subclass(name: str, value: int) -> type:
    cls = type(name, (NVMLError,), {})
    NVMLError._valClassMapping[value] = cls
    return cls


NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_LibRmVersionMismatch = _subclass("NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH)


@dataclass
class Gpu:
    name: str
    memory_mib: int
    cc: tuple[int, int]
    used_mib: int = 0
    mig: list[dict] | None = None          # None: MIG not supported; []: supported but disabled
    processes: list[tuple[int, str | None, int]] = field(default_factory=list)  # (pid, name or None=vanished, MiB)


@dataclass
class Machine:
    gpus: list[Gpu]
    p2p: dict[int, int | None]              # caps index -> status for every pair (None: NotSupported)
    topology: callable                      # (i, j) -> NVML_TOPOLOGY_*
    driver: str = "550.54.15"
    cuda: int = 12040
    init_error: int | None = None


class FakeNVML(SimpleNamespace):
    """The pynvml surface the facts code uses, answering for one Machine."""

    def __init__(self, machine: Machine):
        consts = {k: v for k, v in globals().items() if k.startswith(("NVML_", "NVMLError"))}
        super().__init__(**consts)
        self.machine = machine
        self.calls: list[str] = []

    def _gpu(self, handle):
        return self.machine.gpus[handle]

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.machine.init_error is not None:
            raise NVMLError(self.machine.init_error)

    def nvmlShutdown(self):
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self):
        return self.machine.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.machine.cuda

    def nvmlDeviceGetCount(self):
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        if isinstance(handle, tuple):
            return handle[2]["name"]
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle):
        if isinstance(handle, tuple):
            return handle[2]["uuid"]
        return f"GPU-{handle:08x}-1111-2222-3333-{abs(hash(self._gpu(handle).name)) % 10**12:012d}"

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * handle:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, handle):
        if isinstance(handle, tuple):
            total = handle[2]["memory_mib"] * MIB
            return SimpleNamespace(total=total, used=0, free=total)
        gpu = self._gpu(handle)
        return SimpleNamespace(total=gpu.memory_mib * MIB, used=gpu.used_mib * MIB,
                               free=(gpu.memory_mib - gpu.used_mib) * MIB)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._gpu(handle).cc

    def nvmlDeviceGetMigMode(self, handle):
        mig = self._gpu(handle).mig
        if mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        mig = self._gpu(handle).mig or []
        if index >= len(mig) or mig[index] is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return ("mig", handle, mig[index])

    def nvmlDeviceGetGpuInstanceId(self, handle):
        return handle[2]["gi"]

    def nvmlDeviceGetComputeInstanceId(self, handle):
        return handle[2]["ci"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB) for pid, _, mib in self._gpu(handle).processes]

    def nvmlSystemGetProcessName(self, pid):
        for gpu in self.machine.gpus:
            for p, name, _ in gpu.processes:
                if p == pid and name is not None:
                    return name.encode()
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # the process exited meanwhile

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        if not isinstance(cap, int):  # what ctypes does with the real module's tuple constant
            raise ctypes.ArgumentError("argument 3: TypeError: wrong type")
        status = self.machine.p2p.get(cap)
        if status is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return status

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.machine.topology(a, b)


def h100_sxm_x8() -> FakeNVML:
    """DGX H100: NVLink between all pairs; two PCIe roots per NUMA node."""
    return FakeNVML(Machine(
        gpus=[Gpu("NVIDIA H100 80GB HBM3", 81559, (9, 0), used_mib=1) for _ in range(8)],
        p2p={0: NVML_P2P_STATUS_OK, NVML_P2P_CAPS_INDEX_WRITE: NVML_P2P_STATUS_OK,
             NVML_P2P_CAPS_INDEX_NVLINK: NVML_P2P_STATUS_OK},
        topology=lambda a, b: NVML_TOPOLOGY_NODE if a // 4 == b // 4 else NVML_TOPOLOGY_SYSTEM))


def h100_sxm_x4() -> FakeNVML:
    """Half a DGX H100 (a cloud node of 4 H100 SXM): NVLink between all pairs."""
    return FakeNVML(Machine(
        gpus=[Gpu("NVIDIA H100 80GB HBM3", 81559, (9, 0), used_mib=1) for _ in range(4)],
        p2p={0: NVML_P2P_STATUS_OK, NVML_P2P_CAPS_INDEX_WRITE: NVML_P2P_STATUS_OK,
             NVML_P2P_CAPS_INDEX_NVLINK: NVML_P2P_STATUS_OK},
        topology=lambda a, b: NVML_TOPOLOGY_NODE))


def a100_pcie_x3() -> FakeNVML:
    """Three A100-PCIE-40GB across CPU sockets: no P2P at all."""
    return FakeNVML(Machine(
        gpus=[Gpu("NVIDIA A100-PCIE-40GB", 40960, (8, 0), used_mib=4, mig=[]) for _ in range(3)],
        p2p={0: NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
             NVML_P2P_CAPS_INDEX_WRITE: NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
             NVML_P2P_CAPS_INDEX_NVLINK: NVML_P2P_STATUS_NOT_SUPPORTED},
        topology=lambda a, b: NVML_TOPOLOGY_HOSTBRIDGE if {a, b} == {0, 1} else NVML_TOPOLOGY_SYSTEM,
        driver="535.104.05", cuda=12020))


def rtx4090_x2() -> FakeNVML:
    """Two GeForce RTX 4090: P2P disabled by the driver, NVLink query unsupported, one busy process."""
    return FakeNVML(Machine(
        gpus=[Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9), used_mib=20312,
                  processes=[(4242, "python3", 20000), (5151, None, 300)]),
              Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9))],
        p2p={0: NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
             NVML_P2P_CAPS_INDEX_WRITE: NVML_P2P_STATUS_GPU_NOT_SUPPORTED, NVML_P2P_CAPS_INDEX_NVLINK: None},
        topology=lambda a, b: NVML_TOPOLOGY_HOSTBRIDGE, driver="550.120", cuda=12040))


MIG_3G = {"uuid": "MIG-6a7e3b2c-1d4f-5a6b-8c9d-0e1f2a3b4c5d", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
          "memory_mib": 40192, "gi": 1, "ci": 0}
MIG_2G = {"uuid": "MIG-7b8f4c3d-2e5a-6b7c-9d0e-1f2a3b4c5d6e", "name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
          "memory_mib": 19968, "gi": 3, "ci": 0}


def a100_mig() -> FakeNVML:
    """One A100-SXM4-80GB in MIG mode with a 3g.40gb and a 2g.20gb instance (slot 1 empty)."""
    return FakeNVML(Machine(
        gpus=[Gpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0), mig=[MIG_3G, None, MIG_2G])],
        p2p={}, topology=lambda a, b: NVML_TOPOLOGY_INTERNAL, driver="535.129.03", cuda=12020))


def no_driver() -> FakeNVML:
    return FakeNVML(Machine(gpus=[], p2p={}, topology=lambda a, b: 0, init_error=NVML_ERROR_DRIVER_NOT_LOADED))


def version_mismatch() -> FakeNVML:
    return FakeNVML(Machine(gpus=[], p2p={}, topology=lambda a, b: 0,
                            init_error=NVML_ERROR_LIB_RM_VERSION_MISMATCH))


FAKE_NVML = SimpleNamespace(
    **{name: value for name, value in globals().items() if name.startswith(("NVML_", "NVMLError"))},
    MIB=MIB, Gpu=Gpu, Machine=Machine, FakeNVML=FakeNVML, MIG_3G=MIG_3G, MIG_2G=MIG_2G,
    h100_sxm_x8=h100_sxm_x8, h100_sxm_x4=h100_sxm_x4, a100_pcie_x3=a100_pcie_x3, rtx4090_x2=rtx4090_x2, a100_mig=a100_mig,
    no_driver=no_driver, version_mismatch=version_mismatch)


@pytest.fixture(scope="session")
def fake_nvml():
    """The fake pynvml: ``fake_nvml.h100_sxm_x8()`` (a100_pcie_x3, rtx4090_x2, a100_mig, no_driver,
    version_mismatch) returns a fresh FakeNVML to pass where the real module goes; the NVML_* constants,
    NVMLError* classes and MIG_3G/MIG_2G instances are attributes too."""
    return FAKE_NVML


# --------------------------------------------------------------------------- `check` on fake machines
# (not named `snapshot`: that is the TUI snapshot tests' fixture, from pytest-textual-snapshot)

@pytest.fixture
def machine_snapshot(tmp_path, fake_nvml):
    """machine_snapshot(machine, extra=None): the path of a facts snapshot of that fake machine (plus extra facts)."""
    def make(machine: str, extra: dict | None = None) -> str:
        from vllm_doctor.facts import Facts
        from vllm_doctor.facts.nvml import collect_gpu_facts
        from vllm_doctor.facts.snapshot import save_snapshot

        facts = Facts()
        collect_gpu_facts(facts, getattr(fake_nvml, machine)(), environ={})
        for key, value in (extra or {}).items():
            facts.set(key, value, "snapshot")
        path = tmp_path / f"{machine}.json"
        path.write_text(json.dumps(save_snapshot(facts)))
        return str(path)
    return make


@pytest.fixture
def check(catalog, machine_snapshot):
    """check(machine, cmd, extra=None, **kw): what `vllm-doctor check` predicts for cmd on that fake machine."""
    def run(machine, cmd, extra=None, **kw):
        from vllm_doctor.checks.preflight import predict

        kw.setdefault("port_probe", None)
        return predict(cmd, catalog, snapshot=machine_snapshot(machine, extra), live=False, **kw)
    return run


# --------------------------------------------------------------------------- cluster snapshots (facts --ray)

@pytest.fixture
def cluster_snapshot(tmp_path, fake_nvml):
    """cluster_snapshot(nodes) -> path of a cluster snapshot in the shape `facts --ray` writes. Each node is a
    dict: machine (a fake_nvml machine name, or None for a CPU-only node), ip, driver, vars, interfaces,
    versions, shm_gib, model (model id or path probed) and model_present, state/why (unreachable, dead)."""
    def make(nodes: list[dict]) -> str:
        from vllm_doctor.facts import Facts
        from vllm_doctor.facts.cluster import cluster_document
        from vllm_doctor.facts.nvml import collect_gpu_facts
        from vllm_doctor.facts.snapshot import save_snapshot

        entries = []
        for i, node in enumerate(nodes):
            facts = Facts()
            gpus = 0
            if node.get("machine"):
                machine = getattr(fake_nvml, node["machine"])()
                collect_gpu_facts(facts, machine, environ={})
                gpus = len(machine.machine.gpus)
            ip = node.get("ip", f"10.0.0.{i + 1}")
            facts.set("env.vars", node.get("vars", {}), "env")
            facts.set("env.versions", node.get("versions", {"vllm": "0.32.0", "torch": "2.10.0", "ray": "2.60.0"}), "env")
            facts.set("env.shm_total_bytes", int(node.get("shm_gib", 64) * 2**30), "env")
            facts.set("net.hostname", node.get("hostname", f"node-{i}"), "env")
            facts.set("net.interfaces", node.get("interfaces", {"lo": "127.0.0.1", "eth0": ip}), "env")
            if "model" in node:
                facts.set("node.model_present", {"model": node["model"], "present": node.get("model_present", True),
                                                 "where": node["model"]}, "env")
            state = node.get("state", "ok")
            entries.append({"node_id": f"{i:02d}" + "ab" * 27, "ip": ip, "driver": node.get("driver", i == 0),
                            "resources": {"CPU": 32.0, "GPU": float(node.get("ray_gpus", gpus))},
                            "state": state, "why": node.get("why", ""),
                            "snapshot": save_snapshot(facts) if state == "ok" else None})
        path = tmp_path / "cluster.json"
        path.write_text(json.dumps(cluster_document("10.0.0.1:6379", 30.0, entries)))
        return str(path)
    return make
