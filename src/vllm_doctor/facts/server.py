"""A running vLLM server as `health` sees it: its OpenAI-compatible endpoints read over HTTP (/health,
/v1/models, /version, /metrics), nothing sent but GETs, and only to the address the user gave (default
127.0.0.1:8000). No proxy from the environment: the server is the user's, not the internet's."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 5.0
MAX_BODY = 32 << 20          # a /metrics body of a busy server is a few hundred KiB; more is not vLLM's


class ServerUnreachable(Exception):
    """Nothing answers at the URL (refused, timed out, not HTTP): one line, exit 2."""


@dataclass
class ServerSample:
    """One reading of the server's endpoints, at `at` (monotonic seconds)."""
    url: str
    at: float
    health_status: int | None = None          # /health's HTTP status (200: the engine is alive)
    models: list[str] = field(default_factory=list)
    version: str | None = None
    metrics_text: str = ""
    errors: dict[str, str] = field(default_factory=dict)   # endpoint -> why it gave nothing


def _get(url: str, api_key: str | None, timeout: float) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:          # an answer: its status says what it is
        return exc.code, exc.read(4096) if exc.fp else b""


def read_server(url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = TIMEOUT_S,
                clock: Callable[[], float] = time.monotonic) -> ServerSample:
    """The four endpoints once. Raises ServerUnreachable when /metrics and /health both get no answer."""
    base = url.rstrip("/")
    sample = ServerSample(base, clock())
    answered = False
    for path in ("/health", "/v1/models", "/version", "/metrics"):
        try:
            status, body = _get(base + path, api_key, timeout)
        except (OSError, ValueError) as exc:       # refused, timed out, a name that does not resolve
            sample.errors[path] = str(getattr(exc, "reason", None) or exc)
            continue
        answered = True
        if path == "/health":
            sample.health_status = status
        elif status != 200:
            sample.errors[path] = f"HTTP {status}"
        elif path == "/v1/models":
            sample.models = _model_ids(body)
        elif path == "/version":
            sample.version = json_object(body).get("version")
        else:
            sample.metrics_text = body.decode("utf-8", "replace")
    if not answered:
        why = sample.errors.get("/health") or sample.errors.get("/metrics") or "no answer"
        raise ServerUnreachable(f"no vLLM server answers at {base}: {why}")
    return sample


def json_object(body: bytes) -> dict:
    try:
        value = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _model_ids(body: bytes) -> list[str]:
    data = json_object(body).get("data")
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
