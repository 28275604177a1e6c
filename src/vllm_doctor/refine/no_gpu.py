"""No usable GPU, as the no-gpu rule reads it, unless the log shows why vLLM did not look.

vLLM's CUDA and CPU platform plugins ask importlib for the version of the distribution named "vllm"
(platforms/__init__.py vllm_version_matches_substr, 0.8+); where there is none (a fork installed under another name:
vllm-pascal; a source tree on PYTHONPATH; a copied site-packages without its .dist-info) it warns `The vLLM package
was not found, so its version could not be inspected. This may cause platform detection to fail.` and raises, the
CUDA plugin's check fails on it, and vLLM runs on UnspecifiedPlatform however many GPUs work (sasha0552/pascal-pkgs-ci
#35: a P40 under vllm-pascal). The symptoms of no platform (`No platform detected`, `Failed to infer device type`, an
empty device string) are then the installation's. `No CUDA GPUs are available` is torch's own count and stays,
except in a Ray actor vLLM did not start (refine/ray_actor.py).
"""
from __future__ import annotations

from vllm_doctor.facts.keys import LOG_VLLM_UNNAMED
from vllm_doctor.findings import RefineContext
from vllm_doctor.refine import ray_actor

NO_PLATFORM = ("unspecified-platform", "cuda-platform-unavailable", "infer-device-type", "empty-device-string")


def classify(ctx: RefineContext) -> str | None:
    if ctx.match.pattern.name in NO_PLATFORM and ctx.facts.get(LOG_VLLM_UNNAMED):
        return "install-broken"
    return "cuda-visible-devices" if ray_actor.in_foreign_actor(ctx) else None      # the variable Ray emptied
