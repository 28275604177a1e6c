"""Facts the log itself reveals: vLLM version, launch arguments, the launch command, memory and KV lines,
and the start-up milestones reached (used to tell a load-time OOM from a runtime one)."""
from __future__ import annotations

import regex

from vllm_doctor.command.fromargs import is_cut, parse_args_repr
from vllm_doctor.facts import Facts
from vllm_doctor.numbers import MAX_DIGITS, parse_float, parse_int


class LazyPattern:
    """A regex compiled when first used: these ~25 cost ~8 ms to compile, and a log meets the literal
    of only a few of them. Anything a compiled pattern has (search, match, findall, ...) is its own."""

    def __init__(self, source: str) -> None:
        self.pattern = source

    def __getattr__(self, name: str):
        if name.startswith("__"):          # copy/pickle protocol look-ups: not the pattern's
            raise AttributeError(name)
        value = getattr(regex.compile(self.pattern), name)
        setattr(self, name, value)         # kept: the next call goes straight to the compiled pattern
        return value


SOURCE = "log"
LONG_DIGITS = regex.compile(r"\d{%d}" % (MAX_DIGITS + 1))
# (literal, regex, fact keys in group order, converter). Literals feed the scanner's prefilter. A converter
# returns None for what is no number (too many digits, `nan`): the fact stays unknown.
_NUM = parse_float
# the launch's banner: `vLLM API server version X`, or the logo of newer releases with the version beside it
BANNER_VERSION = LazyPattern(r"vLLM API server version (\S+)")
LOGO_VERSION = LazyPattern(r"[█▀▄]\s+version (\d+\.\d+\S*)\s*$")
EXTRACTORS: list[tuple[str, LazyPattern, tuple[str, ...], object]] = [
    ("vLLM API server version", BANNER_VERSION, ("vllm.version",), str),
    ("vLLM server version", LazyPattern(r"vLLM server version (\S+?),? serving model (\S+)"),
     ("vllm.version", "args.model"), str),
    ("  version ", LOGO_VERSION, ("vllm.version",), str),
    ("  model ", LazyPattern(r"[█▀▄]\s+model\s+(\S+)\s*$"), ("args.model",), str),
    ("LLM engine (v", LazyPattern(r"LLM engine \(v(\S+?)\) with config"), ("vllm.version",), str),
    ("Using max model len", LazyPattern(r"Using max model len (\d+)"), ("log.max_model_len",), parse_int),
    ("Model loading took", LazyPattern(r"Model loading took ([\d.]+) Gi?B"), ("log.weights_gib",), _NUM),
    ("Loading model weights took", LazyPattern(r"Loading model weights took ([\d.]+) GB"),
     ("log.weights_gib",), _NUM),
    ("Available KV cache memory", LazyPattern(r"Available KV cache memory: (-?[\d.]+) GiB"),
     ("log.kv_cache_gib",), _NUM),
    ("KV cache size:", LazyPattern(r"KV cache size: ([\d,]+) tokens"), ("log.kv_cache_tokens",),
     parse_int),
    ("Maximum concurrency for", LazyPattern(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
     ("log.max_model_len", "log.max_concurrency"), parse_float),
    (" blocks: ", LazyPattern(r"# (?:GPU|CUDA|cuda) blocks: (\d+)"), ("log.gpu_blocks",), parse_int),
    ("total_gpu_memory", LazyPattern(r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization \(([\d.]+)\)"),
     ("log.total_gpu_gib", "log.gpu_memory_utilization"), _NUM),
    ("reserved for KV Cache is", LazyPattern(r"reserved for KV Cache is (-?[\d.]+) ?GiB"),
     ("log.kv_cache_gib",), _NUM),
    ("model weights take", LazyPattern(r"model weights take ([\d.]+) ?GiB"), ("log.weights_gib",), _NUM),
    # ray.init joining a running cluster (ray/_private/worker.py): the address its nodes know the head by
    ("existing Ray cluster at address", LazyPattern(r"Connecting to existing Ray cluster at address: \[?([0-9A-Fa-f.:]{3,45}?)\]?:\d{1,5}\b"),
     ("log.ray_address",), str),
    # `ray status` pasted into the log: the cluster's GPUs under `Total Usage:` (`0.0/1.0 GPU`)
    (" GPU", LazyPattern(r"^\s{0,8}\d{1,6}(?:\.\d{1,4})?/(\d{1,6}(?:\.\d{1,4})?) GPU\s*$"), ("log.ray_cluster_gpus",), _NUM),
    # a Python frame under macOS's home directories or its framework / Homebrew Pythons: the log is a Mac's
    ('File "/Users/', LazyPattern(r'^\s*File "(/Users/)[^/"]{1,64}/'), ("log.os",), lambda _: "macOS"),
    ('File "/opt/homebrew/', LazyPattern(r'^\s*File "(/opt/homebrew/)'), ("log.os",), lambda _: "macOS"),
    ("Python.framework/", LazyPattern(r'^\s*File "(/Library/Frameworks/Python\.framework/)'), ("log.os",),
     lambda _: "macOS"),
    # a Python frame on a drive (`File "D:\…\vllm\entrypoints\cli\serve.py"`): native Windows (vllm#14813)
    (':\\', LazyPattern(r'^\s*File "([A-Za-z]:)\\'), ("log.os",), lambda _: "Windows"),
    # Python's getpass.getuser() under a UID with no passwd entry (an arbitrary container UID): refine/install_env.py
    ("getpwuid(): uid not found", LazyPattern(r"getpwuid\(\): uid not found: (\d{1,12})"), ("log.uid_without_user",),
     parse_int),
    # vLLM's own count of the cluster before it asks Ray for the group (executor/ray_utils.py, 0.4-0.8): the cluster
    # has fewer GPUs than the group needs (`The number of required GPUs exceeds the total number of available GPUs in
    # the placement group.`). Not 0.11+'s `Tensor parallel size (16) exceeds available GPUs (8)`: initialize_ray_cluster
    # counts the driver's own GPUs (cuda_device_count_stateless) before it joins Ray, so on several nodes it is said
    # whatever the cluster holds (real t402: two nodes of one GPU each, TP 2).
    ("exceeds the total number of available GPUs", LazyPattern(r"(required GPUs exceeds the total number of available GPUs)"),
     ("log.ray_gpus_short",), bool),
    # torch's range check (torch/cuda/__init__.py _check_capability, 2.8-2.10): the build's range, on the line after
    # `Minimum and Maximum cuda capability supported by this version of PyTorch is`; refine/torch_arch.py reads
    # whether the GPU runs the kernels of its ends
    (") - (", LazyPattern(r"(?:^\s*|PyTorch is\s+)\((\d{1,2}\.\d{1,2})\) - \((\d{1,2}\.\d{1,2})\)\s*$"),
     ("log.torch_cc_min", "log.torch_cc_max"), str),
    ("Automatically detected platform", LazyPattern(r"Automatically detected platform (\w+)"), ("log.platform",), str),
    # an out-of-tree platform (vllm/platforms/__init__.py: `Platform plugin %s is activated`): Ascend, MetaX, Spyre ...
    ("Platform plugin", LazyPattern(r"Platform plugin (\w+) is activated"), ("log.platform_plugin",), str),
    # platforms/__init__.py vllm_version_matches_substr (0.8+): importlib finds no distribution named "vllm" (a fork
    # installed as vllm-pascal, a source tree on PYTHONPATH); the CUDA and CPU plugins' checks raise on it, so no
    # platform is detected on a host whose GPUs work (refine/no_gpu.py)
    ("The vLLM package was not found", LazyPattern(r"(The vLLM package was not found, so its version could not be)"),
     ("log.vllm_unnamed",), bool),
    # 0.32's engine-config line names the device where no "detected platform" line is printed (CPU builds)
    ("device_config=", LazyPattern(r"device_config=(\w+)"), ("log.platform",), str),
    ("Resolved architecture", LazyPattern(r"Resolved architecture: (\S+)"), ("log.architecture",), str),
    ("for distributed inference", LazyPattern(r"Defaulting to use (\w+) for distributed inference"),
     ("log.distributed_backend",), str),
    # a script that sets CUDA_VISIBLE_DEVICES itself (too late if CUDA was already initialised)
    ("os.environ[", LazyPattern(r"os\.environ\[\s*[\"']CUDA_VISIBLE_DEVICES[\"']\s*\]\s*=\s*[\"']([^\"']*)"),
     ("log.cvd_set_in_code",), str),
    ("NCCL version", LazyPattern(r"NCCL version ([\d.]+\S*)"), ("log.nccl_version",), str),
    # what an import could not find: the registry's inspection subprocess prints it (its stderr, 0.6; the
    # wrapped RuntimeError's text, 0.7+) above `Error in inspecting model architecture`
    ("No module named '", LazyPattern(r"^(?:ModuleNotFoundError|ImportError): No module named '([A-Za-z_][\w.]{0,100})'"),
     ("log.missing_module",), str),
]
# NCCL's own line prefix names the host (`gpu-node-3:2201:2201 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>`);
# the bootstrap line also names the node's address. Used to tell whether a saved log was written here.
# NCCL's debug prefix (src/debug.cc): `host:pid:tid [dev] NCCL INFO`, WARN lines with `file:line` (2.x), with the
# function after it (`transport/shm.cc:12 (shmAllocate) NCCL WARN`, 2.30+) and a timestamp before the host by
# default (`[2025-03-01 10:00:00] `, NCCL_DEBUG_TIMESTAMP_LEVELS, 2.26+)
NCCL_HOST = LazyPattern(r"^(?:\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*\] )?([A-Za-z0-9][\w.\-]*):\d+:\d+ \[\d+\] "
                        r"(?:\S+:\d+ (?:\([\w:~<>]{1,80}\) )?)?NCCL (?:INFO|WARN)")
NCCL_BOOTSTRAP_IP = LazyPattern(r"NCCL INFO Bootstrap ?: Using \w[\w.\-]*:(\d+\.\d+\.\d+\.\d+)")
HOST_LITERALS = ("NCCL INFO Bootstrap", " NCCL WARN ")
# Engine-config dump fields (printed once the config validated).
CONFIG_DUMP = LazyPattern(r"\b(model|tensor_parallel_size|pipeline_parallel_size|data_parallel_size|max_seq_len|"
                            r"dtype|quantization|kv_cache_dtype|enforce_eager|trust_remote_code)=('[^']*'|[\w.]+)")
DUMP_KEYS = {"max_seq_len": "max_model_len"}

MILESTONES: list[tuple[str, str]] = [
    ("Starting to load model", "weights_loading"), ("while processing method load_model", "weights_loading"),
    ("Using model weights format", "weights_loading"),
    # vLLM's own wrappers of an error while creating the weights (the OOM on the same line is a load OOM)
    ("Failed to create unquantized linear weights", "weights_loading"), ("Loading weights", "weights_loading"),
    ("Loading safetensors checkpoint shards", "weights_loading"), ("Loading pt checkpoint shards", "weights_loading"),
    ("Model loading took", "weights_loaded"), ("Loading model weights took", "weights_loaded"),
    ("Loading weights took", "weights_loaded"), ("model weights take", "weights_loaded"),
    ("Available KV cache memory", "kv_cache_sized"), (" blocks: ", "kv_cache_sized"), ("KV cache size:", "kv_cache_sized"),
    ("reserved for KV Cache is", "kv_cache_sized"),
    ("Capturing cudagraphs", "graph_capture"), ("Capturing the model for CUDA graphs", "graph_capture"),
    ("Capturing CUDA graph", "graph_capture"), ("Graph capturing finished", "engine_ready"),
    ("init engine (profile, create kv cache", "engine_ready"),
    ("Application startup complete", "server_ready"), ("Uvicorn running on", "server_ready"),
    ("Starting vLLM API server", "server_ready"), ("Available routes are", "server_ready"),
    # vLLM's own word that it launched or serves (uvicorn's lines above are any ASGI app's: a wrapper's fallback
    # server prints them too); the engine asks these to tell vLLM coming up again after a failure
    ("Starting vLLM API server", "vllm_ready"), ("Available routes are", "vllm_ready"),
    ("vLLM API server version", "launched"), ("non-default args:", "launched"), ("args: Namespace(", "launched"),
    # the server at work: the periodic stats line (v0 engine/metrics.py, v1 loggers.py: "Avg prompt throughput:
    # %.1f tokens/s, ...") and uvicorn's access log; a paste may start here, long after the start-up
    ("Avg prompt throughput:", "serving"),
]
# uvicorn's access log (uvicorn/logging.py AccessFormatter: `%(client_addr)s - "%(request_line)s" %(status_code)s`,
# `INFO:     127.0.0.1:41542 - "POST /v1/completions HTTP/1.1" 200 OK`): the HTTP server answered a request, so it
# was up. No proof the engine progresses (a status poll is answered while it hangs): milestone `http_served`
# only says the start-up was over. urllib3's client lines (`https://huggingface.co:443 "GET /api/… HTTP/1.1" 200`)
# have no ` - ` before the request line.
ACCESS_LITERAL = " HTTP/1."
ACCESS_LINE = LazyPattern(r'\S:\d{1,5} - "(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) /\S{0,2000} HTTP/1\.[01]" \d{3}\b')
# Lines printed only because the server got SIGINT/SIGTERM (diagnosis/outcome.py says where each comes from);
# "utting down FastAPI HTTP server" is 0.6-0.21's "Shutting down …" and 0.23+'s "[shutdown] … shutting down …".
# The engine core's line counts for SIGINT only: vLLM's own process manager stops it with SIGTERM after a failure.
STOP_MARKERS = ("utting down FastAPI HTTP server", "[shutdown] API server: shutdown triggered",
                "[shutdown] EngineCore: trigger received signal=SIGINT",
                "Received KeyboardInterrupt, shutting down API servers")
MAX_STOPS = 8
ARGS_MARKS = ("non-default args:", "args: Namespace(")     # the launch arguments, as a dict or a Namespace repr
ARGS_LITERALS = ARGS_MARKS + ("with config: ",)
COMMAND_WORDS = ("vllm ", "python", "docker ", "podman ", "sudo ", "env ", "CUDA_", "NCCL_", "VLLM_", "HF_",
                 "OMP_", "TRANSFORMERS_", "PYTORCH_", "TORCH_", "RAY_", "HUGGING", "LD_PRELOAD", "uv ", "nohup ",
                 "time ", "timeout ")

# A `vllm collect-env` block pasted in the log: every line of it is kept (it carries no literal).
COLLECT_ENV_MARKERS = ("Collecting environment information", "PyTorch version:")
COLLECT_ENV_MAX_LINES = 400

# argparse's `usage: vllm serve [-h] [--host HOST] …`, wrapped onto indented lines: the options the installed
# parser has, whatever its version (an argparse failure comes before vLLM logs its version)
USAGE_MARK = "usage: "
USAGE_MAX_LINES = 400
# a parser's whole option list, not the top-level `usage: vllm [-h] [-v] {chat,serve,…}` of its sub-commands
USAGE_MIN_OPTIONS = 10
USAGE_OPTION = regex.compile(r"\[(--?[A-Za-z][\w.-]{0,80})")

# A wrapper script's own log of the command it runs (`… - INFO - Command: python -m vllm.entrypoints.openai.api_server
# --model …`, `Running: vllm serve …`): taken only when it is a vLLM launch with flags
LOGGED_COMMAND_MARKS = ("ommand: ", "CMD: ", "cmd: ", "Running: ", "Executing: ", "Launching: ")
LOGGED_COMMAND = regex.compile(r"(?:[Cc]ommand|CMD|cmd|Running|Executing|Launching): +(?P<cmd>\S.{0,4000})$")

# `$ vllm serve …` at the top of a log. A bare "$ " literal would cost the prefilter 5x its speed.
COMMAND_LITERALS = {f"$ {word}" for word in COMMAND_WORDS + (
    "uv ", "nohup ", "bash ", "./", "time ", "timeout ", "OMP_", "TRANSFORMERS_", "PYTORCH_", "TORCH_", "RAY_",
    "HUGGING", "LD_PRELOAD")}
LITERALS = sorted({x[0] for x in EXTRACTORS} | {m[0] for m in MILESTONES} | set(STOP_MARKERS) | {"^C", ACCESS_LITERAL}
                  | {USAGE_MARK} | set(LOGGED_COMMAND_MARKS)
                  | set(ARGS_LITERALS) | COMMAND_LITERALS
                  | set(COLLECT_ENV_MARKERS) | set(HOST_LITERALS))


def logged_command(message: str) -> str | None:
    """The vLLM launch a wrapper logged with a label (`Command: vllm serve m --port 8000`); None else."""
    m = LOGGED_COMMAND.search(message)
    if m is None:
        return None
    cmd = m.group("cmd").strip()
    vllm = cmd.startswith("vllm serve ") or " vllm serve " in cmd or "-m vllm.entrypoints." in cmd
    return cmd if vllm and cmd.startswith(COMMAND_WORDS) and " --" in cmd else None


def launch_command(raw: str) -> str | None:
    """The command of a `$ vllm serve …` line at a prompt (a script counts when it calls LLM(…)); None else."""
    if not raw.startswith("$ "):
        return None
    cmd = raw[2:].strip()
    return cmd if cmd.startswith(COMMAND_WORDS) or " vllm" in cmd or "LLM(" in cmd else None


def logged_args(message: str) -> tuple[dict, bool] | None:
    """The launch arguments of a `non-default args: {…}` or `args: Namespace(…)` line, and whether the
    repr was cut short (then only its whole pairs are in the dict); None for any other line."""
    if "non-default args:" in message:
        text = message.split("non-default args:", 1)[1]
    elif "args: Namespace(" in message:
        text = "Namespace(" + message.split("args: Namespace(", 1)[1].strip()
    else:
        return None
    return parse_args_repr(text), is_cut(text)


class LogFacts:
    """Collects facts from lines as they stream by."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.milestones: set[str] = set()
        self.last_seen: dict[str, int] = {}   # milestone -> sequence number of its latest line
        self.first_seen: dict[str, int] = {}  # ... and of its first
        self.stops: list[int] = []            # lines that show a stop signal (STOP_MARKERS, a typed ^C), the first few
        self.args: dict = {}             # the launch arguments as vLLM printed them
        self.args_cut = False            # ... in a repr the log cut short (only its whole pairs are kept)
        self.command_line: str | None = None
        self.node_ips: set[str] = set()
        self.hostnames: set[str] = set()
        self.collect_env: list[str] = []
        self._collecting = 0         # lines of a collect-env block still to keep
        self.usage_flags: set[str] = set()
        self._usage = 0              # lines of an argparse usage block still to read

    def _reached(self, milestone: str, seq: int) -> None:
        self.milestones.add(milestone)
        self.last_seen[milestone] = seq
        self.first_seen.setdefault(milestone, seq)

    @property
    def busy(self) -> bool:
        return self._collecting > 0 or self._usage > 0

    def feed(self, raw: str, message: str, ip: str | None = None, seq: int = 0, node: str | None = None) -> None:
        """`node`: the node that printed the line (events/nodes.py; None: one machine), whose facts they are."""
        if ip:
            self.node_ips.add(ip)
        if self._collecting:
            self._collecting -= 1
            self.collect_env.append(raw)
            return
        if self._usage or message.startswith(USAGE_MARK):
            if self._read_usage(message):
                return
        if not self.collect_env and message.startswith(COLLECT_ENV_MARKERS):
            self.collect_env.append(raw)
            self._collecting = COLLECT_ENV_MAX_LINES
            return
        if raw.startswith("$ ") and self.command_line is None:
            cmd = launch_command(raw)
            if cmd:
                self.command_line = cmd
                self.facts.set("launch.command", cmd, SOURCE)
            return
        if self.command_line is None and any(mark in message for mark in LOGGED_COMMAND_MARKS):
            cmd = logged_command(message)
            if cmd:
                self.command_line = cmd
                self.facts.set("launch.command", cmd, SOURCE)
        if "NCCL " in message and ("NCCL INFO Bootstrap" in message or " NCCL WARN " in message):
            self._host(message)
        for literal, name in MILESTONES:
            if literal in message:
                self._reached(name, seq)
        if ACCESS_LITERAL in message and ACCESS_LINE.search(message):
            self._reached("http_served", seq)
        if len(self.stops) < MAX_STOPS and (raw.startswith("^C") or any(m in message for m in STOP_MARKERS)):
            self.stops.append(seq)
        for literal, pattern, keys, convert in EXTRACTORS:
            if literal in message:
                m = pattern.search(message)
                if m:
                    for key, value in zip(keys, m.groups()):
                        value = None if value is None else convert(value)
                        if key == "vllm.version" and value is not None and LONG_DIGITS.search(value):
                            continue       # `0.99…9` (5000 digits) is no release: every version compare would raise
                        if value is not None:
                            self.facts.set(key, value, SOURCE, node=node)
        logged = logged_args(message) if not self.args else None
        if logged is not None:
            args, self.args_cut = logged
            self._set_args(args)
        elif "with config: " in message:
            for key, value in CONFIG_DUMP.findall(message.split("with config: ", 1)[1]):
                value = value.strip("'")
                if key == "dtype":
                    value = value.replace("torch.", "")
                name = DUMP_KEYS.get(key, key)
                number = parse_int(value)
                value = value if number is None else number
                self.facts.set(f"args.{name}" if name != "max_model_len" else "log.max_model_len", value, SOURCE,
                               node=node)

    def _read_usage(self, message: str) -> bool:
        """The options of an argparse usage block (its `usage:` line and the indented lines that continue it);
        False once a line is no part of it."""
        if self._usage and not (message[:1].isspace() and "[" in message):
            self._usage = 0
            return False
        self._usage = USAGE_MAX_LINES if message.startswith(USAGE_MARK) else self._usage - 1
        self.usage_flags.update(USAGE_OPTION.findall(message))
        return True

    def finish(self) -> None:
        """Facts from a pasted collect-env block and an argparse usage, as facts of the log."""
        if len(self.usage_flags) >= USAGE_MIN_OPTIONS:
            self.facts.set("log.usage_flags", sorted(self.usage_flags), SOURCE)
        if not self.collect_env:
            return
        from vllm_doctor.facts.collect_env import find_collect_env_block, parse_collect_env

        block = find_collect_env_block(self.collect_env)
        if block:
            for key, value in parse_collect_env(block).items():
                self.facts.set(key, value, SOURCE)

    def publish_hosts(self) -> None:
        """The hosts and addresses the log names, as facts (facts.origin asks them before enrichment)."""
        if self.node_ips:
            self.facts.set("log.node_ips", sorted(self.node_ips), SOURCE)
        if self.hostnames:
            self.facts.set("log.hostnames", sorted(self.hostnames), SOURCE)

    def _host(self, message: str) -> None:
        m = NCCL_HOST.match(message)
        if m:
            self.hostnames.add(m.group(1))
        m = NCCL_BOOTSTRAP_IP.search(message)
        if m:
            self.node_ips.add(m.group(1))

    def _set_args(self, args: dict) -> None:
        self.args = args
        for key, value in args.items():
            if key == "model_tag":
                key = "model"
            if isinstance(value, (str, int, float, bool)):
                self.facts.set(f"args.{key}", value, SOURCE)
