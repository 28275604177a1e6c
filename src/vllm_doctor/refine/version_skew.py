"""A call that does not fit its callee's signature, at the boundary between vLLM and a package built on it, is the
two packages not released for each other: a platform plugin (`vllm_ascend/`, `vllm_gaudi/` … beside `vllm/`) calls
and patches vLLM's internals by one release's signatures (vllm-ascend#4663: vllm-ascend main calling vLLM 0.11.2's
`CudagraphDispatcher.dispatch(num_tokens=…)`), and a framework that starts vLLM (trl, LLaMA-Factory, verl, OpenRLHF)
passes the arguments of the vLLM it was written for (trl#3304: `EngineArgs.__init__() got an unexpected keyword
argument 'worker_extension_cls'`). The same TypeError anywhere else is a bug of the code that raised it, and vLLM
calling into a library beneath it (transformers, torch) is that library's version, not this."""
from __future__ import annotations

import re

from vllm_doctor.findings import RefineContext

# a plugin package's directory: `site-packages/vllm_ascend/…`, `/vllm-workspace/vllm-ascend/vllm_ascend/…`; not vLLM's
# own vendored packages (`vllm/vllm_flash_attn/`)
PLUGIN_DIR = re.compile(r"(?<!/vllm)/(vllm_[a-z][a-z0-9_]{1,30})/")
SITE_PACKAGE = re.compile(r"(?:site|dist)-packages/([A-Za-z_]\w{0,60})/")
VLLM_CHECKOUT = re.compile(r"/vllm/vllm/(?!vllm_)")
# packages whose frames sit above vLLM's without being its caller: process, RPC and web machinery, test runners
NOT_CALLERS = frozenset({"ray", "torch", "uvicorn", "starlette", "fastapi", "anyio", "uvloop", "click", "typer", "fire",
                         "hydra", "IPython", "ipykernel", "debugpy", "_pytest", "pytest", "pluggy", "cloudpickle",
                         "zmq", "multiprocess"})


def package(path: str) -> str | None:
    """The installed package a frame's file belongs to (`vllm`, `vllm_ascend`, `trl`), None for anything else."""
    m = PLUGIN_DIR.search(path)
    if m:
        return m.group(1)
    m = SITE_PACKAGE.search(path)
    if m:
        return m.group(1)
    return "vllm" if VLLM_CHECKOUT.search(path) else None


def counterpart(files: list[str]) -> str | None:
    """The package on the other side of vLLM in these frames (outermost first): a platform plugin anywhere, else the
    package that called into vLLM; None when the frames do not run through vLLM or nothing called it."""
    pkgs = [package(f) for f in files]
    if "vllm" not in pkgs:
        return None
    plugin = next((p for p in pkgs if p and p.startswith("vllm_")), None)
    if plugin:
        return plugin
    outer = [p for p in pkgs[:pkgs.index("vllm")] if p and p not in NOT_CALLERS]
    return outer[-1] if outer else None


def classify(ctx: RefineContext) -> str | None:
    files = [f.file for f in ctx.traceback.frames] if ctx.traceback is not None else []
    if counterpart(files) is None:
        return "not-at-vllms-boundary"      # not a rule id: the engine drops the match
    return None
