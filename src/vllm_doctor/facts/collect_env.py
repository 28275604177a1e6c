"""Parse the output of `vllm collect-env` / `python collect_env.py` (what users paste into bug reports).

Two layouts exist: the older PyTorch-style `Key: value` lines (≤ 0.8) and the bannered one
(`=====` / `System Info` / `=====`, then `Key   : value`), both ending with the raw
`nvidia-smi topo -m` matrix. Values become fact keys of docs/DESIGN.md.
"""
from __future__ import annotations

import re
from typing import Any

from vllm_doctor.numbers import parse_int

from .env import env_vars

BANNER = re.compile(r"^=+\s*$")
KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z0-9 _./()-]*?)\s*:\s?(.*)$")
GPU_LINE = re.compile(r"^\s*GPU (\d+): (.+?)\s*(?:\(UUID: [^)]*\))?\s*$")
PIP_LINE = re.compile(r"^\[(?:pip3?|conda)\]\s+([A-Za-z0-9_.-]+)(?:==|\s+)([0-9][^\s]*)")
ENV_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)=(.*)$")
TOPO_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
# A vLLM/NCCL log line or a shell prompt ends a block pasted inside a log.
LOG_LINE = re.compile(r"^(?:\(\w[\w ]*pid=\d+[^)]*\)\s*)?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d |"
                      r"^\$ |^Traceback |^(?:\[[\d\- :.,]+\] )?\S+:\d+:\d+ \[\d+\] ")
PACKAGE_VERSIONS = {"PyTorch version": "torch", "vLLM Version": "vllm"}
INVALID = {"", "N/A", "Could not collect", "None", "No CUDA"}


def _clean(value: str) -> str | None:
    value = value.strip()
    return None if value in INVALID else value


def _topology(lines: list[str], start: int) -> list[list[str]] | None:
    """The GPU×GPU part of the `nvidia-smi topo -m` matrix that starts after lines[start]."""
    header = None
    rows: dict[int, list[str]] = {}
    for line in lines[start:start + 80]:
        cells = line.split()
        if not cells:
            if rows:
                break
            continue
        if header is None and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            header = [c for c in cells if re.fullmatch(r"GPU\d+", c)]
            continue
        if cells[0] == "Legend:" or BANNER.match(line):
            break
        if header and re.fullmatch(r"GPU\d+", cells[0]):
            row = [c for c in cells[1:1 + len(header)]]
            index = parse_int(cells[0][3:])
            if index is not None and all(TOPO_CELL.match(c) for c in row):
                rows[index] = row
    if not header or len(rows) != len(header):
        return None
    return [rows[i] for i in sorted(rows)]


def _p2p_from_topology(matrix: list[list[str]]) -> dict[str, list[list[str]]]:
    """NV# cells mean an NVLink path; other levels say nothing certain about PCIe P2P ("?")."""
    return {"nvlink": [["X" if c == "X" else "OK" if c.startswith("NV") else "NS" for c in row]
                       for row in matrix]}


def _gpu(line: str) -> dict | None:
    """`GPU 0: NVIDIA A100-SXM4-80GB` -> {index, name}; None for any other line (or an index no GPU has)."""
    m = GPU_LINE.match(line)
    index = parse_int(m.group(1)) if m else None
    return None if index is None else {"index": index, "name": m.group(2)}


def parse_collect_env(text: str) -> dict[str, Any]:
    """collect_env output -> {fact key: value} (only the facts found)."""
    lines = text.replace("\r", "").split("\n")
    out: dict[str, Any] = {}
    versions: dict[str, str] = {}
    devices: list[dict] = []
    env: dict[str, str] = {}
    in_gpus = in_env = False
    for pos, line in enumerate(lines):
        stripped = line.strip()
        if BANNER.match(stripped):
            in_gpus = False
            continue
        if stripped == "Environment Variables":
            in_env = True
            continue
        gpu = _gpu(line)
        if gpu and (in_gpus or not devices):
            devices.append(gpu)
            in_gpus = True
            continue
        if in_env and (m := ENV_LINE.match(stripped)):
            env[m.group(1)] = m.group(2)
            continue
        if pip := PIP_LINE.match(stripped):
            versions.setdefault(pip.group(1).lower(), pip.group(2))
            continue
        if stripped.startswith("GPU Topology:") or stripped.startswith("NVIDIA Topology:"):
            matrix = _topology(lines, pos + 1)
            if matrix:
                out["gpu.topology"] = matrix
                out["gpu.p2p"] = _p2p_from_topology(matrix)
            continue
        kv = KEY_VALUE.match(stripped)
        if not kv:
            continue
        key, value = kv.group(1).strip(), kv.group(2)
        if key == "GPU models and configuration":
            in_gpus = True
            gpu = _gpu(value)
            if gpu:
                devices.append(gpu)
            continue
        in_gpus = False
        value = _clean(value)
        if value is None:
            continue
        if key in PACKAGE_VERSIONS:
            versions[PACKAGE_VERSIONS[key]] = value.split(" ")[0]
        elif key == "Nvidia driver version":
            out["gpu.driver_version"] = value
        elif key == "CUDA runtime version":
            out["env.cuda_runtime_version"] = value
        elif key == "CUDA used to build PyTorch":
            out["env.torch_cuda_version"] = value
        elif key == "OS":
            out["env.os"] = value
        elif key == "Is CUDA available":
            out["env.cuda_available"] = value in ("True", "Yes")
    if devices:
        out["gpu.devices"] = devices
        out["gpu.count"] = len(devices)
    if versions:
        out["env.versions"] = versions
        if "vllm" in versions:
            out["vllm.version"] = versions["vllm"]
        nccl = next((v for k, v in versions.items() if k.startswith("nvidia-nccl-cu")), None)
        if nccl:
            out["env.nccl_version"] = nccl
    if env:
        out["env.vars"] = env_vars(env)
    return out


def looks_like_collect_env(text: str) -> bool:
    return "PyTorch version" in text and ("vLLM Version" in text or "GPU models and configuration" in text)


def _block_start(lines: list[str]) -> int | None:
    for test in (lambda l: "Collecting environment information" in l,
                 lambda l: l.strip() == "System Info",  # bannered layout: start at its banner
                 lambda l: l.lstrip().startswith("PyTorch version")):
        for i, line in enumerate(lines):
            if test(line):
                return i - 1 if i > 0 and BANNER.match(lines[i - 1].strip()) else i
    return None


def find_collect_env_block(lines: list[str]) -> str | None:
    """The collect_env output pasted inside a log (from its first line to the next log line), or None."""
    start = _block_start(lines)
    if start is None:
        return None
    end = start + 1
    while end < len(lines) and end - start < 1000 and not LOG_LINE.match(lines[end]):
        end += 1
    block = "\n".join(line.rstrip("\r\n") for line in lines[start:end])
    return block if looks_like_collect_env(block) else None
