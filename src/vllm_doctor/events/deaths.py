"""Who died first, as the processes that noticed say it: the lines that name a victim (vLLM's executor and
engine client, Ray's actor, task and raylet messages, Ray's OOM killer), a peer that closed its connection,
and what a death's exit signal means. events/nodes.py orders them per node.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# libstdc++'s verbose terminate handler (`terminate called after throwing an instance of 'c10::DistBackendError'`):
# an uncaught C++ exception aborts the process (SIGABRT)
ABORTED = "terminate called after throwing"
# A process dying, whatever the line's level (rules/_wrappers.toml makes these lines candidates): a signal as
# Python's faulthandler and Ray's/absl's handlers print it, a failed C++ check, an abort, Ray's OOM killer
# killing a worker on the node it names
RAY_OOM_WORDS = "Memory on the node (IP:"      # Ray's OOM killer killed a worker there (host memory)
CRASH_WORDS = ("*** SIG", "Fatal Python error", "Check failed", ABORTED, RAY_OOM_WORDS)
# A hosting platform's report that the container's function failed, whatever the line before it said: Modal's
# runner (`Runner failed with exception: Runner has been initializing for too long: 300 seconds` when the start-up
# outlives the platform's timeout, `… ModuleNotFoundError(…)`). Its `Runner has been shutting down for too long` is a
# stop that outlived its grace period, not a failure.
PLATFORM_FAILED = "Runner failed with exception: "
PLATFORM_STOP = "Runner has been shutting down"


def platform_failed(message: str) -> bool:
    """The line is a hosting platform's report that the container failed (PLATFORM_FAILED), not in a stop."""
    return message.lstrip().startswith(PLATFORM_FAILED) and PLATFORM_STOP not in message


# A native compiler's fatal error while vLLM, Triton or FlashInfer JIT-compiles a kernel (`ptxas fatal   : Value
# 'sm_121a' is not defined for option 'gpu-name'`, `nvcc fatal   : Unsupported gpu architecture 'compute_120a'`):
# the kernel does not exist. A failure where the run went no further; the same line before a fallback that
# served (vllm#44985's all-reduce) is none.
TOOL_FATAL = ("ptxas fatal", "nvcc fatal")
RAY_OOM_NODE = re.compile(r"Memory on the node \(IP: ([0-9A-Fa-f.:]{3,45})[,)]")   # Ray's OOM killer's message
# ... and the task it killed: `where the task (actor ID: …, name=RayWorkerWrapper.__init__, pid=13378, …` (the newest
# Ray says `where the lease (lease ID: …, name=WorkerDict.__init__, pid=…`)
RAY_OOM_TASK = re.compile(r"where the (?:task|lease) \([^)]{0,120}?name=(\w{1,64})[\w.]{0,64}, pid=(\d{1,10})")
# A line that names the process that died, whoever printed it: the victim failed first, the printer noticed.
# vLLM's executor (`Worker proc VllmWorker-1 died unexpectedly`, 0.8-0.33; multiprocessing names its workers
# `VllmWorker-{rank}`), its engine client (`Engine core proc EngineCore_DP1 died unexpectedly`,
# `Engine core process EngineCore_DP1 died unexpectedly.`, `Process VllmWorker-1 (PID: 7) died with exit
# code -9`), its Ray executor (`RayWorkerProc rank=1 died unexpectedly`, 0.32+) and V0's worker monitor
# (executor/multiproc_worker_utils.py 0.4.3-0.10, only for a non-zero exit code: `Worker VllmWorkerProcess pid
# 1558516 died, exit code: -15`).
DEATH = re.compile(r"(?:Worker proc|Engine core proc(?:ess)?|Process) (?P<name>[\w.-]{1,64})(?: \(PID: (?P<pid>\d+)\))? died"
                   r"|(?P<ray>RayWorkerProc) rank=(?P<rank>\d+) died"
                   r"|Worker (?P<v0name>[\w.-]{1,64}) pid (?P<v0pid>\d{1,10}) died, exit code")
# ... and how it died, where the line says (0.32+, V0's monitor): a negative exit code is the signal that killed it
EXIT_CODE = re.compile(r"died (?:unexpectedly \(exit code: |with exit code )(-?\d{1,4})|died, exit code: (-?\d{1,4})")
# SIGINT and SIGTERM stop a process: a death by them is a stop (Ctrl-C, `docker stop`, a pod's end), not a crash
STOP_SIGNALS = (2, 15)
# torchrun's agent names the worker that failed first (torch/distributed/elastic/multiprocessing/api.py, torch
# 1.9-2.13): `failed (exitcode: -9) local_rank: 3 (pid: 44713) of binary: /usr/bin/python3` (`of fn: main`)
TORCHRUN_WORDS = "(exitcode: "
TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d{1,4})\) local_rank: (?P<local>\d{1,5}) "
                             r"\(pid: (?P<pid>\d{1,10})\) of (?:binary|fn)")
