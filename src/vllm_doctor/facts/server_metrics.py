"""vLLM's Prometheus metrics as the figures `health` judges, across the metric generations: the KV cache's
use (`vllm:kv_cache_usage_perc` since V1, `vllm:gpu_cache_usage_perc` before), requests running and
waiting, preemptions (`vllm:num_preemptions_total`; the V0 counter `vllm:num_preemptions`), finished
requests (`vllm:request_success_total`, every finish reason summed), tokens generated, the sums and counts of
the queue-time, time-to-first-token and request-length histograms, and the KV cache's size in tokens
(`vllm:cache_config_info`'s `num_gpu_blocks` x `block_size`, labels both generations carry), with the
memory budget the server runs under (that info's `gpu_memory_utilization`, and `kv_cache_memory_bytes` where a
size replaced the budget). Parsed with
prometheus_client's text parser (the optional `health` extra), summed over each metric's label sets
(one per model name and engine); the KV use and the cache's size are one engine's (the fullest, the smallest)."""
from __future__ import annotations

from dataclasses import dataclass

# figure -> the metric names that carry it, newest generation first (a sample's own `_total` suffix included)
NAMES = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "finished": ("vllm:request_success_total", "vllm:request_success"),
    "generated": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
    "queue_s": ("vllm:request_queue_time_seconds_sum",),
    "queued": ("vllm:request_queue_time_seconds_count",),
    "ttft_s": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_n": ("vllm:time_to_first_token_seconds_count",),
    "prompt_tokens": ("vllm:request_prompt_tokens_sum",),
    "output_tokens": ("vllm:request_generation_tokens_sum",),
    "requests_sized": ("vllm:request_prompt_tokens_count",),
}
CACHE_INFO = "vllm:cache_config_info"
LARGEST = {"kv_usage"}       # a fraction per engine: the fullest engine is the one that preempts, not the sum


class MetricsUnreadable(Exception):
    """The optional parser is missing, or the body is not Prometheus text."""


@dataclass(frozen=True)
class Figures:
    kv_usage: float | None = None       # 0..1
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None    # a counter: only its increase between two samples means anything
    finished: float | None = None       # a counter
    generated: float | None = None      # a counter
    # histogram sums and counts (counters too): time queued and to the first token, tokens per finished request
    queue_s: float | None = None
    queued: float | None = None
    ttft_s: float | None = None
    ttft_n: float | None = None
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    requests_sized: float | None = None
    kv_tokens: int | None = None        # one engine's KV cache in tokens (the smallest engine's)
    utilization: float | None = None    # the server's own --gpu-memory-utilization, as its cache info says
    kv_memory_bytes: int | None = None  # --kv-cache-memory-bytes (0.10.2+): a KV size that bypasses the budget
    generation: str = ""                # which KV metric name answered (the metric generation)


def figures(text: str) -> Figures:
    """The figures of one /metrics body; a figure whose metric is absent is None."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise MetricsUnreadable("reading /metrics needs prometheus_client: pip install 'vllm-doctor[health]'") from None
    samples: dict[str, list[float]] = {}
    engine_tokens: list[int] = []
    budget: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append(float(s.value))
                if s.name == CACHE_INFO and (tokens := _cache_tokens(s.labels)):
                    engine_tokens.append(tokens)
                if s.name == CACHE_INFO:
                    budget.update(_budget(s.labels))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsUnreadable(f"/metrics is not Prometheus text: {exc}") from None
    values: dict[str, float | None] = {}
    generation = ""
    for figure, names in NAMES.items():
        name = next((n for n in names if n in samples), None)
        if name is None:
            values[figure] = None
            continue
        got = samples[name]
        values[figure] = max(got) if figure in LARGEST else sum(got)
        if figure == "kv_usage":
            generation = name
    # one engine's cache: each engine (a data-parallel replica) schedules its own requests in it
    return Figures(**values, kv_tokens=min(engine_tokens, default=None), generation=generation,
                   utilization=budget.get("utilization"),
                   kv_memory_bytes=int(budget["kv_bytes"]) if "kv_bytes" in budget else None)


def _budget(labels: dict[str, str]) -> dict[str, float]:
    """The memory budget a cache info states: its utilization (0 < u <= 1) and a KV size in bytes ("None" when
    unset, as Python printed it)."""
    out: dict[str, float] = {}
    try:
        u = float(labels.get("gpu_memory_utilization", ""))
        if 0 < u <= 1:
            out["utilization"] = u
    except ValueError:
        pass
    size = str(labels.get("kv_cache_memory_bytes", ""))
    if size.isdigit() and int(size) > 0:
        out["kv_bytes"] = float(size)
    return out


def _cache_tokens(labels: dict[str, str]) -> int:
    """One engine's KV cache in tokens from its cache_config_info labels; 0 when they do not say."""
    blocks, size = (str(labels.get(k, "")) for k in ("num_gpu_blocks", "block_size"))
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else 0
