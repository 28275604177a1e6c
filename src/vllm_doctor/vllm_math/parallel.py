"""vLLM's tensor/pipeline-parallel arithmetic, as pure functions (no I/O, no vLLM import).

The rules are the ones vLLM really enforces (docs/reference/vllm-messages.md §4, "vLLM's real
tensor/pipeline-parallel rules"), for a tensor-parallel size ``t``:

* attention heads ``H % t == 0`` (the config check, the first one to fire);
* KV heads ``K % t == 0`` when ``K >= t`` (heads are partitioned) or ``t % K == 0`` when ``K < t``
  (each KV head is replicated ``t / K`` times);
* the padded vocabulary ``ceil(vocab / 64) * 64`` divides by ``t``;
* the dense MLP ``intermediate_size % t == 0`` and, for MoE, ``moe_intermediate_size % t == 0``;
* GPTQ/AWQ/Marlin group size ``g > 0``: a quantization group may not straddle two ranks, so
  ``(intermediate_size / t) % g == 0`` and ``(H * head_dim / t) % g == 0`` (o_proj);
* the vision tower of a multimodal model: ``vision_heads % t == 0``.

``plan`` ranks (tp, pp) layouts for a number of GPUs; pipeline parallelism has no head constraint.

Every loop over sizes is bounded by the GPUs that can exist, never by a number a log or a flag gives
(`-tp 80000000`, 10**11 heads): sizes are tried up to MAX_CLUSTER_GPUS, divisors found by trial up to the
square root. A size beyond MAX_CLUSTER_GPUS is not a real size (see ``real_size``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

VOCAB_PAD = 64          # vLLM pads the vocabulary to a multiple of 64 before sharding it
GIB = 1 << 30
# The most GPUs one node holds (8 or 16 in today's servers, 72 in one NVLink domain of a GB200 NVL72 rack
# spread over 18 nodes): 64 leaves room. The most in one cluster vLLM could span: 65536 (the largest
# training clusters have ~10**5 GPUs, no vLLM deployment spans one). A tp, pp or GPU count beyond is a
# typo or hostile input, answered with a note instead of a loop that long.
MAX_GPUS_PER_NODE = 64
MAX_CLUSTER_GPUS = 65536
# The node a remedy assumes when the GPU count is unknown and the size asked for is not real (`-tp 80000000`
# says nothing of the machine): a common 8-GPU server (DGX/HGX).
GUESSED_NODE_GPUS = 8


def padded_vocab(vocab: int, pad: int = VOCAB_PAD) -> int:
    return -(-vocab // pad) * pad


def _mod(a: int, b: int) -> str:
    return f"{a} % {b} = {a % b}"


def why_invalid(t: int, heads: int | None, kv_heads: int | None = None, vocab: int | None = None,
                intermediate: int | None = None, moe_intermediate: int | None = None,
                quant_group: int | None = None, vision_heads: int | None = None,
                head_dim: int | None = None) -> list[str]:
    """The arithmetic of every check ``t`` fails (empty list: ``t`` is valid for what is known).

    Listed in the order vLLM meets them: the config check on heads, the vocabulary embedding (built
    before the decoder layers), the attention KV heads, the MLP, quantization groups, the vision tower.
    """
    out: list[str] = []
    if t < 1:
        return [f"tensor-parallel size {t} is not a positive integer"]
    if heads and heads % t:
        out.append(f"attention heads: {_mod(heads, t)}")
    if vocab:
        pv = padded_vocab(vocab)
        if pv % t:
            pad = f"{vocab} padded to {pv}" if pv != vocab else f"{vocab}"
            out.append(f"vocabulary ({pad}): {_mod(pv, t)}")
    if kv_heads and not (kv_heads % t == 0 or t % kv_heads == 0):
        if kv_heads >= t:
            out.append(f"KV heads: {_mod(kv_heads, t)} (KV heads are split across ranks when K >= tp)")
        else:
            out.append(f"KV heads: {_mod(t, kv_heads)} (tp must be a multiple of K={kv_heads} "
                       f"to replicate KV heads when K < tp)")
    if intermediate and intermediate % t:
        out.append(f"intermediate_size: {_mod(intermediate, t)}")
    if moe_intermediate and moe_intermediate % t:
        out.append(f"moe_intermediate_size: {_mod(moe_intermediate, t)}")
    if quant_group and quant_group > 0:
        if intermediate and intermediate % t == 0 and (intermediate // t) % quant_group:
            per = intermediate // t
            out.append(f"quantization groups: intermediate_size/tp = {intermediate}/{t} = {per}; "
                       f"{_mod(per, quant_group)} (group size {quant_group} would straddle ranks)")
        if heads and head_dim and (heads * head_dim) % t == 0:
            per = heads * head_dim // t
            if per % quant_group:
                out.append(f"quantization groups: heads*head_dim/tp = {heads}*{head_dim}/{t} = {per}; "
                           f"{_mod(per, quant_group)} (group size {quant_group} would straddle ranks)")
    if vision_heads and vision_heads % t:
        out.append(f"vision-tower heads: {_mod(vision_heads, t)}")
    return out


def valid_tp_sizes(heads: int | None, kv_heads: int | None = None, vocab: int | None = None,
                   intermediate: int | None = None, moe_intermediate: int | None = None,
                   quant_group: int | None = None, vision_heads: int | None = None,
                   max_tp: int | None = None, head_dim: int | None = None) -> list[int]:
    """Every tensor-parallel size vLLM accepts for this model, ascending, capped at ``max_tp``."""
    upper = min(heads if heads else max(x for x in (kv_heads, vision_heads, 64) if x), MAX_CLUSTER_GPUS)
    if max_tp is not None:
        upper = min(upper, max_tp)
    if upper < 1:
        return []
    # a valid size divides the heads: only the divisors are tried (10**11 heads cost ~√ of that, not 10**11)
    candidates = divisors(heads, upper) if heads and heads > 0 else range(1, upper + 1)
    return [t for t in candidates
            if not why_invalid(t, heads, kv_heads, vocab, intermediate, moe_intermediate, quant_group,
                               vision_heads, head_dim)]


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def powers_of_two(limit: int, below: int | None = None) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (and under ``below``; [1] at least): what almost every model accepts."""
    out = [1 << i for i in range(max(1, int(limit)).bit_length())]
    return out if below is None else [t for t in out if t < below] or [1]


