"""A bare `KeyError: 'x'` is transformers-too-old only when transformers' CONFIG_MAPPING raised it."""
from __future__ import annotations

from vllm_doctor.findings import RefineContext


def classify(ctx: RefineContext) -> str | None:
    """A bare `KeyError: 'x'` is transformers-too-old only when CONFIG_MAPPING raised it."""
    if ctx.match.pattern.name != "keyerror":
        return None
    frames = ctx.traceback.frames if ctx.traceback is not None else []
    if any("configuration_auto" in f.file or "CONFIG_MAPPING" in (f.code or "") for f in frames):
        return None
    return "not-a-config-keyerror"   # not a rule id: the engine drops the match
