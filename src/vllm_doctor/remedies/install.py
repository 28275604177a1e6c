"""Remedy for a broken vLLM installation: the environment is repaired, the command stays as it is."""
from __future__ import annotations

from vllm_doctor.findings import Fix
from vllm_doctor.remedies.context import RemedyContext


def fix_install(ctx: RemedyContext) -> Fix:
    version = ctx.version or ""
    pin = f"vllm=={version}" if version and version[0].isdigit() and "dev" not in version else "vllm"
    arch = (ctx.capture("archs") or ctx.capture("arch") or "").strip("[]'")
    module = ctx.capture("module")
    supported = f" {arch} is supported; vLLM itself did not import." if arch else ""
    if module and not module.startswith("vllm"):
        summary = f"Install {module} into the environment vLLM runs in (pip install {module}), then rerun.{supported}"
    elif ctx.has_pattern("extension-symbol") or ctx.capture("symbol"):
        summary = (f"Reinstall vLLM with the torch it was built for: in a fresh virtualenv `pip install {pin}` (it "
                   "pins its torch; a later `pip install torch` breaks vllm/_C*.so with `undefined symbol`), or use "
                   f"the vllm/vllm-openai image.{supported}")
    elif module:
        summary = ("vLLM's compiled extension is missing: run from outside a source checkout, or build it "
                   f"(`pip install -e .` in the checkout), or install the wheel (`pip install {pin}`).{supported}")
    else:
        summary = (f"Repair the installation: the import error printed above the failure names what is broken; "
                   f"a fresh virtualenv with `pip install {pin}` (or the vllm/vllm-openai image) fixes a vLLM "
                   f"that does not match its torch/CUDA.{supported}")
    return Fix(summary, [], facts_used={"vllm.version": version or "unknown"})