def explain_tp_sizes(heads: int | None, max_tp: int, tp: int | None = None, **kw) -> tuple[list[int], list[str]]:
    """The valid tensor-parallel sizes up to ``max_tp`` and the arithmetic a person checks them by: the
    divisors of the head count, why each size that divides the heads (or ``tp``) still fails, the valid list."""
    max_tp = min(max_tp, MAX_CLUSTER_GPUS)
    lines = []
    if heads:
        shown = divisors(heads)
        upto = f" up to {MAX_CLUSTER_GPUS}" if heads > MAX_CLUSTER_GPUS else ""
        lines.append(f"divisors of {heads} attention heads{upto}: " + ", ".join(map(str, shown)))
    valid = valid_tp_sizes(heads, max_tp=max_tp, **kw)
    ok = set(valid)
    if heads and heads > 0:     # only the sizes that divide the heads (and the one asked for) need a reason
        tried = sorted({t for t in divisors(heads, max_tp) if t >= 2} | ({tp} if tp and 2 <= tp <= max_tp else set()))
    else:
        tried = range(2, max_tp + 1)
    for t in tried:
        why = [] if t in ok else why_invalid(t, heads, **kw)
        if why and (heads is None or heads % t == 0 or t == tp):
            lines.append(f"tp={t} fails: " + "; ".join(why))
    lines.append("valid --tensor-parallel-size values up to " + f"{max_tp}: " + ", ".join(map(str, valid)))
    return valid, lines


@dataclass
class Plan:
    tp: int
    pp: int
    gpus: int                           # GPUs available (or the upper bound assumed)
    weights_per_gpu: float | None = None  # bytes
    fits: bool | None = None            # weights fit per GPU (None: unknown)
    costs: list[str] = field(default_factory=list)
    replicas: int = 1                   # copies of the layout on the GPUs asked for (--data-parallel-size)

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def idle(self) -> int:
        return max(0, self.gpus - self.world * self.replicas)

    def as_tuple(self) -> tuple[int, int]:
        return (self.tp, self.pp)


