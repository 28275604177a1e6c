"""max-model-len-too-large: --max-model-len = the model's derived maximum (the message's figure first)."""
from __future__ import annotations

from vllm_doctor.command.edits import SetEnv, SetFlag
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.numbers import as_float
from vllm_doctor.remedies.context import RemedyContext
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math.sizing import parse_len

from .common import MML


def fix_max_model_len(ctx: RemedyContext) -> Fix | None:
    """max-model-len-too-large: --max-model-len = the derived maximum from the message."""
    derived = ctx.capture_float("derived") or ctx.shape.derived_max_len
    if not derived:
        return None
    derived_i = int(derived)
    tokenizer_max = as_float(ctx.capture("model_max_length"))      # "None" when the tokenizer sets none
    if tokenizer_max and 0 < tokenizer_max < derived_i:
        derived_i = int(tokenizer_max)
    user = ctx.capture_float("max_model_len") or parse_len(ctx.arg("max_model_len"))
    key = ctx.capture("key") or "max_position_embeddings"
    arith = [f"requested {mm.fmt_tokens(int(user)) if user else '?'} > {key} = {mm.fmt_tokens(derived_i)} "
             f"in config.json -> --max-model-len {derived_i}"]
    alts = [Alternative("Only if the model really handles longer inputs (rope scaling you applied yourself): "
                        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", [SetEnv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")],
                        "NaNs or CUDA out-of-bounds errors past the trained positions")]
    return Fix(f"Set --max-model-len {derived_i} (the model's maximum, {key})", [SetFlag(MML, str(derived_i))],
               alts, arith, {"max_model_len": user, "derived_max_model_len": derived_i, "key": key})
