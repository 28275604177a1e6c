"""`vllm-doctor check [--] vllm serve MODEL …`: predict the start-up failures of a launch command, without
starting vLLM.

Each check computes what vLLM would compute (``vllm_math.parallel``; the model sized by ``vllm_math.sizing``,
as `plan` and the memory remedies size it; the argparse oracle in ``command.argcheck``), writes the message
vLLM would print, matches it against the rule catalog (so the rule id and its named captures are the ones a
real log would give) and runs that rule's remedy on the user's command. Findings are marked as predictions:
title "Predicted: …", fact ``predicted: true``, evidence from the source "predicted", and a confidence that
says how sure the arithmetic is.

Checks, in the order vLLM meets them: arguments for the vLLM version (unknown/removed flags, bad values),
max-model-len vs the model's derived maximum, heads/KV heads/vocabulary/MLP sizes vs tensor parallel,
pipeline support, world size vs visible GPUs, dtype vs compute capability, free memory vs the
utilization, weights per GPU, KV cache for max_model_len, /dev/shm (TP > 1 in a container), P2P between
the chosen GPUs (informational: vLLM disables custom all-reduce itself), the API port.

Never changes the system: the port is looked up in /proc/net/tcp{,6} (LISTEN sockets), nothing is bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_doctor.command.versions import at_least, parse_version
from vllm_doctor.facts import Facts
from vllm_doctor.facts.ports import port_in_use
from vllm_doctor.facts import gpus
from vllm_doctor.numbers import as_float, as_int
from vllm_doctor.vllm_math.sizing import ACTIVATION_GIB, GIB, Sizing, parse_len
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm

PREDICTED_SOURCE = "predicted"
TITLE_PREFIX = "Predicted: "
SHM_MIN_BYTES = 512 * mm.MIB     # below this NCCL's shared-memory transport is likely to run out (Docker: 64 MiB)


class PreflightError(Exception):
    """A command that cannot be checked: one line, exit 2."""


@dataclass
class Prediction:
    rule: str
    message: str                     # what vLLM would print
    captures: dict[str, str] = field(default_factory=dict)
    confidence: str = "high"
    facts: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None      # None: the rule's own


# --------------------------------------------------------------------------- the checks

def _gib(x: float) -> str:
    return f"{x:.2f}"


class Checker:
    def __init__(self, facts: Facts, command, port_probe: Callable[[int], bool | None] | None) -> None:
        self.facts = facts
        self.command = command
        self.port_probe = port_probe
        self.out: list[Prediction] = []
        self.notices: list[str] = []
        self.version = facts.get("vllm.version")
        f = facts
        self.sizing = Sizing.from_facts(facts)
        self.shape = self.sizing.shape
        self.tp = max(1, as_int(f.get("args.tensor_parallel_size")) or 1)
        self.pp = max(1, as_int(f.get("args.pipeline_parallel_size")) or 1)
        self.dp = max(1, as_int(f.get("args.data_parallel_size")) or 1)
        self.world = self.tp * self.pp
        self.devs = gpus.devices(f)
        self.chosen = self.devs[: self.world * self.dp]

    def add(self, *args, **kwargs) -> None:
        self.out.append(Prediction(*args, **kwargs))

    def run(self) -> tuple[list[Prediction], list[str]]:
        for step in (self.arguments, self.max_model_len, self.tensor_parallel, self.pipeline, self.world_size,
                     self.dtype, self.memory, self.shm, self.p2p, self.port):
            try:
                step()
            except Exception as exc:  # one broken check must not cost the others
                self.notices.append(f"check {step.__name__} skipped ({type(exc).__name__}: {exc})")
        return self.out, self.notices

    # -- arguments ------------------------------------------------------------------------------
    def arguments(self) -> None:
        from vllm_doctor.command.argcheck import accepts

        argv = self.command.argv()
        if self.command.shape == "serve":
            argv = ["vllm", "serve"] + argv
        ok, error = accepts(argv, self.version)
        if ok:
            return
        rule = "cli-unknown-arg" if "unrecognized arguments" in error else "cli-invalid-choice"
        self.add(rule, error, confidence="high" if self.version else "medium",
                 facts={"checked_against": f"vLLM {self.version}" if self.version else "latest vLLM flags"})

    # -- max model len --------------------------------------------------------------------------
    def max_model_len(self) -> None:
        user = parse_len(self.facts.get("args.max_model_len"))
        derived = self.shape.derived_max_len
        env = self.command.env if hasattr(self.command, "env") else {}
        if not user or not derived or user <= derived or env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
            return
        key = self.shape.derived_max_len_key or "max_position_embeddings"
        self.add("max-model-len-too-large",
                 f"ValueError: User-specified max_model_len ({user}) is greater than the derived max_model_len "
                 f"({key}={derived} or model_max_length=None in model's config.json).",
                 {"max_model_len": str(user), "key": key, "derived": str(derived)})

    # -- tensor parallel ------------------------------------------------------------------------
    def tensor_parallel(self) -> None:
        heads = self.shape.heads
        if self.tp == 1 or not heads:
            return
        kw = self.shape.tp_kwargs()
        t = self.tp
        why = pm.why_invalid(t, heads, **kw)
        if not why:
            return
        first = why[0]
        facts = {"why": why, "valid_tp_sizes": pm.valid_tp_sizes(heads, max_tp=max(t, len(self.devs) or t), **kw)}
        if first.startswith("attention heads"):
            self.add("tp-heads-indivisible",
                     f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor "
                     f"parallel size ({t}).", {"heads": str(heads), "tp": str(t)}, facts=facts)
        elif first.startswith("KV heads"):
            kv = kw["kv_heads"]
            msg = ("    assert self.total_num_kv_heads % tp_size == 0" if kv >= t
                   else "    assert tp_size % self.total_num_kv_heads == 0")
            self.add("tp-kv-heads-indivisible", msg, {"kv_heads": str(kv), "tp": str(t)}, facts=facts)
        elif first.startswith("vision-tower"):
            vh = kw["vision_heads"]
            self.add("tp-heads-indivisible", f"AssertionError: {vh} is not divisible by {t}",
                     {"numerator": str(vh), "denominator": str(t)}, facts=facts)
        else:
            num = None
            if first.startswith("vocabulary"):
                num = pm.padded_vocab(kw["vocab"])
            elif first.startswith("intermediate_size"):
                num = kw["intermediate"]
            elif first.startswith("moe_intermediate"):
                num = kw["moe_intermediate"]
            if num is not None:
                self.add("tp-shape-indivisible", f"AssertionError: {num} is not divisible by {t}",
                         {"numerator": str(num), "denominator": str(t)}, facts=facts)
            else:   # quantization groups
                self.add("tp-shape-indivisible",
                         "ValueError: The input size is not aligned with the quantized weight shape. "
                         "This can be caused by too large tensor parallel size.", {"side": "input"},
                         confidence="medium", facts=facts)

    # -- pipeline -------------------------------------------------------------------------------
    def pipeline(self) -> None:
        if self.pp == 1:
            return
        if not pm.pp_supported(self.version):
            self.add("pp-unsupported", "NotImplementedError: Pipeline parallelism is not supported yet.",
                     facts={"vllm_version": self.version})
        else:
            self.notices.append("pipeline support of this architecture not checked (needs vLLM's model registry)")

    # -- world size -----------------------------------------------------------------------------
    def world_size(self) -> None:
        count = as_int(self.facts.get("gpu.count"))
        if count is None or self.facts.get("gpu.nvml_error"):
            return
        backend = str(self.facts.get("args.distributed_executor_backend") or "")
        world = self.world * self.dp
        if world <= count or backend == "ray" or (self.command.get("--nnodes") or "1") != "1":
            return
        if count == 0:
            return
        self.add("parallel-exceeds-gpus",
                 f"ValueError: World size ({world}) is larger than the number of available GPUs ({count}) in "
                 f"this node.", {"world_size": str(world), "gpus": str(count)})

    # -- dtype ----------------------------------------------------------------------------------
    def dtype(self) -> None:
        if self.sizing.load_dtype() != "bfloat16" or not self.chosen:
            return
        low = [(d, cc) for d in self.chosen if (cc := gpus.compute_capability(d)) and cc < (8, 0)]
        if not low:
            return
        d, cc = low[0]
        explicit = str(self.facts.get("args.dtype") or "auto").lower() in ("bfloat16", "bf16")
        self.add("compute-capability",
                 f"ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your "
                 f"{d.get('name', 'GPU')} GPU has compute capability {cc[0]}.{cc[1]}. You can use float16 instead "
                 f"by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.",
                 {"gpu_name": str(d.get("name", "GPU")), "cc_major": str(cc[0]), "cc_minor": str(cc[1])},
                 confidence="high" if explicit else "medium",
                 facts={"dtype": "--dtype bfloat16" if explicit else "auto (config.json says bfloat16)"})

    # -- memory ---------------------------------------------------------------------------------
    def sizing_basis(self) -> dict[str, Any]:
        """What the memory checks size this launch with (vllm_math.sizing, as `plan` and the remedies):
        weight bytes and how they were found, KV-cache bytes per token per GPU for tp x pp."""
        weights = self.sizing.weights()
        kv = self.sizing.kv_per_token(self.tp, self.pp)
        return {"weight_bytes": weights.bytes, "weights_source": weights.source,
                "kv_bytes_per_token": kv.bytes if kv else None}

    def memory(self) -> None:
        budget = self._memory_budget()
        if budget is None or self._free_memory_check(*budget):
            return
        total, free, _, u = budget
        weights = self.sizing.weights()
        if not weights.bytes:
            return
        per_gpu = weights.bytes / self.world / GIB
        basis = {"weights_total_gib": round(weights.bytes / GIB, 2), "weight_bytes": weights.bytes,
                 "weights_source": weights.source, "weights_per_gpu_gib": round(per_gpu, 2),
                 "gpu_total_gib": round(total, 2), "gpu_memory_utilization": u,
                 "activation_allowance_gib": ACTIVATION_GIB}
        if self._weights_check(per_gpu, free if free is not None else total, weights.estimated, basis):
            return
        self._kv_check(total, u, per_gpu, weights.estimated, basis)

    def _memory_budget(self) -> tuple[float, float | None, Any, float] | None:
        """(smallest total GiB, smallest free GiB, that GPU's index, utilization) of the GPUs used."""
        if not self.chosen:
            return None
        totals = [t for t in (gpus.total_gib(d) for d in self.chosen) if t]
        frees = [(f, d.get("index", 0)) for d in self.chosen if (f := gpus.free_gib(d)) is not None]
        if not totals:
            return None
        given = self.facts.get("args.gpu_memory_utilization")
        u = as_float(given) if given is not None else mm.default_utilization(self.version)
        if u is None:
            return None
        if self.facts.get("args.kv_cache_memory_bytes") or self.facts.get("args.cpu_offload_gb"):
            self.notices.append("memory checks skipped: --kv-cache-memory-bytes / --cpu-offload-gb change the budget")
            return None
        free, idx = min(frees, key=lambda x: x[0]) if frees else (None, 0)
        return min(totals), free, idx, u

    def _free_memory_check(self, total: float, free: float | None, idx: Any, u: float) -> bool:
        """The start-up free-memory check (0.9.1+); True when it fails."""
        if free is None or not at_least(self.version, "0.9.1") or free >= u * total:
            return False
        self.add("gpu-memory-utilization-too-high",
                 f"ValueError: Free memory on device cuda:{idx} ({_gib(free)}/{_gib(total)} GiB) on startup is "
                 f"less than desired GPU memory utilization ({u:g}, {_gib(u * total)} GiB). Decrease GPU "
                 f"memory utilization or reduce GPU memory used by other processes.",
                 {"device": f"cuda:{idx}", "free_gib": _gib(free), "total_gib": _gib(total), "util": f"{u:g}",
                  "requested_gib": _gib(u * total)})
        return True

    def _weights_check(self, per_gpu: float, room: float, estimated: bool, basis: dict) -> bool:
        """The weights themselves per GPU; True when they do not fit."""
        if per_gpu <= room - 0.5:
            return False
        # vLLM 0.13+'s own wording for an OOM while loading (gpu_model_runner.py), our numbers after it
        self.add("cuda-oom-load",
                 f"Failed to load model - not enough GPU memory. (predicted: {per_gpu:.2f} GiB of weights per "
                 f"GPU, {room:.2f} GiB free for them)",
                 confidence="medium" if estimated else "high", facts=basis)
        return True

    def _kv_check(self, total: float, u: float, per_gpu: float, estimated: bool, basis: dict) -> None:
        """The KV cache for one request of max_model_len."""
        kv_gib = u * total - per_gpu - ACTIVATION_GIB
        requested = parse_len(self.facts.get("args.max_model_len"))
        derived = self.shape.derived_max_len
        mml = min(x for x in (requested, derived) if x) if (requested or derived) else None
        if str(self.facts.get("args.max_model_len") or "") in ("auto", "-1"):
            mml = None
        kv = self.sizing.kv_per_token(self.tp, self.pp)
        bpt = kv.bytes if kv else None
        block = as_int(self.facts.get("args.block_size")) or mm.DEFAULT_BLOCK
        basis.update({"kv_budget_gib": round(kv_gib, 2),
                      "kv_budget": f"{u:g} x {total:.2f} - {per_gpu:.2f} (weights) - {ACTIVATION_GIB:g} (activations) "
                                   f"= {kv_gib:.2f} GiB per GPU"})
        if kv_gib <= 0:
            self.add("kv-cache-insufficient",
                     "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                     "when initializing the engine.",
                     {"available_gib": _gib(kv_gib), **({"max_model_len": str(mml)} if mml else {})},
                     confidence="medium" if kv_gib < -1 and not estimated else "low", facts=basis)
            return
        if not (mml and bpt):
            return
        needed = mm.kv_bytes_needed(mml, bpt, block) / GIB
        if needed <= kv_gib:
            return
        est = mm.max_len_for_budget(kv_gib * GIB, bpt, block)
        margin = (needed - kv_gib) / needed
        basis.update({"kv_bytes_per_token": bpt, "kv_needed_gib": round(needed, 2)})
        self.add("kv-cache-insufficient",
                 f"ValueError: To serve at least one request with the models's max seq len ({mml}), "
                 f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
                 f"({_gib(kv_gib)} GiB). Based on the available memory, the estimated maximum model length is {est}."
                 f" Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                 f"engine.",
                 {"max_model_len": str(mml), "needed_gib": _gib(needed), "available_gib": _gib(kv_gib),
                  "estimated_max_len": str(est)},
                 confidence="medium" if margin > 0.2 and not estimated else "low", facts=basis)

    # -- /dev/shm -------------------------------------------------------------------------------
    def shm(self) -> None:
        if self.world < 2:
            return
        if self.command.shape in ("docker", "compose"):
            opts = {k.lstrip("-").replace("_", "-"): v for k, v in (self.command.docker_options() or {}).items()}
            if "ipc" in opts or "shm-size" in opts:
                return
            self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                     "(size 9637888)", {"shm_path": "/dev/shm/nccl-XXXXXX", "shm_size": "9637888"},
                     confidence="medium", facts={"reason": "container started without --ipc=host or --shm-size: "
                                                           "Docker's default /dev/shm is 64 MiB"})
            return
        total = as_int(self.facts.get("env.shm_total_bytes"))
        if self.facts.get("env.in_container") and total is not None and total < SHM_MIN_BYTES:
            self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                     "(size 9637888)", {"shm_path": "/dev/shm/nccl-XXXXXX", "shm_size": "9637888"},
                     confidence="medium",
                     facts={"reason": f"in a container with /dev/shm {mm.fmt_bytes(total)} "
                                      f"(< {mm.fmt_bytes(SHM_MIN_BYTES)}) for tp x pp = {self.world}"})

    # -- P2P ------------------------------------------------------------------------------------
    def p2p(self) -> None:
        if self.tp < 2 or len(self.chosen) < 2:
            return
        p2p = self.facts.get("gpu.p2p")
        matrix = (p2p.get("read") or p2p.get("write")) if isinstance(p2p, dict) else p2p
        if not isinstance(matrix, list):
            return
        idx = [i for i in range(min(self.tp, len(matrix)))]
        bad = [f"{i}-{j}" for i in idx for j in idx if i < j and j < len(matrix[i])
               and str(matrix[i][j]) not in ("OK", "True", "true", "1", "?")]
        if not bad or self.command.has("--disable-custom-all-reduce"):
            return
        self.add("nccl-p2p",
                 "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. "
                 "To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                 confidence="low", severity="info",
                 facts={"pairs_without_p2p": bad,
                        "impact": "vLLM turns custom all-reduce off by itself; all-reduce goes through NCCL "
                                  "(slower, not a start-up failure)"})

    # -- port -----------------------------------------------------------------------------------
    def port(self) -> None:
        if self.port_probe is None:
            return
        port = as_int(self.facts.get("args.port")) or 8000
        if self.port_probe(port):
            host = str(self.command.get("--host") or "0.0.0.0")
            self.add("port-in-use",
                     f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): "
                     f"address already in use", {"errno": "98", "host": host, "port": str(port)},
                     confidence="high", facts={"port": port, "seen": "a socket listens on it (/proc/net/tcp)"})