def plan_costs(tp: int, pp: int, gpus: int, kv_heads: int | None = None, use_mla: bool = False,
               weight_bytes: int | None = None, gpu_mem_bytes: int | None = None,
               num_layers: int | None = None) -> tuple[list[str], float | None, bool | None]:
    """What a (tp, pp) layout costs: idle GPUs, pipeline bubbles, KV per GPU, weights per GPU."""
    costs: list[str] = []
    world = tp * pp
    if world < gpus:
        costs.append(f"leaves {gpus - world} of {gpus} GPUs idle")
    if pp > 1:
        layers = f" (~{-(-num_layers // pp)} of {num_layers} layers per stage)" if num_layers else ""
        costs.append(f"{pp} pipeline stages{layers}: each token passes the stages in turn, so "
                     f"single-request latency is higher (pipeline bubbles) than with pure tensor parallel")
    if use_mla and tp > 1:
        costs.append("MLA latent KV cache is not sharded by tp: every rank stores the full latent cache")
    elif kv_heads and tp > kv_heads:
        costs.append(f"tp={tp} > {kv_heads} KV heads: each KV head is replicated {tp // kv_heads}x, "
                     f"so the KV cache per GPU stops shrinking (1 KV head per GPU)")
    per_gpu: float | None = None
    fits: bool | None = None
    if weight_bytes:
        per_gpu = weight_bytes / world
        if gpu_mem_bytes:
            # leave room for activations and a usable KV cache under the default utilization (0.9)
            fits = per_gpu <= 0.75 * gpu_mem_bytes
            costs.append(f"weights ~{per_gpu / GIB:.1f} GiB per GPU of {gpu_mem_bytes / GIB:.0f} GiB"
                         + ("" if fits else " (too little room left for the KV cache)"))
        else:
            costs.append(f"weights ~{per_gpu / GIB:.1f} GiB per GPU")
    return costs, per_gpu, fits


# a layout's fit by the memory model: (fits, weight bytes per GPU, the cost line), or None where it cannot say
Fit = Callable[[int, int], "tuple[bool | None, float, str] | None"]


def rank_plans(gpus: int, heads: int | None, kv_heads: int | None = None, vocab: int | None = None,
               intermediate: int | None = None, moe_intermediate: int | None = None,
               quant_group: int | None = None, vision_heads: int | None = None,
               head_dim: int | None = None, weight_bytes: int | None = None,
               gpu_mem_bytes: int | None = None, gpus_per_node: int | None = None,
               pp_supported: bool = True, num_layers: int | None = None, use_mla: bool = False,
               exclude: tuple[int, int] | None = None, sizes: list[int] | None = None,
               want: int | None = None, prefer_above: bool = True, replicas: bool = False,
               small: bool = False, fit: Fit | None = None) -> list[Plan]:
    """Ranked (tp, pp) layouts with tp valid and tp*pp <= gpus, best first.

    ``sizes``: the tensor-parallel sizes to rank instead of every valid one (a model whose config is
    unknown: the sizes the evidence allows). ``want``: the number of GPUs the user asked for (tp x pp
    of the launch); None: all ``gpus``. ``prefer_above``: between two layouts as near the request, the
    larger (the GPUs are known to exist) rather than the smaller.

    Order: layouts whose weights fit per GPU (when known) first; then layouts that do not leave half
    or more of the requested GPUs idle; then pure tensor parallel before pipeline parallel (lower
    latency); then the world size nearest the request (`-tp 3` asked on 8 GPUs: 2 or 4, not 8); then
    larger tp; powers of two break ties. Pipeline layouts use every GPU (tp*pp == gpus).
    ``replicas`` (the release has --data-parallel-size): a one-stage layout whose weights are known to fit
    fills the GPUs asked for with copies of itself, as an operator serves a model that fits, before any
    pipeline layout (pipeline stages only add latency to a model that fits without them). ``small``: the
    weights are known to fit one GPU with room to spare though no checkpoint was measured (an estimate under
    a quarter of a GPU: no rounding of the estimate can make it miss). ``fit``: the memory model's verdict on a
    layout (vllm_math/budget.py, the one budget `check` and `plan` use), in place of the weights rule of thumb.
    """
    if gpus < 1:
        return []
    max_tp = min(gpus if gpus_per_node is None else min(gpus, gpus_per_node), MAX_CLUSTER_GPUS)
    if sizes is None:
        sizes = valid_tp_sizes(heads, kv_heads, vocab, intermediate, moe_intermediate, quant_group,
                               vision_heads, max_tp=max_tp, head_dim=head_dim)
    sizes = [t for t in sizes if 1 <= t <= max_tp]
    plans: list[Plan] = []
    for t in sizes:
        pps = [1]
        if pp_supported and gpus // t > 1 and t * (gpus // t) == gpus:
            pp = gpus // t
            if not num_layers or pp <= num_layers:
                pps.append(pp)
        for pp in pps:
            if exclude is not None and (t, pp) == tuple(exclude):
                continue
            verdict = fit(t, pp) if fit is not None else None
            costs, per_gpu, fits = plan_costs(t, pp, gpus, kv_heads, use_mla,
                                              None if verdict else weight_bytes, gpu_mem_bytes, num_layers)
            if verdict:
                fits, per_gpu = verdict[0], verdict[1]
                costs.append(verdict[2])
            plans.append(Plan(t, pp, gpus, per_gpu, fits, costs))

    target = min(gpus, want) if want else gpus
    # replicas through --data-parallel-size stay on one node: its default backend starts them all locally
    on_one_node = gpus_per_node is None or target <= gpus_per_node
    for p in plans if replicas and on_one_node else []:
        if p.pp == 1 and (p.fits or p.fits is None and small) and p.world < target and target % p.world == 0:
            p.replicas = target // p.world
            p.costs = [c for c in p.costs if not c.startswith("leaves ")] + [
                f"{p.replicas} replicas (--data-parallel-size {p.replicas}): more requests at once, each on "
                f"{p.world} GPU{'s' if p.world > 1 else ''}"]

    def key(p: Plan):
        used = p.world * p.replicas
        short = max(0, target - used)             # requested GPUs the layout leaves unused
        wastes = target > 2 and short * 2 >= target
        side = used < target if prefer_above else used > target
        # replicas fill the GPUs without coming nearer the size asked for (-tp 3 meant one copy on 3 GPUs):
        # only a small model's replicas count as using every GPU
        near = abs((used if small or p.replicas == 1 else p.world) - target)
        short_of = (p.weights_per_gpu or 0.0) if p.fits is False else 0.0    # none fits: the least weights per GPU first
        return (p.fits is False, short_of, wastes, p.pp > 1, near, side, -p.tp, not is_power_of_two(p.tp))

    plans.sort(key=key)
    return plans