# ... and its ChildFailedError's table (errors/__init__.py, _FAILURE_FORMAT_TEMPLATE, torch 1.10-2.13), the
# first observed failure on lines of their own after this one: `  rank      : 3 (local_rank: 3)`,
# `  exitcode  : -9 (pid: 44713)`, `  host      : node-2`
ROOT_CAUSE = "Root Cause (first observed failure):"
TABLE_FIELD = re.compile(r"^\s*(?:(time|host|rank|exitcode|error_file|traceback)\s*: ?(.{0,256})|\[\d{1,6}\]:\s*)$")
TABLE_RANK = re.compile(r"(\d{1,6}) \(local_rank: (\d{1,5})\)")
TABLE_EXIT = re.compile(r"(-?\d{1,4}) \(pid: (\d{1,10})\)")
# The API server's start-up wait names the engine cores that exited, with their exit codes (utils.py, 0.9+):
# `Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP1': -9}`
FAILED_CORE = re.compile(r"Failed core proc\(s\): \{'(?P<name>[\w.-]{1,64})': (?P<code>-?\d{1,4}|None)")
# A shell's report of its child killed by a signal (bash's job status, strsignal's words): `Killed` (SIGKILL: most
# often the kernel's OOM killer), `Segmentation fault (core dumped)`, `Aborted (core dumped)`, alone on a line
# (an interactive shell), after a job number (`[1]+  Killed  vllm serve …`) or a script's `line N: PID` (`./run.sh:
# line 3: 4242 Killed  python -m …`). SIGINT's and SIGTERM's (`Interrupt`, `Terminated`) are a stop's.
# zsh says it in its own words (Src/signames2.awk's table), lower-case: `zsh: killed     python …` for a foreground
# job, `[1]    842586 bus error  python3 …` for a background one (vllm#4077: a corrupt libnccl).
SHELL_WORDS = ("Killed", "core dumped", "Segmentation fault", "zsh: ", "killed", "segmentation fault", "bus error")
SHELL_DEATH = re.compile(r"^(?:\[\d{1,4}\][+-]?\s{1,8}|\S{1,200}: line \d{1,6}: {1,8}\d{1,10} )?"
                         r"(?P<what>Killed|Segmentation fault|Aborted|Bus error|Illegal instruction|"
                         r"Floating point exception)(?: \(core dumped\))?(?:\s{2,}\S.{0,500})?\s*$")
ZSH_DEATH = re.compile(r"^(?:zsh: |\[\d{1,4}\][+-]?\s{1,8}\d{1,10} )(?P<what>killed|segmentation fault|bus error|abort|"
                       r"illegal hardware instruction|floating point exception)(?: \(core dumped\))?\s{1,40}\S.{0,500}$")
SHELL_SIGNALS = {"Killed": 9, "Segmentation fault": 11, "Aborted": 6, "Bus error": 7, "Illegal instruction": 4,
                 "Floating point exception": 8, "killed": 9, "segmentation fault": 11, "abort": 6, "bus error": 7,
                 "illegal hardware instruction": 4, "floating point exception": 8}


def shell_death(message: str) -> int | None:
    """The signal a shell says killed its child (SHELL_DEATH), else None."""
    if not any(w in message for w in SHELL_WORDS) and not message.lstrip().startswith(("Aborted", "Bus error")):
        return None
    m = SHELL_DEATH.match(message.strip()) or ZSH_DEATH.match(message.strip())
    return SHELL_SIGNALS[m.group("what")] if m else None


# Native code's own report of a fatal signal, whatever the line's level: absl's handler in Ray's processes
# (absl/debugging/failure_signal_handler.cc: `*** SIGSEGV received at time=1739339449 on cpu 57 ***`), glog's
# (`*** SIGSEGV (@0x0) received by PID 1234 (TID 0x7f…) from PID 0; stack trace: ***`), Python's faulthandler
# (`Fatal Python error: Segmentation fault`), and ROCm's HSA runtime on a GPU page fault before it aborts the process
# (`Memory access fault by GPU node-2 (Agent handle: …) on address …`). SIGTERM's and SIGINT's are a stop's.
NATIVE_SIGNAL = re.compile(r"\*\*\* (?P<sig>SIG[A-Z]{2,6}) (?:received at time=\d|\(@0x[0-9a-f]{1,16}\) received by PID)")
CRASH_SIGNALS = {"SIGSEGV": 11, "SIGABRT": 6, "SIGBUS": 7, "SIGFPE": 8, "SIGILL": 4}
GPU_FAULT = "Memory access fault by GPU node-"


