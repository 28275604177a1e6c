"""The user's launch command: given with --cmd, printed at the top of the log (`$ vllm serve …`), or
rebuilt from the arguments vLLM logged. Its flags become `args.*` facts."""
from __future__ import annotations

from typing import Any

from vllm_doctor.events.logfacts import LogFacts
from vllm_doctor.facts import Facts

# flags whose values remedies read, by fact name
ARG_FLAGS = {
    "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
    "data_parallel_size": "--data-parallel-size", "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization", "dtype": "--dtype", "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype", "block_size": "--block-size", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "port": "--port", "enforce_eager": "--enforce-eager",
    "trust_remote_code": "--trust-remote-code", "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "cpu_offload_gb": "--cpu-offload-gb", "distributed_executor_backend": "--distributed-executor-backend",
}


def _number(value: Any) -> Any:
    if isinstance(value, str):
        for convert in (int, float):
            try:
                return convert(value)
            except ValueError:
                continue
    return value


def _estimate(facts: Facts, args: dict) -> str | None:
    """No version line in the log: the newest release whose parser had every argument it logged (an `args:
    Namespace(…)` of 0.2 names `max_paddings`, gone after 0.3.3), so the rebuilt command is one that release runs."""
    from vllm_doctor.command import flags

    found = flags.newest_release_with("--" + str(k).replace("_", "-") for k in args if k not in ("model", "model_tag"))
    if found:
        facts.set("launch.version_estimate", found, "log")
    return found


def resolve_command(facts: Facts, logfacts: LogFacts, user_text: str | None = None):
    try:
        from vllm_doctor.command import Command
    except ImportError:
        return None
    source = "user" if user_text else "log"
    text = user_text or logfacts.command_line
    command = None
    placeholder = None
    try:
        if text:
            command = Command.parse(text)
        else:
            # Rebuilt from what vLLM logged; with nothing logged, from the model alone, so that a fix
            # can still be shown as a whole command.
            args = dict(logfacts.args)
            if logfacts.args_cut:
                # a cut repr: rebuild no command that looks complete but lacks the flags it cut off; keep
                # the model and the flags remedies read, and say so
                args = {k: v for k, v in args.items() if k in ("model", "model_tag") or k in ARG_FLAGS}
                facts.set("launch.args_cut", True, "log")
            if not (args.get("model") or args.get("model_tag")):
                if not facts.get("args.model"):
                    placeholder = "MODEL"      # shown in the fix, never looked up as a model
                args["model"] = facts.get("args.model") or placeholder
            command = Command.from_args(args, version=facts.get("vllm.version") or _estimate(facts, args))
            facts.set("launch.command", command.render(), "log")
            facts.set("launch.reconstructed", True, "log")
    except Exception:  # an unparseable command is a missing fact, not a crash
        return None
    if command is None:
        return None
    if user_text:
        facts.set("launch.command", user_text, "user")
    try:
        model = command.model
        if model and model != placeholder:
            facts.set("args.model", model, source)
        for name, flag in ARG_FLAGS.items():
            value = command.get(flag)
            if value is not None:
                facts.set(f"args.{name}", _number(value), source)
    except Exception:
        pass
    return command
