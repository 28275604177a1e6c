"""`vllm-doctor health`: a local HTTP server on 127.0.0.1 serves real bodies captured from real vLLM servers
(tests/data/health/README.md says how), and the doctor reads them as it reads a live server: over HTTP, no
client mocked. Each rule has a real body where it holds and one where it must not."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("prometheus_client")

DATA = ROOT / "tests" / "data" / "health"


class Served:
    """What the fake server answers: /metrics bodies in turn (the last one repeats), /health's status."""

    def __init__(self, bodies: list[str], health: int = 200, version: str = "0.32.0") -> None:
        self.bodies, self.health, self.version = list(bodies), health, version
        self.paths: list[str] = []


@pytest.fixture
def server():
    servers = []

    def start(served: Served) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                served.paths.append(self.path)
                if self.path == "/metrics":
                    body = served.bodies.pop(0) if len(served.bodies) > 1 else served.bodies[0]
                    status, data = 200, body.encode()
                elif self.path == "/health":
                    status, data = served.health, b""
                elif self.path == "/v1/models":
                    status, data = 200, json.dumps({"data": [{"id": "tiny-llama"}]}).encode()
                elif self.path == "/version":
                    status, data = 200, json.dumps({"version": served.version}).encode()
                else:
                    status, data = 404, b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def body(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def health(catalog, url: str):
    from vllm_doctor.checks.health import diagnose_server, read_twice

    ticks = iter(range(0, 1000, 5))          # each reading 5 s after the last, without waiting for it
    return diagnose_server(read_twice(url, interval=5.0, wait=lambda s: None, clock=lambda: next(ticks)), catalog)


def test_a_saturated_server_preempting_is_found_with_fewer_requests_at_once(server, catalog):
    served = Served([body("v0.32.0-cpu-saturated-1.metrics"), body("v0.32.0-cpu-saturated-2.metrics")])
    d = health(catalog, server(served))
    rules = [f.rule for f in d.findings]
    assert rules[:1] == ["server-kv-saturated"], rules
    fix = d.findings[0].fix
    assert fix.edits and fix.edits[0].flag == "--max-num-seqs"
    assert d.facts.get("vllm.version") == "0.32.0" and d.facts.get("server.models") == ["tiny-llama"]
    assert set(served.paths) == {"/health", "/v1/models", "/version", "/metrics"}     # only GETs of these


def test_an_idle_or_working_server_is_healthy(server, catalog):
    for first, second in (("v0.32.0-cpu-idle.metrics", "v0.32.0-cpu-idle.metrics"),
                          ("v0.32.0-cpu-busy.metrics", "v0.32.0-cpu-after.metrics")):
        d = health(catalog, server(Served([body(first), body(second)])))
        assert d.findings == [], (first, [f.rule for f in d.findings])


def test_an_engine_making_no_progress_behind_a_healthy_health(server, catalog):
    """The same busy body twice: requests in flight, no token generated and none finished in between."""
    busy = body("v0.32.0-cpu-busy.metrics")
    d = health(catalog, server(Served([busy, busy])))
    assert [f.rule for f in d.findings] == ["server-no-completions"]
    # read back to back, the same counters are an engine between two steps: no verdict
    from vllm_doctor.checks.health import diagnose_server, read_twice

    now = diagnose_server(read_twice(server(Served([busy, busy])), interval=0.0, wait=lambda s: None), catalog)
    assert now.findings == []
    # the same counters while /health fails is a dead server, which /health already says: no such finding
    dead = health(catalog, server(Served([busy, busy], health=503)))
    assert "server-no-completions" not in [f.rule for f in dead.findings]


def test_the_older_metric_generation_is_read(catalog):
    from vllm_doctor.facts.server_metrics import figures

    old = sorted(DATA.glob("old-gen-*.metrics"))
    assert old, "a public body of the gpu_cache_usage_perc generation"
    f = figures(old[0].read_text(encoding="utf-8"))
    assert f.generation == "vllm:gpu_cache_usage_perc" and f.kv_usage is not None and f.running is not None
    new = figures(body("v0.32.0-cpu-idle.metrics"))
    assert new.generation == "vllm:kv_cache_usage_perc"


def test_the_cli_exit_codes(server):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "vllm_doctor", "health", *args], capture_output=True,
                              timeout=120, cwd=ROOT)

    idle = body("v0.32.0-cpu-idle.metrics")
    ok = cli(server(Served([idle])), "--interval", "0", "--no-color")
    assert ok.returncode == 0, ok.stdout.decode() + ok.stderr.decode()
    saturated = Served([body("v0.32.0-cpu-saturated-1.metrics"), body("v0.32.0-cpu-saturated-2.metrics")])
    found = cli(server(saturated), "--interval", "0", "--format", "json")
    assert found.returncode == 1
    assert json.loads(found.stdout)["findings"][0]["rule"] == "server-kv-saturated"
    gone = cli("http://127.0.0.1:9", "--interval", "0")        # nothing listens on the discard port
    assert gone.returncode == 2 and len(gone.stderr.decode().strip().splitlines()) == 1
    assert b"Traceback" not in gone.stderr