# A container runtime's report of the container's main process ending: Docker Compose's `vllm-1 exited with code
# 139`, kubectl describe's `Exit Code:    132` (128 + the signal), and Kubernetes' `Reason: OOMKilled` (the
# cgroup's memory limit: SIGKILL). Only the crash signals count: 137 alone is also `docker stop` after its grace
# period and 143 a stop's SIGTERM.
CONTAINER_EXIT = re.compile(r"(?:\bexited with code |\bExit Code:\s{1,40})(?P<code>13[2-69])\b")
CONTAINER_OOM = re.compile(r"\bReason:\s{1,40}OOMKilled\b")


def death_signal(message: str) -> int | None:
    """The crash signal a line reports (a shell's SHELL_DEATH, a native handler's, faulthandler's, a GPU fault's
    abort, a container runtime's exit code), else None."""
    if "xit" in message and (m := CONTAINER_EXIT.search(message)):
        return int(m.group("code")) - 128
    if "OOMKilled" in message and CONTAINER_OOM.search(message):
        return 9
    if "*** SIG" in message:
        m = NATIVE_SIGNAL.search(message)
        return CRASH_SIGNALS.get(m.group("sig")) if m else None
    if message.startswith("Fatal Python error: "):        # faulthandler names the signal as a shell does
        return SHELL_SIGNALS.get(message[len("Fatal Python error: "):].strip())
    if message.startswith(GPU_FAULT):
        return 6
    return shell_death(message)


SIGNAL_MEANING = {4: "SIGILL: the CPU lacks an instruction the build uses (a CPU wheel built for AVX-512 on a CPU "
                     "without it)",
                  8: "SIGFPE: an arithmetic fault in native code",
                  9: "SIGKILL: the kernel's OOM killer (host memory; see `dmesg`) or someone killed it",
                  11: "SIGSEGV: a crash in native code (a kernel, NCCL, the driver, a C extension)",
                  6: "SIGABRT: native code aborted (a failed check or assertion)",
                  7: "SIGBUS: often /dev/shm too small in a container (--shm-size / --ipc=host)",
                  15: "SIGTERM: something outside vLLM stopped it"}
# Ray's ActorDiedError (ray/exceptions.py) names the actor on lines of their own after its first:
# `\tclass_name: RayWorkerWrapper`, `\tpid: 285`, `\tip: 192.168.177.12`.
ACTOR_DIED = "The actor died unexpectedly before finishing this task."
ACTOR_FIELD = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip): (\S{1,64})\s*$")
# ... and RayTaskError the actor that raised (ray/exceptions.py, its traceback's header line):
# `ray::RayWorkerWrapper.execute_method() (pid=285, ip=192.168.177.12, actor_id=…, repr=…)`
RAY_TASK_ORIGIN = re.compile(r"ray::(\w{1,64})[\w.]{0,64}\(\) \(pid=(\d{1,10}), ip=([0-9A-Fa-f.:]{3,45})")
# xoscar (xinference's actors) tags an error raised in another actor pool with that pool's address and pid when
# it re-raises it (xoscar/backends/message.pyx `_AsCauseBase.__str__`): `[address=10.8.9.17:34697, pid=141952] …`
XOSCAR_ORIGIN = re.compile(r"\[address=([0-9A-Fa-f.:]{3,45}|[\w.-]{1,253}):\d{1,5}, pid=(\d{1,10})\]")
# ... and the machine the log's own pools run on, as xinference says it started them (core/supervisor.py, worker.py)
XINF_HOME = re.compile(r"Xinference (?:supervisor|worker) ([0-9A-Fa-f.:]{3,45}|[\w.-]{1,253}):\d{1,5} started")
# ... and the raylet the worker process that died under a task (node_manager.cc): `A worker died or was killed
# while executing a task by an unexpected system error. … Worker IP address: A Worker port: P Worker PID: N`
RAY_WORKER_DIED = re.compile(r"Worker IP address: ([0-9A-Fa-f.:]{3,45}) Worker port: \d+ Worker PID: (\d{1,10})")
FIELDS_WITHIN = 8       # lines after ACTOR_DIED (or torchrun's ROOT_CAUSE) that may hold its fields
# A connection a peer closed names the peer: it went away first (crashed or exited), this side only noticed.
# PyTorch's TCPStore (`recvValue failed on SocketImpl(fd=99, addr=[…]:38760, remote=[::ffff:A]:42643):
# Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?`),
# gloo (`Connection closed by peer [A]:29500`), NCCL's socket layer (`Connection closed by remote peer
# A<43215>`).
PEER_GONE = re.compile(r"remote=\[(?:::ffff:)?(?P<c10d>[^\]\s]{1,253})\]:\d+\): Failed to recv.{0,40}Connection was likely closed"
                       r"|Connection closed by (?:remote )?peer \[?(?:::ffff:)?(?P<peer>[\w.:-]{1,253}?)\]?(?::\d+|<\d+>)")
