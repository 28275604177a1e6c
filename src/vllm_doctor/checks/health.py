"""`vllm-doctor health [URL]`: a running server read twice, a few seconds apart (facts/server.py), its
metrics turned into figures across the metric generations (facts/server_metrics.py), and what the figures
show stated as one line per condition; the catalog's server-* rules read those lines and their remedies
compute the fix, as `check` does with the lines vLLM would print. Only GETs, only to the URL given."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from vllm_doctor.checks.coverage import CheckRun, Prediction
from vllm_doctor.checks.preflight import finding_for
from vllm_doctor.facts import Facts
from vllm_doctor.facts.keys import SERVER_MODELS, SERVER_URL, VLLM_VERSION
from vllm_doctor.facts.server import DEFAULT_URL, ServerSample, read_server
from vllm_doctor.facts.server_metrics import Figures, figures

SOURCE = "health"
SATURATED = 0.95       # KV use at which a growing preemption counter is the cache running out, not a blip
STALLED_S = 2.0        # no token in less time than this is an engine between steps, not a stalled one


@dataclass(frozen=True)
class Reading:
    """Two samples of one server and what they show."""
    first: ServerSample
    last: ServerSample
    before: Figures
    after: Figures

    @property
    def seconds(self) -> float:
        return max(0.0, self.last.at - self.first.at)

    def grew(self, figure: str) -> float | None:
        a, b = getattr(self.before, figure), getattr(self.after, figure)
        return None if a is None or b is None else b - a


def read_twice(url: str = DEFAULT_URL, api_key: str | None = None, interval: float = 5.0,
               wait: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Reading:
    first = read_server(url, api_key, clock=clock)
    wait(interval)
    last = read_server(url, api_key, clock=clock)
    return Reading(first, last, figures(first.metrics_text), figures(last.metrics_text))


def observations(r: Reading) -> list[Prediction]:
    """Each condition the two samples meet, as the line its rule reads."""
    out: list[Prediction] = []
    a = r.after
    running, waiting = int(a.running or 0), int(a.waiting or 0)
    usage = max(x for x in (r.before.kv_usage, a.kv_usage, 0.0) if x is not None)
    preempted = r.grew("preemptions")
    if preempted and preempted > 0 and usage >= SATURATED:
        out.append(Prediction("server-kv-saturated",
                              f"vllm-doctor health: KV cache {usage * 100:.1f}% used, {int(preempted)} preemption"
                              f"{'s' if preempted != 1 else ''} in {r.seconds:.1f} s ({running} running, "
                              f"{waiting} waiting)", facts={"kv_metric": a.generation}))
    busy = all((f.running or 0) + (f.waiting or 0) > 0 for f in (r.before, a))
    alive = r.first.health_status == 200 and r.last.health_status == 200
    if alive and busy and r.seconds >= STALLED_S and r.grew("generated") == 0 and not r.grew("finished"):
        out.append(Prediction("server-no-completions",
                              f"vllm-doctor health: /health OK but no token generated and no request finished in "
                              f"{r.seconds:.1f} s ({running} running, {waiting} waiting)"))
    return out


def diagnose_server(reading: Reading, catalog, command=None):
    """The Diagnosis `health` prints: its findings, the server's facts, what could not be read."""
    from vllm_doctor.findings import Diagnosis

    facts = Facts()
    facts.set(SERVER_URL, reading.last.url, SOURCE)
    if reading.last.version:
        facts.set(VLLM_VERSION, reading.last.version, SOURCE)
    if reading.last.models:
        facts.set(SERVER_MODELS, reading.last.models, SOURCE)
    findings = [f for i, p in enumerate(observations(reading), 1)
                if (f := finding_for(p, catalog, facts, command, i, source=SOURCE, title_prefix=""))]
    findings.sort(key=lambda f: -f.priority)
    metrics = bool(reading.last.metrics_text) and reading.after.running is not None
    coverage = [CheckRun("the server's /health", reading.last.health_status is not None,
                         reading.last.errors.get("/health", ""), True),
                CheckRun("the server's /metrics (vLLM's own)", metrics,
                         reading.last.errors.get("/metrics", "" if metrics else "no vllm: metrics in the body"), True)]
    status = reading.last.health_status
    notices = [f"/health answered HTTP {status}"] if status not in (None, 200) else []
    return Diagnosis(findings, facts, [], command, 0, [SOURCE], notices, coverage=coverage)
