"""vLLM's memory arithmetic as pure functions (no I/O, no vLLM import).

The formulas follow docs/reference/vllm-messages.md §5 ("Memory math"):

* KV bytes per token per GPU, full attention: ``2 x L_stage x max(1, K // t) x head_size x dtype_bytes``
  (``L_stage`` = layers of the largest pipeline stage, ``K`` = KV heads, ``t`` = tensor-parallel size;
  once ``t > K`` each rank keeps one whole KV head, so the cache per GPU stops shrinking).
* MLA (DeepSeek-V2/V3, Kimi-K2): ``L_stage x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes`` -- one
  latent vector per token, no K/V pair, not divided by ``t`` (every rank stores the full latent).
* KV memory is handed out in blocks of ``block_size`` tokens (16 by default), so a context length that
  fits is rounded down to a whole block.
* ``gpu_memory_utilization`` is a fraction of the device's TOTAL memory; raising it by ``du`` adds
  ``du x total`` to the KV budget, but vLLM (0.9.1+) refuses to start unless ``u x total`` is free.

Sizes in log messages are parsed with :func:`parse_size` (PyTorch's ``format_size`` writes
``N bytes``/``KiB``/``MiB``/``GiB``; vLLM's old "GB" means GiB, i.e. bytes / 2**30).
"""
from __future__ import annotations

import math
import re

from vllm_doctor.numbers import as_int, parse_float

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
DEFAULT_BLOCK = 16