# --------------------------------------------------------------------------- findings

def _finding(pred: Prediction, catalog, facts: Facts, command, seq: int):
    from vllm_doctor.findings import Finding, Match
    from vllm_doctor.numbers import as_typed
    from vllm_doctor.remedies.apply import run_remedy
    from vllm_doctor.rules.catalog import match_text
    from vllm_doctor.sources.lines import parse_line

    rule = catalog.rules.get(pred.rule)
    if rule is None:
        return None
    line = parse_line(pred.message, PREDICTED_SOURCE, seq)
    got = match_text(rule, pred.message)
    pattern = got[0] if got else (rule.patterns[0] if rule.patterns else None)
    captures = dict(got[1]) if got else {}
    for key, value in pred.captures.items():
        captures.setdefault(key, value)
    matches = [Match(rule.id, pattern, captures, line, None, frozenset(), seq)] if pattern is not None else []
    finding_facts = as_typed(captures)
    finding_facts["predicted"] = True
    finding_facts.update(pred.facts)
    finding = Finding(rule.id, TITLE_PREFIX + rule.title, pred.severity or rule.severity, pred.confidence,
                      [line], "", facts=finding_facts, priority=rule.priority, first_seq=seq)
    run_remedy(finding, rule, captures, matches, facts, command)
    return finding


