"""PyTorch's range warning: does this GPU really lack kernels in the installed build?

torch/cuda/__init__.py checks the GPU as CUDA starts. `_check_cubins` (`X with CUDA capability sm_NN is not
compatible with the current PyTorch installation`, pattern `torch-arch`) asks whether the build has a kernel of the
GPU's major version. Its 2.11+ `_check_capability` (`... of compute capability (CC) M.m.`, `torch-arch-cc-new`) warns
only where no built capability runs on the GPU (its DEVICE_REQUIREMENT table). But 2.8-2.10's range check
(`Found GPU0 X which is of cuda capability M.m.`, then `Minimum and Maximum cuda capability supported by this version
of PyTorch is` and `(8.0) - (12.0)` on the lines after it, pattern `torch-arch-cc`) warns for every GPU outside the
range, including GPUs that run the build's kernels: a cubin for sm_XY runs on every sm_XZ with Z >= Y (CUDA's binary
compatibility within a major version). So a GB10 (12.1) runs a (8.0)-(12.0) build's sm_120 kernels -- the warning is
cosmetic there (GB10 servers served with it) -- while a GPU below the range (a V100 under 7.5) or of a major the range
ends below (an RTX 5090 at 12.0 under (5.0)-(9.0)) has no kernel to run.
"""
from __future__ import annotations

from vllm_doctor.findings import RefineContext
from vllm_doctor.numbers import as_int


def _cc(text) -> tuple[int, int] | None:
    major, _, minor = str(text or "").strip().partition(".")
    major, minor = as_int(major), as_int(minor)
    return (major, minor) if major is not None and minor is not None else None


def classify(ctx: RefineContext) -> str | None:
    """The range warning of a GPU that runs a kernel at the range's ends (same major, lower or equal minor) is no
    cause: the match is dropped, its reason kept for an unrecognized failure."""
    match = ctx.match
    if match.pattern.name != "torch-arch-cc":
        return None
    major, minor = as_int(match.captures.get("cc_major")), as_int(match.captures.get("cc_minor"))
    if major is None or minor is None:
        return None
    ends = [cc for key in ("log.torch_cc_min", "log.torch_cc_max") if (cc := _cc(ctx.facts.get(key)))]
    runs = [cc for cc in ends if cc[0] == major and cc[1] <= minor]
    if not runs:
        return None
    kernel = max(runs)
    match.unsupported = (f"PyTorch's warning that {match.captures.get('gpu_name') or 'the GPU'} (compute capability "
                         f"{major}.{minor}) is outside its build's range is not the cause: the build has "
                         f"sm_{kernel[0]}{kernel[1]} kernels, which run on every {major}.x GPU from {kernel[0]}.{kernel[1]} "
                         "up (CUDA's binary compatibility within a major version).")
    return "cosmetic-capability-warning"     # not a rule id: the engine drops the match