_UNITS = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": KIB, "kib": KIB, "k": KIB,
    "mb": MIB, "mib": MIB, "m": MIB,
    "gb": GIB, "gib": GIB, "g": GIB,
    "tb": TIB, "tib": TIB, "t": TIB,
}
_SIZE = re.compile(r"^\s*(-?\d+(?:[.,]\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float | None) -> int | None:
    """Bytes in a size such as ``"20.00 MiB"``, ``"1.5 GiB"``, ``"0 bytes"``, ``"14.99 GB"``.

    A bare number is bytes. vLLM's "GB" is GiB (it divides by 2**30). None when it cannot be read.
    """
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return as_int(text)                     # NaN, ±inf, 10**30: no size
    m = _SIZE.match(str(text))
    if not m:
        return None
    number = parse_float(m.group(1).replace(",", "."))
    unit = m.group(2).lower() or "b"
    factor = _UNITS.get(unit)
    if factor is None or number is None:
        return None
    return as_int(round(number * factor))


def to_gib(value: str | int | float | None) -> float | None:
    """GiB from a size string (see :func:`parse_size`) or from bytes."""
    b = parse_size(value)
    return None if b is None else b / GIB


def dtype_bytes(dtype: str | None, default: int = 2) -> int:
    """Bytes per element for a vLLM ``--dtype`` / ``--kv-cache-dtype`` value (auto = the model's, ~2)."""
    if not dtype:
        return default
    d = str(dtype).lower().replace("torch.", "")
    if d.startswith("fp8") or d in ("int8", "uint8", "float8"):
        return 1
    if d in ("float", "float32", "fp32"):
        return 4
    if d in ("half", "float16", "fp16", "bfloat16", "bf16"):
        return 2
    return default


def layers_per_stage(num_layers: int, pp: int = 1) -> int:
    """Layers of the largest pipeline stage (vLLM spreads the remainder, so ceil)."""
    pp = max(1, int(pp or 1))
    return -(-int(num_layers) // pp)


def kv_heads_per_gpu(num_kv_heads: int, tp: int = 1) -> int:
    """KV heads one rank stores: K // t, never fewer than one (replication once t > K).

    As vLLM's ``ModelConfig.get_num_kv_heads`` (vllm/config/model.py; vllm/config.py before 0.10):
    ``max(1, total_num_kv_heads // tensor_parallel_size)`` -- "we will replicate the KV heads in the case
    where the number of KV heads is smaller than the tensor parallel size so each GPU has at least one KV
    head". With MLA it returns 1 (the latent is one "head"), which :func:`kv_bytes_per_token` follows.
    """
    return max(1, int(num_kv_heads) // max(1, int(tp or 1)))


def kv_bytes_per_token(num_layers: int, num_kv_heads: int | None = None, head_size: int | None = None,
                       dtype_bytes: int = 2, tp: int = 1, pp: int = 1, use_mla: bool = False,
                       kv_lora_rank: int | None = None, qk_rope_head_dim: int | None = None) -> int:
    """KV-cache bytes one token costs on one GPU (full attention; MLA when ``use_mla``).

    Full attention is vLLM's FullAttentionSpec page (K and V: ``2 x block x heads x head_size x dtype``)
    per layer of the stage; MLA is MLAAttentionSpec's (one latent of ``kv_lora_rank + qk_rope_head_dim``
    per token, one head, no V), the same on every tensor-parallel rank.
    """
    layers = layers_per_stage(num_layers, pp)
    if use_mla:
        if not kv_lora_rank:
            raise ValueError("MLA needs kv_lora_rank")
        latent = int(kv_lora_rank) + int(qk_rope_head_dim or 0)
        return layers * latent * dtype_bytes
    if not num_kv_heads or not head_size:
        raise ValueError("need num_kv_heads and head_size")
    return 2 * layers * kv_heads_per_gpu(num_kv_heads, tp) * int(head_size) * dtype_bytes


def round_down_to_block(tokens: int | float, block_size: int = DEFAULT_BLOCK) -> int:
    """Tokens rounded down to a whole number of blocks (0 if less than one block)."""
    block_size = max(1, int(block_size or DEFAULT_BLOCK))
    if tokens <= 0:
        return 0
    return int(tokens) // block_size * block_size


HEADROOM = 0.05      # the margin a computed --max-model-len keeps below the limit it was computed from


def len_with_headroom(limit_tokens: int | float, block_size: int = DEFAULT_BLOCK, margin: float = HEADROOM) -> int:
    """A ``--max-model-len`` safely below a computed KV limit: ``margin`` (5 %) under it, at least one block,
    rounded down to a whole block (0 when nothing that small is left).

    The limit is what fitted in one profiling run; the next start profiles again (another batch shape,
    a driver that holds a little more), so a context at exactly the limit can fail by a block."""
    block = max(1, int(block_size or DEFAULT_BLOCK))
    limit = int(limit_tokens)
    room = max(block, math.ceil(limit * margin))
    return round_down_to_block(limit - room, block)


def kv_bytes_needed(max_model_len: int, bytes_per_token: int, block_size: int = DEFAULT_BLOCK) -> int:
    """Bytes one request of ``max_model_len`` tokens needs (whole blocks)."""
    block_size = max(1, int(block_size or DEFAULT_BLOCK))
    blocks = -(-int(max_model_len) // block_size)
    return blocks * block_size * int(bytes_per_token)


def max_len_for_budget(kv_budget_bytes: int | float, bytes_per_token: int,
                       block_size: int = DEFAULT_BLOCK) -> int:
    """Largest ``--max-model-len`` whose KV cache fits ``kv_budget_bytes`` (a multiple of the block)."""
    if bytes_per_token <= 0 or kv_budget_bytes <= 0:
        return 0
    return round_down_to_block(kv_budget_bytes // bytes_per_token, block_size)


def floor_to(x: float, step: float = 0.01) -> float:
    """``x`` rounded down to ``step`` (robust to float noise: 0.29999999 -> 0.29 only if really below)."""
    return round(math.floor(round(x / step, 6)) * step, 4)


def ceil_to(x: float, step: float = 0.01) -> float:
    return round(math.ceil(round(x / step, 6)) * step, 4)


def max_safe_utilization(free_gib: float, total_gib: float, margin: float = 0.01) -> float:
    """The largest ``--gpu-memory-utilization`` that vLLM's free-memory check accepts, less a margin.

    vLLM compares ``u x total`` with the memory free at start; the numbers in the message are rounded
    to 0.01 GiB, so stay ``margin`` below ``free / total``.
    """
    if total_gib <= 0:
        return 0.0
    return max(0.0, floor_to(free_gib / total_gib - margin))


def utilization_for_need(current_util: float, needed_gib: float, available_gib: float, total_gib: float,
                         cap: float | None = None) -> tuple[float, bool]:
    """The ``--gpu-memory-utilization`` that raises the KV budget from ``available`` to ``needed``.

    ``u' = u + (needed - available) / total`` rounded up to 0.01, capped at ``cap`` (what is free, or
    0.99). Returns ``(u', capped)``; when ``capped`` is True, ``u'`` does NOT give all the memory needed.
    """
    if total_gib <= 0:
        raise ValueError("total_gib must be positive")
    want = ceil_to(current_util + max(0.0, needed_gib - available_gib) / total_gib)
    limit = 0.99 if cap is None else min(0.99, cap)
    if want > limit:
        return floor_to(limit), True
    return want, False


def kv_gib_at_utilization(current_util: float, available_gib: float, new_util: float, total_gib: float) -> float:
    """KV budget after changing the utilization (the non-KV memory stays the same)."""
    return available_gib + (new_util - current_util) * total_gib


def fmt_gib(gib: float) -> str:
    return f"{gib:.2f} GiB"


def fmt_bytes(n: int | float) -> str:
    """Human size: ``128 KiB``, ``1.50 MiB``, ``8.00 GiB``."""
    n = float(n)
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        v = n / MIB
        return f"{v:.0f} MiB" if v == int(v) else f"{v:.2f} MiB"
    if n >= KIB:
        v = n / KIB
        return f"{v:.0f} KiB" if v == int(v) else f"{v:.2f} KiB"
    return f"{int(n)} bytes"


def fmt_tokens(n: int) -> str:
    return f"{int(n):,}"


def estimate_params(hidden: int, layers: int, heads: int, kv_heads: int | None = None,
                    head_dim: int | None = None, intermediate: int | None = None, vocab: int | None = None,
                    tied: bool = False, num_experts: int | None = None,
                    moe_intermediate: int | None = None, mla: tuple[int, int | None, int, int, int] | None = None) -> int:
    """Rough parameter count of a decoder-only transformer (attention + gated MLP + embeddings).

    Used only when the checkpoint size is unknown; norms and biases are ignored (< 0.1 %). `mla`: (kv_lora_rank,
    q_lora_rank or None, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) of DeepSeek-style latent attention.
    """
    attn, mlp = layer_params(hidden, heads, kv_heads, head_dim, intermediate, num_experts, moe_intermediate, mla)
    emb = (vocab or 0) * hidden * (1 if tied else 2)
    return layers * (attn + mlp) + emb


def layer_params(hidden: int, heads: int, kv_heads: int | None = None, head_dim: int | None = None,
                 intermediate: int | None = None, num_experts: int | None = None,
                 moe_intermediate: int | None = None,
                 mla: tuple[int, int | None, int, int, int] | None = None) -> tuple[int, int]:
    """(attention, MLP) parameters of one decoder layer: the two parts a mixed quantization scheme keeps
    at different bit widths (see :func:`estimate_params`)."""
    kv_heads = kv_heads or heads
    head_dim = head_dim or hidden // heads
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if mla:
        attn = mla_attention_params(hidden, heads, *mla)
    if num_experts and moe_intermediate:
        mlp = 3 * hidden * moe_intermediate * num_experts
    else:
        mlp = 3 * hidden * (intermediate or 4 * hidden)
    return attn, mlp


def mla_attention_params(hidden: int, heads: int, kv_lora: int, q_lora: int | None, nope: int, rope: int,
                         v_head: int) -> int:
    """One DeepSeek-V2/V3 attention layer (modeling_deepseek.py's DeepseekV2Attention): the query through a latent
    (q_a_proj, q_b_proj) or directly (q_proj), keys and values through one latent (kv_a_proj_with_mqa, kv_b_proj),
    then o_proj."""
    q_dim = heads * (nope + rope)
    query = hidden * q_lora + q_lora * q_dim if q_lora else hidden * q_dim
    return query + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_head) + heads * v_head * hidden


def default_utilization(version: str | None) -> float:
    """vLLM's default --gpu-memory-utilization: 0.90, 0.92 from 0.20.0 (an unknown version counts as newest)."""
    from vllm_doctor.command.versions import at_least

    return 0.92 if at_least(version, "0.20.0") else 0.90
