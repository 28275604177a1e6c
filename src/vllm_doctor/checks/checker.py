"""The checks of `vllm-doctor check`, one method each, in the order vLLM meets them (the memory checks are
in ``memory_checks``): each computes what vLLM would compute, writes the message vLLM would print and says
whether it could run. ``preflight`` turns their predictions into findings.

Never changes the system: the port is looked up in /proc/net/tcp{,6} (LISTEN sockets), nothing is bound."""
from __future__ import annotations

from typing import Callable

from vllm_doctor.checks.coverage import NO_CONFIG, NO_GPUS, CheckRun, Prediction
from vllm_doctor.checks.cluster_checks import ClusterChecks
from vllm_doctor.checks.memory_checks import MemoryChecks
from vllm_doctor.command.versions import at_least
from vllm_doctor.facts import Facts
from vllm_doctor.facts import gpus
from vllm_doctor.numbers import as_float, as_int
from vllm_doctor.vllm_math.sizing import Sizing, parse_len
from vllm_doctor.vllm_math import memory as mm
from vllm_doctor.vllm_math import parallel as pm

SHM_MIN_BYTES = 512 * mm.MIB     # below this NCCL's shared-memory transport is likely to run out (Docker: 64 MiB)

# --------------------------------------------------------------------------- the checks

def _gib(x: float) -> str:
    return f"{x:.2f}"


