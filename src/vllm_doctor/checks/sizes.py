"""The parallel sizes of a launch, refused by `check` before any check runs when no machine could run them."""
from __future__ import annotations

from vllm_doctor.facts import Facts
from vllm_doctor.numbers import parse_int
from vllm_doctor.vllm_math import parallel as pm

SIZE_FLAGS = (("--tensor-parallel-size", "args.tensor_parallel_size"),
              ("--pipeline-parallel-size", "args.pipeline_parallel_size"),
              ("--data-parallel-size", "args.data_parallel_size"))


def size_error(facts: Facts) -> str | None:
    """The one line that refuses a tp, pp or dp no machine could run: `-tp 0`, `-tp -1` (vLLM takes either
    and fails later, far from the flag), `-tp 100000000` (more GPUs than any cluster holds), or a world size
    tp x pp x dp beyond one. None: the sizes are real. A value that is no whole number at all is the
    arguments check's to report (argparse's `invalid int value`)."""
    world = 1
    for flag, key in SIZE_FLAGS:
        raw = facts.get(key)
        text = "" if raw is None or isinstance(raw, (bool, float)) else str(raw).strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()):
            continue
        n = parse_int(text)
        if n is None:
            shown = text if len(text) <= 40 else text[:40] + "…"
            return f"{flag} {shown} is not a real size: more digits than any GPU count has"
        if not pm.real_size(n):
            return pm.not_a_real_size(flag, n)
        world *= n
    return None if pm.real_size(world) else pm.not_a_real_size("the world size tp x pp x dp =", world)
