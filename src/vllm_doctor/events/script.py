"""The user's own script in a traceback: the frame where it builds the engine (`llm = LLM(...)`).

A Python API launch has no command line to rewrite; the fix is an edit of that line of that file, which
the traceback names: `File "/app/gen.py", line 4, in <module>` followed by `llm = LLM(model=..., ...)`.
"""
from __future__ import annotations

from typing import Iterable

import regex

from vllm_doctor.events.tracebacks import Frame, Traceback
from vllm_doctor.regex_time import timed

ENGINE_CALL = regex.compile(r"\b(?:vllm\.)?(?:LLM|AsyncEngineArgs|EngineArgs|AsyncLLMEngine\.from_engine_args)\s*\(")
# library code: vLLM itself, installed packages, the interpreter's own modules
LIBRARY = regex.compile(r"[/\\](?:site-packages|dist-packages|lib/python\d[\d.]*)[/\\]|[/\\]vllm[/\\]|^<")


def engine_call_frame(tracebacks: Iterable[Traceback]) -> Frame | None:
    """The outermost user frame whose source line builds the engine, over every traceback (the driver's
    traceback has it; a worker's does not); None when no traceback shows one."""
    for tb in tracebacks:
        for frame in tb.frames:
            if frame.code and _found(ENGINE_CALL, frame.code) and not _found(LIBRARY, frame.file.replace("\\", "/")):
                return frame
    return None


def _found(pattern: regex.Pattern, text: str) -> bool:
    try:
        return timed(pattern, "search", text) is not None
    except TimeoutError:            # a frame too odd to read: not the user's engine call
        return False


def publish_script(tracebacks: Iterable[Traceback], facts) -> None:
    """The user's script line that built the engine, as facts, for a fix written as its edit."""
    frame = engine_call_frame(tracebacks)
    if frame is not None:
        facts.set("launch.script", f"{frame.file.rsplit('/', 1)[-1]} line {frame.lineno}", "log")
        facts.set("launch.script_code", frame.code, "log")