def plan(gpus: int, heads: int | None, *args, **kwargs) -> list[tuple[int, int]]:
    """Ranked list of (tp, pp); same arguments as ``rank_plans``, which also gives the costs."""
    return [p.as_tuple() for p in rank_plans(gpus, heads, *args, **kwargs)]


def divisors(n: int, limit: int = MAX_CLUSTER_GPUS) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (a tp size never exceeds the GPUs there can be), ascending, by
    trial up to min(√n, limit): 10**12 heads cost 65536 steps, not 10**12. Empty for n < 1."""
    if n < 1 or limit < 1:
        return []
    root = math.isqrt(n)
    small = [d for d in range(1, min(root, limit) + 1) if n % d == 0]
    large = [n // d for d in reversed(small) if root < n // d <= limit]
    return small + large


def real_size(n: int | None) -> bool:
    """A tp, pp, world size or GPU count that can exist: 1..MAX_CLUSTER_GPUS."""
    return n is not None and 1 <= n <= MAX_CLUSTER_GPUS


def not_a_real_size(what: str, n: int) -> str:
    """The note for a size ``real_size`` refuses (`-tp 80000000`, a snapshot claiming 10**12 GPUs)."""
    if n < 1:
        return f"{what} {n} is not a real size: it must be at least 1"
    return f"{what} {n} is not a real size: no cluster has more than {MAX_CLUSTER_GPUS} GPUs"


DP_SINCE = "0.8.3"           # `vllm serve --data-parallel-size` (data/flags/versions.json)


def dp_supported(version: str | None) -> bool:
    """`vllm serve --data-parallel-size` exists from 0.8.3; an unknown version counts as newest."""
    from vllm_doctor.command.versions import at_least

    return at_least(version, DP_SINCE)


def pp_supported(version: str | None) -> bool:
    """Pipeline parallelism exists from vLLM 0.5.1 (rule 6); an unknown version counts as newest."""
    from vllm_doctor.command.versions import at_least

    return at_least(version, "0.5.1")
