"""Remedies for the memory family: CUDA OOM (load / runtime), KV cache, utilization, max-model-len.

One function per rule (``fix_*``, named by the rules as ``memory:fix_*``). Every number a fix proposes is
derived from the figures in the log (captures and ``log.*`` facts) first, then from the model
(``ctx.shape``, sized by :mod:`vllm_doctor.vllm_math.sizing` as `plan` and `check` size it), the GPUs
(``gpu.*``) and the user's arguments (``ctx.arg``); the arithmetic is returned as lines a person can check
by hand. The math itself lives in :mod:`vllm_doctor.vllm_math.memory`.

kv.py: kv-cache-insufficient; util.py: gpu-memory-utilization-too-high; max_len.py: max-model-len-too-large;
oom.py: cuda-oom-load and cuda-oom-runtime; common.py: the GPU, the processes on it, shared alternatives.
"""
from .kv import fix_kv_cache
from .max_len import fix_max_model_len
from .oom import fix_oom_load, fix_oom_runtime
from .util import fix_gpu_util

__all__ = ["fix_gpu_util", "fix_kv_cache", "fix_max_model_len", "fix_oom_load", "fix_oom_runtime"]