class Checker(MemoryChecks, ClusterChecks):
    def __init__(self, facts: Facts, command, port_probe: Callable[[int], bool | None] | None,
                 live: bool = True, no_gpus: str = NO_GPUS) -> None:
        self.facts = facts
        self.live = live                 # the facts are this machine's (its files, its ports)
        self.no_gpus = no_gpus           # why a GPU check cannot run without GPU facts, where they came from
        self.command = command
        self.port_probe = port_probe
        self.out: list[Prediction] = []
        self.notices: list[str] = []
        self.coverage: list[CheckRun] = []
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

    def steps(self) -> list[tuple[str, Callable[[], str | None], bool]]:
        """(label, check, essential) in the order vLLM meets them. A check returns None when it ran (or
        had nothing to look at), else why it could not run; an essential check that could not run makes
        the result "could not check" rather than a green light."""
        multi = self.world * self.dp > 1
        return [("arguments for the vLLM version", self.arguments, True),
                ("argument values in range", self.values, True),
                ("the model path exists", self.model_path, False),
                ("remote code in the checkpoint", self.remote_code, True),
                ("transformers knows the model type", self.transformers, False),
                ("max-model-len vs the model's maximum", self.max_model_len, True),
                ("heads / KV heads / shapes vs tensor parallel", self.tensor_parallel, self.tp > 1),
                ("pipeline parallel support", self.pipeline, False),
                ("a GPU is visible", self.any_gpu, False),
                ("world size vs visible GPUs", self.world_size, multi),
                ("dtype vs compute capability", self.dtype, False),
                ("memory: weights and KV cache per GPU", self.memory, True),
                ("/dev/shm for tensor parallel", self.shm, False),
                ("P2P between the chosen GPUs", self.p2p, False),
                ("API port free", self.port, False)] + self.cluster_steps()

    def run(self) -> tuple[list[Prediction], list[str]]:
        for label, step, essential in self.steps():
            try:
                why = step()
            except Exception as exc:  # one broken check must not cost the others
                why = f"internal error ({type(exc).__name__}: {exc})"
                self.notices.append(f"check {step.__name__} skipped ({type(exc).__name__}: {exc})")
            self.coverage.append(CheckRun(label, why is None, why or "", essential))
        return self.out, self.notices

    # -- arguments ------------------------------------------------------------------------------
    def arguments(self) -> str | None:
        from vllm_doctor.command.argcheck import accepts

        argv = self.command.argv()
        if self.command.shape == "serve":
            argv = ["vllm", "serve"] + argv
        ok, error = accepts(argv, self.version)
        if not self.version:
            self.notices.append("flags checked against the latest vLLM (no --vllm-version, no vLLM installed here)")
        if ok:
            return None
        rule = "cli-unknown-arg" if "unrecognized arguments" in error else "cli-invalid-choice"
        self.add(rule, error, confidence="high" if self.version else "medium",
                 facts={"checked_against": f"vLLM {self.version}" if self.version else "latest vLLM flags"})

    # -- values ---------------------------------------------------------------------------------
    def values(self) -> str | None:
        """--gpu-memory-utilization is a fraction in (0, 1]: pydantic's Field(gt=0, le=1) from 0.11.1,
        CacheConfig's own ValueError before (which had no lower bound)."""
        given = self.facts.get("args.gpu_memory_utilization")
        u = as_float(given) if given is not None else None
        if u is None or 0 < u <= 1:
            return None
        shown = f"{u:g}" if "." in f"{u:g}" or "e" in f"{u:g}" else f"{u:g}.0"
        new = at_least(self.version, "0.11.1") or not self.version       # pydantic's Field(gt=0, le=1)
        if new and u > 1:
            message = f"  Input should be less than or equal to 1 [type=less_than_equal, input_value={shown}, input_type=float]"
        elif new:
            message = f"  Input should be greater than 0 [type=greater_than, input_value={shown}, input_type=float]"
        elif u > 1:
            message = f"ValueError: GPU memory utilization must be less than 1.0. Got {shown}."
        else:
            return None              # older releases took it and ran out of cache blocks later
        self.add("gpu-memory-utilization-too-high", message, {"util": shown},
                 facts={"gpu_memory_utilization": u, "accepted": "0 < u <= 1"})
        return None

    # -- model path -----------------------------------------------------------------------------
    def model_path(self) -> str | None:
        """A local path (absolute, ./, ../, ~) that is not there: vLLM reads it as a hub id and fails."""
        import os

        model = str(self.command.model or "")
        if not model.startswith(("/", "./", "../", "~")):
            return None                  # a hub id: only the hub (--online) or the cache can say
        if not self.live:
            return "the facts describe another machine: its files are not here"
        if self.command.shape not in ("serve", "module"):
            return "the path is inside the container"
        if os.path.exists(os.path.expanduser(model)):
            return None
        self.add("model-not-found", f"ValueError: Invalid repository ID or local directory specified: '{model}'.",
                 {"model": model}, facts={"model_path": model, "seen": "no such file or directory here"})
        return None

    # -- remote code ----------------------------------------------------------------------------
    def remote_code(self) -> str | None:
        if self.facts.get("model.needs_remote_code") is None:      # no config.json read, no table row
            return NO_CONFIG
        if not self.facts.get("model.needs_remote_code") or self.command.has("--trust-remote-code"):
            return None
        model = str(self.command.model or self.facts.get("model.path"))
        # transformers' message, as vLLM 0.32 logs it from repo_utils.py
        self.add("trust-remote-code",
                 f"Error parsing config for {model}: The repository {model} contains custom code which must be "
                 f"executed to correctly load the model. You can inspect the repository content at {model} .",
                 {"model": model}, facts={"auto_map": "config.json has an auto_map and transformers has no "
                                                      f"native class for model_type {self.shape.model_type!r}"})
        return None

    # -- transformers ---------------------------------------------------------------------------
    def transformers(self) -> str | None:
        from vllm_doctor.facts.model import VLLM_OWN_CONFIGS, transformers_knows

        model_type = self.shape.model_type
        if not model_type:
            return NO_CONFIG
        if self.facts.get("model.has_auto_map") or model_type in VLLM_OWN_CONFIGS:
            return None
        known, version = transformers_knows(str(model_type))
        if known is None:
            return "transformers is not installed here"
        if known:
            return None
        self.add("transformers-too-old",
                 f"ValueError: The checkpoint you are trying to load has model type `{model_type}` but Transformers "
                 f"does not recognize this architecture. This could be because of an issue with the checkpoint, or "
                 f"because your version of Transformers is out of date.",
                 {"model_type": str(model_type)}, confidence="medium",
                 facts={"transformers_version": version,
                        "checked_against": f"transformers {version} installed here (the server's may differ)"})
        return None

    # -- max model len --------------------------------------------------------------------------
    def max_model_len(self) -> str | None:
        user = parse_len(self.facts.get("args.max_model_len"))
        derived = self.shape.derived_max_len
        env = self.command.env if hasattr(self.command, "env") else {}
        if user and not derived:
            return NO_CONFIG
        if not user or not derived or user <= derived or env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
            return None
        key = self.shape.derived_max_len_key or "max_position_embeddings"
        self.add("max-model-len-too-large",
                 f"ValueError: User-specified max_model_len ({user}) is greater than the derived max_model_len "
                 f"({key}={derived} or model_max_length=None in model's config.json).",
                 {"max_model_len": str(user), "key": key, "derived": str(derived)})

    # -- tensor parallel ------------------------------------------------------------------------
    def tensor_parallel(self) -> str | None:
        heads = self.shape.heads
        if self.tp == 1:
            return None
        if not heads:
            return NO_CONFIG
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
    def pipeline(self) -> str | None:
        if self.pp == 1:
            return
        if not pm.pp_supported(self.version):
            self.add("pp-unsupported", "NotImplementedError: Pipeline parallelism is not supported yet.",
                     facts={"vllm_version": self.version})
        else:
            self.notices.append("pipeline support of this architecture not checked (needs vLLM's model registry)")

    # -- any GPU --------------------------------------------------------------------------------
    def any_gpu(self) -> str | None:
        """NVML (here or in the snapshot) answered: no driver loaded, or no device. NVML's library missing
        is no answer (a laptop checking for a server): unknown."""
        count = as_int(self.facts.get("gpu.count"))
        error = str(self.facts.get("gpu.nvml_error") or "")
        if self.facts.get("args.device") == "cpu":
            return None
        if error.startswith("no NVIDIA driver loaded"):
            # torch's message when the kernel module is missing
            self.add("no-gpu", "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
                     "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
                     confidence="medium", facts={"seen": error})
            return None
        if count is None or error:
            return self.no_gpus
        if count == 0:
            self.add("no-gpu", "RuntimeError: No CUDA GPUs are available", confidence="medium",
                     facts={"gpu_count": 0, "seen": f"{self.facts.source('gpu.count') or 'facts'} counts no GPU"})
        return None

    # -- world size -----------------------------------------------------------------------------
    def world_size(self) -> str | None:
        count = as_int(self.facts.get("gpu.count"))
        if count is None or self.facts.get("gpu.nvml_error"):
            return self.no_gpus if self.world * self.dp > 1 else None
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
    def dtype(self) -> str | None:
        if not self.chosen:
            return self.no_gpus
        if self.sizing.load_dtype() != "bfloat16":
            return None
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

    # -- /dev/shm -------------------------------------------------------------------------------
    def shm(self) -> str | None:
        if self.world < 2:
            return None
        if self.command.shape in ("docker", "compose"):
            opts = {k.lstrip("-").replace("_", "-"): v for k, v in (self.command.docker_options() or {}).items()}
            if "ipc" in opts or "shm-size" in opts:
                return None
            self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                     "(size 9637888)", {"shm_path": "/dev/shm/nccl-XXXXXX", "shm_size": "9637888"},
                     confidence="medium", facts={"reason": "container started without --ipc=host or --shm-size: "
                                                           "Docker's default /dev/shm is 64 MiB"})
            return None
        total = as_int(self.facts.get("env.shm_total_bytes"))
        if self.facts.get("env.in_container") and total is not None and total < SHM_MIN_BYTES:
            self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-XXXXXX "
                     "(size 9637888)", {"shm_path": "/dev/shm/nccl-XXXXXX", "shm_size": "9637888"},
                     confidence="medium",
                     facts={"reason": f"in a container with /dev/shm {mm.fmt_bytes(total)} "
                                      f"(< {mm.fmt_bytes(SHM_MIN_BYTES)}) for tp x pp = {self.world}"})

    # -- P2P ------------------------------------------------------------------------------------
    def p2p(self) -> str | None:
        if self.tp < 2:
            return None
        if len(self.chosen) < 2:
            return self.no_gpus
        p2p = self.facts.get("gpu.p2p")
        matrix = (p2p.get("read") or p2p.get("write")) if isinstance(p2p, dict) else p2p
        if not isinstance(matrix, list):
            return "no P2P facts for these GPUs"
        idx = [i for i in range(min(self.tp, len(matrix)))]
        bad = [f"{i}-{j}" for i in idx for j in idx if i < j and j < len(matrix[i])
               and str(matrix[i][j]) not in ("OK", "True", "true", "1", "?")]
        if not bad or self.command.has("--disable-custom-all-reduce"):
            return None
        self.add("nccl-p2p",
                 "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed. "
                 "To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                 confidence="low", severity="info",
                 facts={"pairs_without_p2p": bad,
                        "impact": "vLLM turns custom all-reduce off by itself; all-reduce goes through NCCL "
                                  "(slower, not a start-up failure)"})

    # -- port -----------------------------------------------------------------------------------
    def port(self) -> str | None:
        if self.port_probe is None:
            return "not probed (the facts describe another machine)"
        port = as_int(self.facts.get("args.port")) or 8000
        if self.port_probe(port):
            host = str(self.command.get("--host") or "0.0.0.0")
            self.add("port-in-use",
                     f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): "
                     f"address already in use", {"errno": "98", "host": host, "port": str(port)},
                     confidence="high", facts={"port": port, "seen": "a socket listens on it (/proc/net/tcp)"})