# PyTorch prints this from its process-group destructor as the process exits: a peer that closes after it
# is a process ending, not one crashing.
EXITING = "destroy_process_group() was not called"


@dataclass(frozen=True)
class Crash:
    """Where a failure no rule names started: the first process that died or printed an error."""
    seq: int
    node: str | None            # raw node (ip, pod/NAME, NCCL host); None: the driver's / one machine
    process: str | None         # `RayWorkerWrapper pid=285`, `VllmWorker-1`
    rank: int | None
    lineno: int
    peer: bool = False          # only a peer's closed connection names it: its own failure is not in the log
    exit_code: int | None = None   # the exit code a death line gives (negative: the signal)
    source: str | None = None      # the log the line is in
    # the launcher's own verdict of which worker failed first (torchrun's agent and table order its workers'
    # failures by time): holds even when the line comes after the exception a finding cites
    verdict: bool = False

    def facts(self) -> dict[str, Any]:
        """The finding's facts: failed_first_on (the node), _process, _rank, _line; unknown ones left out."""
        out = {"failed_first_on": self.node, "failed_first_process": self.process, "failed_first_rank": self.rank,
               "failed_first_line": self.lineno}
        return {k: v for k, v in out.items() if v is not None}

    def notes(self) -> list[str]:
        out = []
        if self.peer:
            out.append(f"{self.node} closed its connection first (line {self.lineno}): that node failed or exited "
                       "before this one noticed, and its own log holds the cause")
        if (killed := self.killed()) is not None:
            out.append(killed)
        return out

    def killed(self) -> str | None:
        """What a negative exit code says: the signal that killed the process and what usually sends it."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        import signal

        number = -self.exit_code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        meaning = SIGNAL_MEANING.get(number, f"{name}: the process was killed by a signal")
        return (f"{self.process or 'the process'} exited with code {self.exit_code} (line {self.lineno}), "
                f"killed by {meaning}")


def victim(line) -> tuple[str | None, int | None] | None:
    """The (process, rank) a death line names, or None when the line names none."""
    message = line.message
    if "Failed core proc" in message and (m := FAILED_CORE.search(message)):
        return m.group("name"), None
    if TORCHRUN_WORDS in message and (m := TORCHRUN_FAILED.search(message)):
        return f"local_rank {m.group('local')} pid={m.group('pid')}", None
    if "died" not in message:
        return None
    m = DEATH.search(message)
    if m is None:
        return None
    if m.group("ray"):
        return f"RayWorkerProc rank={m.group('rank')}", int(m.group("rank"))
    if m.group("v0name"):
        return f"{m.group('v0name')} pid={m.group('v0pid')}", None
    name = m.group("name")
    digits = re.search(r"(\d+)$", name)
    # the executor names its workers by their rank (`VllmWorker-{rank}`); an engine's digit is its DP index
    rank = int(digits.group(1)) if digits and name.startswith("VllmWorker") else None
    return (f"{name} pid={m.group('pid')}" if m.group("pid") else name), rank


def signal_killed(message: str) -> bool:
    """A death line whose exit code is a signal that is no stop's (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, …)."""
    code = exit_code(message)
    return code is not None and code < 0 and -code not in STOP_SIGNALS


def exit_code(message: str) -> int | None:
    """The exit code a death line gives (negative: the signal that killed it), or None."""
    m = EXIT_CODE.search(message)
    number = (m.group(1) or m.group(2)) if m else None
    if m is None and (m := FAILED_CORE.search(message) or TORCHRUN_FAILED.search(message)):
        number = m.group("code")
    return int(number) if number and number != "None" else None


def table_crash(fields: dict[str, str]) -> tuple[str, int | None, int | None] | None:
    """(process, global rank, exit code) of torchrun's root-cause table, from its fields; None without them."""
    code = TABLE_EXIT.match(fields.get("exitcode", ""))
    if code is None:
        return None
    ranks = TABLE_RANK.match(fields.get("rank", ""))
    process = f"local_rank {ranks.group(2)} pid={code.group(2)}" if ranks else f"pid={code.group(2)}"
    return process, int(ranks.group(1)) if ranks else None, int(code.group(1))
