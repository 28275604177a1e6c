"""The user's own script in a traceback: the frame where it builds the engine (`llm = LLM(...)`).

A Python API launch has no command line to rewrite; the fix is an edit of that line of that file, which
the traceback names: `File "/app/gen.py", line 4, in <module>` followed by `llm = LLM(model=..., ...)`.
"""
from __future__ import annotations

import re
from typing import Iterable

from vllm_doctor.events.tracebacks import Frame, Traceback

ENGINE_CALL = re.compile(r"\b(?:vllm\.)?(?:LLM|AsyncEngineArgs|EngineArgs|AsyncLLMEngine\.from_engine_args)\s*\(")
# library code: vLLM itself, installed packages, the interpreter's own modules
LIBRARY = re.compile(r"[/\\](?:site-packages|dist-packages|lib/python\d[\d.]*)[/\\]|[/\\]vllm[/\\]|^<")


def engine_call_frame(tracebacks: Iterable[Traceback]) -> Frame | None:
    """The outermost user frame whose source line builds the engine, over every traceback (the driver's
    traceback has it; a worker's does not); None when no traceback shows one."""
    for tb in tracebacks:
        for frame in tb.frames:
            if frame.code and ENGINE_CALL.search(frame.code) and not LIBRARY.search(frame.file.replace("\\", "/")):
                return frame
    return None