def prepare(command_text: str, *, model: str | None = None, snapshot: str | None = None, live: bool = True,
            online: bool = False, vllm_version: str | None = None, nvml: Any = None,
            environ: Any = None) -> tuple[Facts, Any, list[str]]:
    """(facts, command, notices) for `command_text`: the command parsed, its flags as args.* facts, the model's
    config and the GPUs (this machine or a snapshot) gathered. Raises PreflightError on a bad command."""
    from vllm_doctor.command import Command
    from vllm_doctor.facts.gather import gather_facts
    from vllm_doctor.diagnosis.launch import resolve_command

    text = (command_text or "").strip()
    if not text:
        raise PreflightError("give the launch command: vllm-doctor check -- vllm serve MODEL …  (or --cmd \"…\")")
    try:
        command = Command.parse(text)
    except Exception as exc:
        raise PreflightError(f"cannot read the command: {exc}") from None
    if command.shape == "unknown":
        raise PreflightError(f"not a vLLM launch command: {text[:80]!r}")
    if not command.model:
        raise PreflightError("the command names no model (vllm serve MODEL …)")
    facts = Facts()
    if vllm_version:
        if parse_version(vllm_version) is None:
            raise PreflightError(f"--vllm-version {vllm_version!r} is not a version (e.g. 0.11.0)")
        facts.set("vllm.version", vllm_version, "user")
    command = resolve_command(facts, None, text) or command
    notices = gather_facts(facts, model=model or command.model, online=online, live=live, snapshot=snapshot,
                           environ=environ, nvml=nvml) or []
    if not facts.get("model.num_attention_heads"):
        notices.append("model config unknown: head/size and memory checks skipped (pass --model DIR)")
    if not facts.get("gpu.devices"):
        notices.append("no GPU facts (no NVML here, no --facts snapshot): GPU and memory checks skipped")
    return facts, command, notices


