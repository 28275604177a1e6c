"""`health --probe`: one bounded generation request to a running server, only when asked (the report says it was
sent). A streamed `POST /v1/completions` of PROBE_TOKENS tokens at temperature 0: the time to its first text and
to its end say whether the engine serves, beside what /metrics says about everyone else's requests."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable

PROBE_TOKENS = 8
PROBE_TIMEOUT_S = 60.0
PROMPT = "Hello"


@dataclass(frozen=True)
class Probe:
    model: str
    status: int | None = None           # HTTP status; None: no answer (refused, timed out)
    first_s: float | None = None        # seconds to the first chunk with text
    total_s: float | None = None        # seconds to `data: [DONE]`
    chunks: int = 0                     # streamed chunks with text (about one token each)
    error: str = ""                     # why it did not complete

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.total_s is not None and not self.error


def probe(url: str, model: str, api_key: str | None = None, timeout: float = PROBE_TIMEOUT_S,
          clock: Callable[[], float] = time.monotonic) -> Probe:
    import socket
    import urllib.error
    import urllib.request

    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": PROBE_TOKENS, "temperature": 0,
                       "stream": True}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(url.rstrip("/") + "/v1/completions", body, headers, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    start = clock()
    first, chunks = None, 0
    try:
        with opener.open(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return Probe(model, 200, first, clock() - start, chunks)
                if _text(data):
                    chunks += 1
                    first = clock() - start if first is None else first
                if clock() - start > timeout:
                    return Probe(model, 200, first, None, chunks, f"no end in {timeout:g} s")
            return Probe(model, 200, first, None, chunks, "the stream ended without [DONE]")
    except urllib.error.HTTPError as exc:
        return Probe(model, exc.code, error=f"HTTP {exc.code}: {_message(exc.read(300) if exc.fp else b'')}")
    except (socket.timeout, TimeoutError):
        return Probe(model, None, first, None, chunks, f"no answer in {timeout:g} s")
    except (OSError, ValueError) as exc:
        return Probe(model, None, first, None, chunks, str(getattr(exc, "reason", None) or exc))


def _text(data: str) -> bool:
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    return bool(choices) and isinstance(choices[0], dict) and bool(choices[0].get("text"))


def _message(detail: bytes) -> str:
    """An OpenAI-style error body's message (`{"error": {"message": …}}`), else the body's text."""
    from .server import json_object

    value = json_object(detail)
    inner = value.get("error", value)
    msg = inner.get("message") if isinstance(inner, dict) else inner
    return str(msg or value or detail.decode("utf-8", "replace").strip())[:200]
