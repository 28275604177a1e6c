"""A bare `KeyError: 'x'` is transformers-too-old only when transformers' CONFIG_MAPPING raised it."""
from __future__ import annotations

from vllm_doctor.findings import RefineContext


def classify(ctx: RefineContext) -> str | None:
    """A bare `KeyError: 'x'` is transformers-too-old only when CONFIG_MAPPING raised it."""
    pattern = getattr(getattr(ctx, "match", None), "pattern", None)
    if getattr(pattern, "name", None) != "keyerror":
        return None
    tb = getattr(ctx, "traceback", None)
    frames = list(getattr(tb, "frames", None) or [])
    if any("configuration_auto" in str(getattr(f, "file", "")) or "CONFIG_MAPPING" in str(getattr(f, "code", ""))
           for f in frames):
        return None
    return "not-a-config-keyerror"   # not a rule id: the engine drops the match