def predict(command_text: str, catalog, *, model: str | None = None, snapshot: str | None = None,
            live: bool = True, online: bool = False, vllm_version: str | None = None, nvml: Any = None,
            environ: Any = None, port_probe: Callable[[int], bool | None] | None | str = "auto"):
    """The Diagnosis `check` prints: predicted findings for `command_text` on this machine / a snapshot."""
    from vllm_doctor.findings import Diagnosis

    facts, command, notices = prepare(command_text, model=model, snapshot=snapshot, live=live, online=online,
                                      vllm_version=vllm_version, nvml=nvml, environ=environ)
    if port_probe == "auto":
        port_probe = port_in_use if live and not snapshot else None
    preds, more = Checker(facts, command, port_probe).run()
    notices += more
    findings = [f for i, p in enumerate(preds, 1) if (f := _finding(p, catalog, facts, command, i))]
    findings.sort(key=lambda f: (f.severity == "info", -f.priority, f.first_seq))
    from vllm_doctor.remedies.combine import combine

    diagnosis = Diagnosis(findings, facts, [], command, 0, [PREDICTED_SOURCE], notices)
    diagnosis.combined = combine(findings, command, facts)     # one command for every predicted failure
    return diagnosis


def exit_code(diagnosis) -> int:
    return 1 if any(f.severity != "info" for f in diagnosis.findings) else 0
