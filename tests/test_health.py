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

    def __init__(self, bodies: list[str], health: int = 200, version: str = "0.32.0",
                 completion: tuple[int, bytes] | None = None) -> None:
        self.bodies, self.health, self.version = list(bodies), health, version
        self.completion = completion          # POST /v1/completions' (status, body); None: never answered
        self.released = threading.Event()     # set at teardown: a request never answered ends then
        self.paths: list[str] = []


def handler_for(served: Served):
    """The request handler of a fake server answering as `served` says."""
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

        def do_POST(self):  # noqa: N802
            served.paths.append("POST " + self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if served.completion is None:          # an engine that never answers
                served.released.wait(timeout=120)
                return
            status, data = served.completion
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream" if status == 200 else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def server():
    servers = []

    def start(served: Served) -> str:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(served))
        httpd.served = served
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.served.released.set()
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
                          ("v0.32.0-cpu-steady-1.metrics", "v0.32.0-cpu-steady-2.metrics")):
        d = health(catalog, server(Served([body(first), body(second)])))
        assert d.findings == [], (first, [f.rule for f in d.findings])


def test_a_queue_held_by_the_scheduler_with_the_cache_idle(server, catalog):
    """--max-num-seqs 2 under 10 arrivals a second: the queue grows (15 -> 42), the cache stays under 13 %."""
    from vllm_doctor.facts.server_metrics import figures

    d = health(catalog, server(Served([body("v0.32.0-cpu-queued-1.metrics"), body("v0.32.0-cpu-queued-2.metrics")])))
    assert [f.rule for f in d.findings] == ["server-scheduler-bound"]
    root = d.findings[0]
    # as many at once as the cache holds: its tokens over an average finished request's (prompt + generated)
    last = figures(body("v0.32.0-cpu-queued-2.metrics"))
    per_request = round((last.prompt_tokens + last.output_tokens) / last.requests_sized)
    assert (last.kv_tokens, per_request) == (6400, 454)
    assert [(e.flag, e.value) for e in root.fix.edits] == [("--max-num-seqs", str(6400 // 454))]
    # the first token was mostly queueing, which this bound explains: supporting evidence, not a second finding
    assert any("to the first token" in line.raw for line in root.supporting)
    # the same server once the arrivals stopped: the queue shrinks (44 -> 32) but is still held by the bound
    drain = health(catalog, server(Served([body("v0.32.0-cpu-draining-1.metrics"),
                                           body("v0.32.0-cpu-draining-2.metrics")])))
    assert [f.rule for f in drain.findings] == ["server-scheduler-bound"]


def test_a_queue_behind_a_full_cache_is_not_the_schedulers(server, catalog):
    d = health(catalog, server(Served([body("v0.32.0-cpu-saturated-1.metrics"),
                                       body("v0.32.0-cpu-saturated-2.metrics")])))
    assert [f.rule for f in d.findings] == ["server-kv-saturated"]


def test_a_launch_limit_above_the_running_count_points_at_the_token_budget(server, catalog):
    from vllm_doctor.checks.health import diagnose_server, read_twice
    from vllm_doctor.command import Command

    url = server(Served([body("v0.32.0-cpu-queued-1.metrics"), body("v0.32.0-cpu-queued-2.metrics")]))
    ticks = iter(range(0, 100, 5))
    reading = read_twice(url, interval=5.0, wait=lambda s: None, clock=lambda: next(ticks))
    held = diagnose_server(reading, catalog, Command.parse("vllm serve ./tiny-llama --max-num-seqs 2"))
    assert [(e.flag, e.value) for e in held.findings[0].fix.edits] == [("--max-num-seqs", "14")]
    budget = diagnose_server(reading, catalog, Command.parse("vllm serve ./tiny-llama --max-num-seqs 64"))
    fix = budget.findings[0].fix
    assert fix.edits == [] and "--max-num-batched-tokens" in fix.summary


def test_queueing_alone_when_the_readings_straddle_a_burst(server, catalog):
    """Read before and after a burst of 64 requests against a cache of 2.5: neither reading shows the queue or
    the full cache, but the counters between them do (time queued, preemptions)."""
    d = health(catalog, server(Served([body("v0.32.0-cpu-busy.metrics"), body("v0.32.0-cpu-after.metrics")])))
    assert [f.rule for f in d.findings] == ["server-queueing-ttft"]
    f = d.findings[0]
    assert "317 preemptions" in f.fix.summary and "KV cache" in f.fix.summary
    assert f.rewrite is None            # nothing in the launch to change: no "rerun your command, unchanged"
    # a steady load whose requests never waited: no such finding
    steady = health(catalog, server(Served([body("v0.32.0-cpu-steady-1.metrics"),
                                            body("v0.32.0-cpu-steady-2.metrics")])))
    assert steady.findings == []


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


def test_an_idle_server_of_the_older_generation_is_healthy(server, catalog):
    d = health(catalog, server(Served([next(DATA.glob("old-gen-*.metrics")).read_text(encoding="utf-8")])))
    assert d.findings == [] and d.facts.get("server.state").startswith("0 running, 0 waiting, KV cache 0.0% used")


def test_the_cli_exit_codes(server):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "vllm_doctor", "health", *args], capture_output=True,
                              timeout=120, cwd=ROOT)

    idle = body("v0.32.0-cpu-idle.metrics")
    ok = cli(server(Served([idle])), "--interval", "0", "--no-color")
    assert ok.returncode == 0, ok.stdout.decode() + ok.stderr.decode()
    text = ok.stdout.decode()       # the all-clear says what it read, on one screen
    assert "the server: 0 running, 0 waiting, KV cache 0.0% used" in text and len(text.splitlines()) <= 24
    saturated = Served([body("v0.32.0-cpu-saturated-1.metrics"), body("v0.32.0-cpu-saturated-2.metrics")])
    found = cli(server(saturated), "--interval", "0", "--format", "json")
    assert found.returncode == 1
    assert json.loads(found.stdout)["findings"][0]["rule"] == "server-kv-saturated"
    assert not any(p.startswith("POST") for p in saturated.paths)       # no generation request unless --probe
    gone = cli("http://127.0.0.1:9", "--interval", "0")        # nothing listens on the discard port
    assert gone.returncode == 2 and len(gone.stderr.decode().strip().splitlines()) == 1
    assert b"Traceback" not in gone.stderr


def test_probe_sends_one_bounded_request_and_says_so(server, catalog):
    """--probe: the real streamed answer of a 0.32 server to the probe's request; the report says it was sent."""
    from vllm_doctor.checks.health import diagnose_server, read_twice
    from vllm_doctor.facts.server_probe import PROBE_TOKENS, probe

    steady = [body("v0.32.0-cpu-steady-1.metrics"), body("v0.32.0-cpu-steady-2.metrics")]
    answered = Served(steady, completion=(200, (DATA / "v0.32.0-cpu-probe.sse").read_bytes()))
    url = server(answered)
    reading = read_twice(url, interval=0.0, wait=lambda s: None)
    result = probe(url, "tiny-llama")
    assert result.completed and result.chunks == PROBE_TOKENS and result.first_s <= result.total_s
    d = diagnose_server(reading, catalog, probe=result)
    assert d.findings == [] and f"the probe: {PROBE_TOKENS} tokens in" in d.facts.get("server.state")
    assert any(n.startswith("health --probe sent one request") for n in d.notices)
    assert [p for p in answered.paths if p.startswith("POST")] == ["POST /v1/completions"]
    # refused (a model the server does not serve): said, no verdict
    refused = Served(steady, completion=(404, (DATA / "v0.32.0-cpu-probe-404.json").read_bytes()))
    no = probe(server(refused), "nope")
    assert no.status == 404 and "does not exist" in no.error
    d = diagnose_server(reading, catalog, probe=no)
    assert d.findings == [] and any("refused" in n for n in d.notices)


def test_a_probe_that_gets_no_answer_behind_a_healthy_health(server, catalog):
    from vllm_doctor.checks.health import diagnose_server, read_twice
    from vllm_doctor.facts.server_probe import probe

    hung = Served([body("v0.32.0-cpu-idle.metrics")], completion=None)
    url = server(hung)
    reading = read_twice(url, interval=0.0, wait=lambda s: None)
    result = probe(url, "tiny-llama", timeout=0.5)
    assert not result.completed and result.status is None
    d = diagnose_server(reading, catalog, probe=result)
    assert [f.rule for f in d.findings] == ["server-no-completions"]
    assert "probe did not complete" in d.findings[0].fix.summary
