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
from vllm_doctor.facts.keys import SERVER_MODELS, SERVER_STATE, SERVER_URL, VLLM_VERSION
from vllm_doctor.facts.server import DEFAULT_URL, ServerSample, read_server
from vllm_doctor.facts.server_metrics import Figures, figures
from vllm_doctor.facts.server_probe import PROBE_TOKENS

SOURCE = "health"
SATURATED = 0.95       # KV use at which a growing preemption counter is the cache running out, not a blip
STALLED_S = 2.0        # no token in less time than this is an engine between steps, not a stalled one
IDLE_CACHE = 0.5       # KV use below which a queue that stays is held back by the scheduler, not the cache
QUEUE_SHARE = 0.5      # the share of the time to the first token spent queued that makes queueing the latency
SLOW_TTFT_S = 1.0      # a mean time to the first token below this is no latency to explain
# The bounds a queue waits on: when one of them is found, queueing's latency is its symptom (its supporting
# evidence), not a second finding with a second fix.
QUEUE_BOUNDS = ("server-kv-saturated", "server-scheduler-bound")


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
    out += _queue(r, usage, running)
    busy = all((f.running or 0) + (f.waiting or 0) > 0 for f in (r.before, a))
    alive = r.first.health_status == 200 and r.last.health_status == 200
    if alive and busy and r.seconds >= STALLED_S and r.grew("generated") == 0 and not r.grew("finished"):
        out.append(Prediction("server-no-completions",
                              f"vllm-doctor health: /health OK but no token generated and no request finished in "
                              f"{r.seconds:.1f} s ({running} running, {waiting} waiting)"))
    return out


def state(r: Reading, probe=None) -> str:
    """What the two readings (and a completed probe) show, in one line: the all-clear says what it is clear of."""
    a = r.after
    parts = [f"{int(a.running or 0)} running, {int(a.waiting or 0)} waiting"]
    if a.kv_usage is not None:
        parts.append(f"KV cache {a.kv_usage * 100:.1f}% used")
    grew = [(r.grew(k), noun) for k, noun in (("finished", "requests finished"), ("generated", "tokens generated"),
                                               ("preemptions", "preempted"))]
    said = [f"{int(n)} {noun}" for n, noun in grew if n is not None]
    text = ", ".join(parts) + (f"; in {r.seconds:.1f} s: " + ", ".join(said) if said else "")
    if probe is not None and probe.completed:
        first = f", the first after {probe.first_s:.2f} s" if probe.first_s is not None else ""
        text += f"; the probe: {probe.chunks} tokens in {probe.total_s:.2f} s{first}"
    return text


def _mean_request_tokens(f: Figures) -> int | None:
    """Prompt plus generated tokens of the average finished request (vLLM's request-length histograms)."""
    if not f.requests_sized or f.prompt_tokens is None or f.output_tokens is None:
        return None
    return round((f.prompt_tokens + f.output_tokens) / f.requests_sized) or None


def _queue(r: Reading, usage: float, running: int) -> list[Prediction]:
    """A queue held back with the cache idle (the scheduler's bound), and a first token that is mostly queueing."""
    out: list[Prediction] = []
    before, after = int(r.before.waiting or 0), int(r.after.waiting or 0)
    preempted = r.grew("preemptions") or 0
    if before > 0 and after > 0 and running > 0 and usage < IDLE_CACHE and preempted <= 0:
        tokens, size = _mean_request_tokens(r.after), r.after.kv_tokens
        room = f" ({size} tokens; a finished request averages {tokens} tokens)" if tokens and size else ""
        out.append(Prediction("server-scheduler-bound",
                              f"vllm-doctor health: {before} then {after} requests waiting with {running} running "
                              f"while the KV cache was at most {usage * 100:.1f}% used{room}"))
    queued, firsts = r.grew("queued"), r.grew("ttft_n")
    if queued and firsts and queued > 0 and firsts > 0:
        queue_s = (r.grew("queue_s") or 0.0) / queued
        ttft_s = (r.grew("ttft_s") or 0.0) / firsts
        if ttft_s >= SLOW_TTFT_S and queue_s >= QUEUE_SHARE * ttft_s:
            share = min(100.0, queue_s / ttft_s * 100)
            out.append(Prediction("server-queueing-ttft",
                                  f"vllm-doctor health: requests queued {queue_s:.2f} s of their {ttft_s:.2f} s to the "
                                  f"first token ({share:.0f}%), {int(firsts)} first tokens in {r.seconds:.1f} s "
                                  f"(KV cache at most {usage * 100:.1f}% used when read; {_preemptions(preempted)})"))
    return out


def _preemptions(n: float) -> str:
    # a preemption between the readings means the cache ran out then, whatever its use when read
    return f"{int(n)} preemption{'s' if n != 1 else ''}" if n > 0 else "no preemption"


