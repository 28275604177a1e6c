"""A request's error is not the server's failure.

vLLM's OpenAI server logs a request it cannot serve at ERROR level from the request's handler and answers the
client with an error response (create_error_response: 400 for a prompt longer than --max-model-len, a bad
parameter, an unknown model; 500 for an exception inside the handler); the server goes on serving. The handlers,
by release: `vllm/entrypoints/openai/serving_*.py` (0.4 .. 0.2x; `logger.exception("Error in preprocessing prompt
inputs")`, `ValueError: This model's maximum context length is …`), `…/openai/<endpoint>/serving.py` (0.2x+) and
the exception handlers of `vllm/entrypoints/serve/exception_handling/` (0.3x: vllm_error.py, validation.py).
An exception that leaves the app is caught per request by uvicorn's `run_asgi` (protocols/http/h11_impl.py and
httptools_impl.py, every release: `Exception in ASGI application`, then a 500 to that client); its traceback's
outermost frame is that function. A handler's line that names the engine's death (EngineDeadError,
EngineGenerateError, the engine core), or a traceback through V0's engine loop, is the engine's failure seen by a
request, and stays one.
"""
from __future__ import annotations

import re

from vllm_doctor.events.tracebacks import EXCEPTION, Traceback
from vllm_doctor.sources.lines import Line

HANDLER = re.compile(r"(?:serving_\w{1,40}|serving|vllm_error|validation)\.py:\d{1,6}")
ENGINE_DEATH = ("EngineDeadError", "EngineGenerateError", "EngineCore", "Engine core", "engine core")
# V0's AsyncLLMEngine: frames of its background loop in a request's traceback are the loop's failure reaching the
# request (a step that timed out, the loop already dead), not the request's own
ENGINE_LOOP = ("run_engine_loop", "engine_step", "_raise_exception_on_finish", "start_background_loop")


ASGI_SERVER = re.compile(r"uvicorn/protocols/http/(?:h11|httptools)_impl\.py$")


def request_error(line: Line, exc_type: str | None = None, tb: Traceback | None = None) -> bool:
    """`line` (an ERROR line, or a line of the traceback `tb` that `exc_type` ends) is a request handler's report
    of one request it could not serve, or the ASGI server's of a request whose handler raised."""
    by_handler = bool(line.fileinfo and HANDLER.fullmatch(line.fileinfo))
    by_asgi = (tb is not None and any(f.func == "run_asgi" and ASGI_SERVER.search(f.file) for f in tb.frames[:1])
               and not any(f.func in ENGINE_LOOP for f in tb.frames))
    if not by_handler and not by_asgi:
        return False
    text = f"{line.message} {exc_type or ''}"
    return not any(word in text for word in ENGINE_DEATH)


def request_tracebacks(finished: list[Traceback]) -> set[int]:
    """The ids of the tracebacks that are requests' errors: a handler's (request_error), and an exception the same
    process logged on the way to a handler that then reported it as its own (vLLM's chat_utils.py logs
    `An error occurred in mistral_common while applying chat template` with its traceback, re-raises, and
    serving_chat.py reports the same ValueError and answers 400): the same type and first message line, later."""
    handled = [tb for tb in finished if request_error(tb.start, tb.exc_type, tb)]
    return {id(tb) for tb in handled} | {
        id(tb) for tb in finished if tb.exc_type and any(
            h.start.proc_key == tb.start.proc_key and h.start_seq > tb.start_seq and _said(h) == _said(tb)
            for h in handled)}


def _said(tb: Traceback) -> str:
    return f"{tb.exc_type}: {tb.message.split(chr(10), 1)[0].strip()}"


def request_notice(lines: list[Line]) -> list[str]:
    """The notice for a run whose only errors were requests the server answered with an error."""
    if not lines:
        return []
    # the exception a handler logged says most; a frame line or a bare "Traceback" the least
    first = next((ln for ln in lines if EXCEPTION.match(ln.message.strip())), lines[0])
    return [f"the errors in this log come from the server's request handlers (for one: {first.source or 'line'}:"
            f"{first.lineno}: {first.message.strip()[:100]}): the server answered those requests with an error "
            "and went on serving; no failure of its own"]
