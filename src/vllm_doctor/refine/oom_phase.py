"""Which OOM rule a CUDA out-of-memory match is: one while loading weights (cuda-oom-load), one at run time
(cuda-oom-runtime, the rule's own), or a CUDA_VISIBLE_DEVICES set too late (cuda-visible-devices).
The phase found is recorded as a fact for the remedy."""
from __future__ import annotations

from vllm_doctor.events.phases import PHASE_FACT, classify_frames, classify_milestones
from vllm_doctor.findings import RefineContext


def classify(ctx: RefineContext) -> str | None:
    """Refine hook for the generic PyTorch OOM patterns: relabel to cuda-oom-load when it hit while loading.

    Traceback frames decide first (load_model/load_weights/model_loader/get_model/initialize_model vs.
    profile_run/_dummy_run/_dummy_sampler_run/capture_model/_allocate_kv_cache/initialize_kv_cache);
    without them the milestones do: weights_loading printed but not weights_loaded -> load.
    """
    relabel = classify_oom_visible_devices(ctx)   # an OOM on GPU 0 that CUDA_VISIBLE_DEVICES set too late
    if relabel:
        return relabel
    phase = "sampler" if ctx.match.pattern.name == "sampler-warmup" else None
    frames = ctx.traceback.frames if ctx.traceback is not None else []
    if phase is None and frames:
        phase = classify_frames([f.func or "" for f in frames], [f.file or "" for f in frames])
    if phase is None:
        ms = set(ctx.milestones)
        phase = "load" if "weights_loading" in ms and "weights_loaded" not in ms else classify_milestones(ms)
    if phase is None:
        # nothing before the OOM places it, but other workers went on printing: still loading, never loaded
        after = set(ctx.log_milestones)
        if "weights_loading" in after and "weights_loaded" not in after:
            phase = "load"
    if phase:
        ctx.facts.set(PHASE_FACT, phase, "log", override=True)
    return "cuda-oom-load" if phase == "load" else None


def classify_oom_visible_devices(ctx: RefineContext) -> str | None:
    """For the OOM rules' refine hook: an OOM on GPU 0 next to another process, in a run whose script set
    CUDA_VISIBLE_DEVICES in Python (log fact `log.cvd_set_in_code`) to GPUs other than 0, is really a
    CUDA_VISIBLE_DEVICES set too late (after CUDA was initialised), not a model that does not fit."""
    in_code = ctx.facts.get("log.cvd_set_in_code")
    if in_code is None or ctx.match.captures.get("gpu") != "0":
        return None
    wanted = [e.strip() for e in str(in_code).split(",") if e.strip()]
    if wanted and "0" not in wanted[:1]:
        return "cuda-visible-devices"
    return None