def _absorb_queueing(findings: list) -> list:
    """Queueing's latency under a bound another rule names is that bound's symptom: its supporting evidence."""
    bound = next((f for f in findings if f.rule in QUEUE_BOUNDS), None)
    if bound is None:
        return findings
    for f in findings:
        if f.rule == "server-queueing-ttft":
            bound.supporting.extend(f.evidence)
    return [f for f in findings if f.rule != "server-queueing-ttft"]


def _gpu_coverage(command, facts: Facts, environ: dict[str, str] | None) -> CheckRun:
    from vllm_doctor.checks.health_gpus import group_of

    why = ("the launch is unknown: give --cmd, or run health where the server runs" if command is None else
           facts.get("gpu.nvml_error") or "no GPU facts: run health on the server's machine, or give --facts"
           if not facts.get("gpu.devices") else "the launch's group is not all on this machine's GPUs (more "
           "ranks than GPUs, or Ray places them)" if group_of(command, facts, environ or {}) is None else "")
    return CheckRun("the GPUs of the server's group", not why, why)


def _probed(r: Reading, probe) -> tuple[list[Prediction], list[str]]:
    """What the one probe request (--probe) shows: a stalled engine when it got no completion (no answer, or the
    engine's own 5xx) while /health said OK; the notice that it was sent, and a refusal (4xx) as a notice."""
    said = [f"health --probe sent one request: {PROBE_TOKENS} tokens of {probe.model!r} at temperature 0"]
    if probe.completed:
        return [], said
    if probe.status is not None and probe.status < 500:
        return [], said + [f"the probe request was refused ({probe.error}): no verdict from it"]
    if r.last.health_status != 200:
        return [], said
    a = r.after
    return [Prediction("server-no-completions",
                       f"vllm-doctor health: /health OK but a probe request of {PROBE_TOKENS} tokens did not complete "
                       f"({probe.error}) ({int(a.running or 0)} running, {int(a.waiting or 0)} waiting)")], said


def diagnose_server(reading: Reading, catalog, command=None, gpus: Facts | None = None,
                    environ: dict[str, str] | None = None, probe=None, server_pids: frozenset[int] = frozenset()):
    """The Diagnosis `health` prints: its findings, the server's facts, what could not be read. `gpus`: this
    machine's GPU facts (NVML or a snapshot); `environ`: the server process's own GPU selection, when read;
    `probe`: the one request --probe sent (facts/server_probe.py); `server_pids`: the server's processes, when
    read from this machine's process list (what NVML lists beside them is not the server's)."""
    from vllm_doctor.checks.health_gpus import idle_gpus
    from vllm_doctor.checks.health_memory import over_budget, rank_share
    from vllm_doctor.findings import Diagnosis

    facts = Facts()
    if gpus is not None:
        facts.merge(gpus)
    facts.set(SERVER_URL, reading.last.url, SOURCE)
    if reading.last.version:
        facts.set(VLLM_VERSION, reading.last.version, SOURCE)
    if reading.last.models:
        facts.set(SERVER_MODELS, reading.last.models, SOURCE)
    if reading.after.running is not None:
        facts.set(SERVER_STATE, state(reading, probe), SOURCE)
    share = rank_share(command, facts, reading.after)
    predictions = observations(reading) + idle_gpus(command, facts, environ, share[0] if share else None)
    if not any(p.rule == "server-gpu-idle" for p in predictions):     # a rank elsewhere: no budget to judge
        predictions += over_budget(command, facts, environ, reading.after, reading.last.version, server_pids)
    probe_notices: list[str] = []
    if probe is not None:
        stalled, probe_notices = _probed(reading, probe)
        predictions += [p for p in stalled if p.rule not in {q.rule for q in predictions}]
    findings = [f for i, p in enumerate(predictions, 1)
                if (f := finding_for(p, catalog, facts, command, i, source=SOURCE, title_prefix=""))]
    findings = _absorb_queueing(sorted(findings, key=lambda f: -f.priority))
    for f in findings:      # a fix with nothing to change in the launch is no "rerun your command, unchanged"
        if f.rewrite is not None and f.rewrite.form == "outside":
            f.rewrite = None
        if all(rw.form == "outside" for rw in f.alt_rewrites):
            f.alt_rewrites = []
    metrics = bool(reading.last.metrics_text) and reading.after.running is not None
    coverage = [_gpu_coverage(command, facts, environ),
                CheckRun("the server's /health", reading.last.health_status is not None,
                         reading.last.errors.get("/health", ""), True),
                CheckRun("the server's /metrics (vLLM's own)", metrics,
                         reading.last.errors.get("/metrics", "" if metrics else "no vllm: metrics in the body"), True)]
    status = reading.last.health_status
    notices = ([f"/health answered HTTP {status}"] if status not in (None, 200) else []) + probe_notices
    return Diagnosis(findings, facts, [], command, 0, [SOURCE], notices, coverage=coverage)
