"""Facts about this machine's environment: /dev/shm, containers, relevant variables, package versions.
Versions come from importlib.metadata only: importing vllm or torch would take seconds and touch the GPU."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from . import Facts

SOURCE = "env"
VAR_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE",
             "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GLOO_SOCKET_IFNAME", "NVIDIA_VISIBLE_DEVICES",
             "TRANSFORMERS_OFFLINE", "VLLM_USE_MODELSCOPE")
VAR_PREFIXES = ("NCCL_", "GLOO_", "VLLM_")
# Never store these values, only that they are set (the key names are not secret, the values are).
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY", "CREDENTIAL")
SECRET_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
REDACTED = "<set, redacted>"
PACKAGES = ("vllm", "torch", "transformers", "nvidia-nccl-cu11", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
            "ray", "triton", "flashinfer-python", "xformers", "nvidia-ml-py")
CONTAINER_MARKERS = (("/.dockerenv", "docker"), ("/run/.containerenv", "podman"))
CGROUP_WORDS = (("docker", "docker"), ("kubepods", "kubernetes"), ("containerd", "containerd"),
                ("libpod", "podman"), ("lxc", "lxc"))


def is_secret(name: str) -> bool:
    return name in SECRET_NAMES or any(word in name.upper() for word in SECRET_WORDS)


def env_vars(environ: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, value in environ.items():
        if name in SECRET_NAMES:
            out[name] = REDACTED
        elif name in VAR_NAMES or name.startswith(VAR_PREFIXES):
            out[name] = REDACTED if is_secret(name) else value
    return dict(sorted(out.items()))


def shm_bytes(path: str = "/dev/shm") -> tuple[int, int] | None:
    """(total, free) bytes of the shared-memory mount NCCL's SHM transport uses (Docker's default: 64 MiB)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def container_kind(environ: Mapping[str, str], root: Path = Path("/")) -> str | None:
    """docker / podman / kubernetes / containerd / lxc, or None when no sign of a container."""
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    for marker, kind in CONTAINER_MARKERS:
        if (root / marker.lstrip("/")).exists():
            return kind
    try:
        cgroup = (root / "proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return None
    for word, kind in CGROUP_WORDS:
        if word in cgroup:
            return kind
    return None


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    from importlib import metadata  # slow to import (~100 ms); only when versions are asked for

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def collect_env_facts(facts: Facts, environ: Mapping[str, str] | None = None, *, root: Path = Path("/")) -> None:
    """Set env.* facts of this machine (source "env"). `root` lets tests point at a fake file system."""
    env = os.environ if environ is None else environ
    shm = shm_bytes(str(root / "dev/shm"))
    if shm is not None:
        facts.set("env.shm_total_bytes", shm[0], SOURCE)
        facts.set("env.shm_free_bytes", shm[1], SOURCE)
    kind = container_kind(env, root)
    facts.set("env.in_container", kind is not None, SOURCE)
    facts.set("env.container_kind", kind, SOURCE)
    facts.set("env.vars", env_vars(env), SOURCE)
    versions = package_versions()
    facts.set("env.versions", versions, SOURCE)
    if "vllm" in versions:
        facts.set("vllm.version", versions["vllm"], SOURCE)
