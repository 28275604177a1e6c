"""The precedences between causes, each with the evidence that makes it hold and the real logs that test it.

The code that applies each one is named in `where`; this list is what a reader (and docs/precedences.md,
generated from it by tests/test_precedence.py) sees of them. Every entry names real corpus cases
(`logs_corpus/<group>/<id>`) where it holds and where it must not: tests/test_precedence.py checks that
each has both, and the corpus test checks each case's answer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precedence:
    name: str
    says: str                  # what wins over what
    evidence: str              # what in the log makes it hold; without it, it does not apply
    where: str                 # the code that applies it
    holds: tuple[str, ...]     # corpus cases where it applies
    must_not: tuple[str, ...]  # corpus cases that look alike where it must not


PRECEDENCES: tuple[Precedence, ...] = (
    Precedence(
        "stop-after-serving",
        "A traceback after a served run that a signal stopped is its shutdown, not a failure: exit 0, a notice.",
        "The server served (ready, or a stats line) and then printed a line only a stop signal prints "
        "(`Shutting down FastAPI HTTP server.`, `[shutdown] API server: shutdown triggered`, `[shutdown] "
        "EngineCore: trigger received signal=`, a typed `^C`). Before that line only a stop's own exceptions "
        "(EngineDeadError, CancelledError, KeyboardInterrupt, SystemExit) are noise; a real error before it "
        "is a crash the user then stopped.",
        "diagnosis/outcome.py",
        ("real/healthy/hv032-double-ctrl-c", "real/healthy/hv032-idle-long", "real/healthy/hv032-timeout-sigterm"),
        ("real/other/ro41", "real/other/ro40", "real/other/tn06")),
    Precedence(
        "stopped-during-start-up",
        "A start-up the user interrupted is no failure: what the interrupt prints (the import it broke, a "
        "worker that `died unexpectedly`, `RuntimeError: cancelled`, `Engine core initialization failed`) is "
        "its noise; what came before it is judged as without the stop (a wait the user gave up on is a stall).",
        "A KeyboardInterrupt traceback (its chain counted from its first traceback) or `[shutdown] EngineCore: "
        "trigger received signal=SIGINT` -- not SIGTERM, which vLLM's own process manager sends after a failure.",
        "diagnosis/outcome.py interrupted_at, decide",
        ("real/healthy/hv032-startup-ctrl-c", "real/healthy/hv032-startup-ctrl-c-warmup"),
        ("real/parallel/rp29", "real/other/ro42")),
    Precedence(
        "only-vllm-recovers",
        "A failure before the server's ready line is one vLLM recovered from only when vLLM itself came up again "
        "after it; a wrapper's own fallback app that prints uvicorn's `Application startup complete` after vLLM "
        "died leaves the failure standing.",
        "After the last failure and before the ready line, one of vLLM's own lines: its launch (`vLLM API server "
        "version`, `non-default args:`, `args: Namespace(`), its loading or engine milestones, or its own ready "
        "lines (`Starting vLLM API server`, `Available routes are`); uvicorn's `Started server process` / "
        "`Application startup complete` are any ASGI app's.",
        "diagnosis/outcome.py vllm_ready",
        ("real/memory/q807",),
        ("real/healthy/hv032-inspect-noise",)),
    Precedence(
        "engine-died-while-serving",
        "`Engine core proc … died unexpectedly` is a failure (unrecognized: the log does not say why) only when "
        "the server had served and no stop signal came; otherwise it is exit noise.",
        "A ready or stats line before it and no stop-signal line in the run: the same ERROR line ends healthy "
        "offline runs (PR #28898, #36270: 'benign error log during normal shutdown') and races a Ctrl-C.",
        "diagnosis/outcome.py died_while_serving",
        ("real/other/tn06",),
        ("real/healthy/th03", "real/healthy/th04", "real/healthy/th05")),
    Precedence(
        "warning-is-no-cause",
        "A failure line vLLM printed as a WARNING is no root cause while a failure with a rule of its own is "
        "there; it is the cause (at low confidence) only when the failure that follows has no rule, or the "
        "log ends short of ready with nothing else wrong.",
        "The line carries vLLM's logger header at level WARNING (`WARNING 06-13 11:42:20 _custom_ops.py:11]`): "
        "vLLM went on after it. `Failed to import from vllm._C` is printed on any host without CUDA "
        "libraries and when an old driver lacks a CUDA-12 symbol; its `No module named 'vllm._C'` is never a "
        "cause where the log shows an out-of-tree platform (`Platform plugin ascend is activated`: vLLM installed "
        "for it has no CUDA extension), whatever follows.",
        "findings.Match.printed_as_warning, diagnosis/engine.py Diagnoser._promote_warned, "
        "refine/install_env.py (log.platform_plugin)",
        ("real/platform/rg32", "real/healthy/th06", "real/healthy/th07", "real/other/b904"),
        ("real/platform/rg19", "real/platform/rg34")),
    Precedence(
        "ray-actor-without-gpu",
        "`No CUDA GPUs are available` in a Ray actor that is not vLLM's own worker is cuda-visible-devices (Ray "
        "emptied the variable for an actor that asked for no GPU), not no-gpu.",
        "Ray is the executor (`Defaulting to use ray for distributed inference`, or the command's "
        "--distributed-executor-backend ray) and the line's process prefix names a process vLLM does not start "
        "(`(_MapWorker pid=…)`: Ray Data's actor building the engine); in vLLM's own processes (RayWorkerWrapper, "
        "EngineCore, APIServer) or without Ray the node has no usable GPU.",
        "refine/ray_actor.py in_foreign_actor; refine/no_gpu.py classify",
        ("real/platform/g901",),
        ("real/platform/rg05", "platform/p01")),
    Precedence(
        "hang-while-serving",
        "vLLM's own waits after the server served are a hang while serving (unrecognized, said as such), "
        "never startup-stalled.",
        "A ready line or a stats line (`Avg prompt throughput:`) before the waits "
        "(`No available shared memory broadcast block found`), and no stats line after the last wait; "
        "where the log has neither, a request the HTTP server answered (uvicorn's access line, "
        "`127.0.0.1:56038 - \"GET /v1/… HTTP/1.1\" 200 OK`) before them: the start-up was over, though the "
        "answers after the wait (status polls) are no progress of the engine. Without a wait line: the log ends "
        "in three or more stats lines in a row with requests running and 0.0 tokens/s read and generated (30 s at "
        "the default interval), with no stop signal after; one or two such lines are a pause.",
        "diagnosis/engine.py Diagnoser._hung_while_serving, _promote_stalls; diagnosis/stuck.py; events/logfacts.py "
        "ACCESS_LINE",
        ("real/other/ro25", "real/other/th11", "real/other/t802"),
        ("real/nccl/rn13", "real/other/ro09", "real/healthy/hv032-sigint-midrequest")),
    Precedence(
        "precursor-explains",
        "A precursor line followed by a failure explains that failure: it ranks above the failure's own rule, "
        "short of the plain configuration errors; a precursor such an error outranks is no finding at all (vLLM "
        "went on past it to that error).",
        "A pattern of kind `precursor` (`Error in inspecting model architecture`) and a failure after it in "
        "the same run; not when another failure came before it, nor when a failure of the precursor's own family "
        "and a higher priority is there (`No platform detected` beside CUDA's error 803: the precursor is that "
        "failure's symptom, so same-family-absorbs decides); nor before a failure that names its own cause (Ray's "
        "OOM killer on the node's host memory: `Memory on the node (IP: …)`, after Ray's `/dev/shm has only … "
        "bytes available`).",
        "diagnosis/arbitration.py _rank (PRECURSOR_BONUS), Diagnoser._promote_precursors",
        ("real/platform/rg15",),
        ("parallel/p21-v092-red-herring", "real/healthy/hv032-inspect-noise", "real/platform/q504",
         "real/other/j902")),
    Precedence(
        "specific-over-generic",
        "A specific cause beats a generic one whatever their order (NCCL's `WARN … P2P`/shm/socket line over "
        "`NCCL error: unhandled system error`), and a generic symptom of any family becomes the specific "
        "finding's supporting evidence, not a second finding with a second fix.",
        "Both in the same run: a rule of priority below the generic threshold (nccl-generic) and a specific "
        "one; alone, the generic one stands.",
        "diagnosis/arbitration.py absorbs (arbitrate; the pipe's notices: live.py poll)",
        ("real/nccl/rn17",),
        ("real/nccl/rn14",)),
    Precedence(
        "same-family-absorbs",
        "A weaker finding of the root's own family is the same failure seen through its symptom: the old "
        "driver is why no GPU is found, so `driver-too-old` absorbs `no-gpu`.",
        "A failure of a higher-priority rule of the same family in the same run (driver-too-old's "
        "`driver on your system is too old` with `Found no NVIDIA driver`/`No CUDA GPUs`); without it, "
        "no-gpu stands.",
        "diagnosis/arbitration.py absorbs (arbitrate; the pipe's notices: live.py poll)",
        ("real/platform/rg07", "real/platform/rg08"),
        ("real/platform/rg05", "real/platform/rg06")),
    Precedence(
        "ordinal-needs-the-variable",
        "`CUDA error: invalid device ordinal` is cuda-visible-devices only where the variable is shown; with "
        "more ranks than GPUs it is parallel-exceeds-gpus; in code Ray placed or a KV connector's, with the "
        "variable not shown, no rule is named (Ray sets the variable, not the user); with nothing shown at "
        "all, cuda-visible-devices at low confidence.",
        "CUDA_VISIBLE_DEVICES in the command, the environment, a snapshot or the script's code "
        "(`os.environ[\"CUDA_VISIBLE_DEVICES\"] = …`); Ray: a `RayWorkerWrapper`/`…Actor` prefix, a Ray "
        "frame or `--distributed-executor-backend ray`; a connector: an lmcache/kv_transfer frame. The "
        "holding side is two built cases on vLLM's real wording (no real log with the variable in view "
        "was found).",
        "refine/device_ordinal.py classify",
        ("platform/p06", "platform/p07"),
        ("real/other/ro43",)),
    Precedence(
        "a-capability-warning-the-build-runs",
        "PyTorch's capability warning (`Found GPU0 X which is of cuda capability M.m`) explains a failure as "
        "compute-capability only where the installed build has no kernel the GPU runs; a GPU of the same major as a "
        "capability the build names, at or above its minor, runs that build's kernels (CUDA's binary "
        "compatibility: a GB10 at 12.1 under a (8.0)-(12.0) build), so the warning names no cause there.",
        "The build's range on the line after `Minimum and Maximum cuda capability supported by this version of "
        "PyTorch is` (facts log.torch_cc_min / log.torch_cc_max: torch 2.8-2.10, whose range check ignores binary "
        "compatibility; 2.11+ warns only where no built capability runs), beside the warning's M.m; without it, the "
        "warning stays a precursor.",
        "refine/torch_arch.py classify",
        ("real/healthy/y512",),
        ("real/platform/y508",)),
    Precedence(
        "an-environment-is-not-an-install",
        "The model-registry subprocess failing is install-broken only where vLLM does not import there; where its "
        "stderr shows the process's environment stopping it (a UID with no passwd entry: Python's getpass.getuser() "
        "raising `getpwuid(): uid not found`), the installation is intact and the failure stays unrecognized, with "
        "the environment named in its note.",
        "`KeyError: 'getpwuid(): uid not found: N'` in the log (the fact log.uid_without_user), beside the "
        "registry's `Error in inspecting`, `failed to be inspected` or `registry']' returned non-zero` lines.",
        "refine/install_env.py classify",
        ("real/other/k103",),
        ("real/platform/rg16",)),
    Precedence(
        "a-platform-vllm-never-looked-for",
        "No platform detected (`No platform detected, vLLM is running on UnspecifiedPlatform`, `Failed to infer "
        "device type`, an empty device string) is install-broken, not no-gpu, where vLLM says it found no "
        "distribution named vllm: its CUDA platform check asks for that distribution's version and fails on it "
        "before it looks at a GPU.",
        "vLLM's warning `The vLLM package was not found, so its version could not be inspected` (platforms/"
        "__init__.py vllm_version_matches_substr, 0.8+; the fact log.vllm_unnamed) in the log. torch's own `No "
        "CUDA GPUs are available` stays no-gpu beside it.",
        "refine/no_gpu.py classify",
        ("real/platform/a401",),
        ("real/platform/rg26",)),
    Precedence(
        "a-request-error-is-not-the-servers",
        "An error a request handler logged (the server answered that request with an error response and went on) "
        "is no failure of the server: no finding, a notice; the same handler reporting the engine's death is the "
        "engine's failure.",
        "The line's logger location is one of the OpenAI server's request handlers (`serving_*.py` 0.4-0.2x, "
        "`<endpoint>/serving.py` 0.2x+, `vllm_error.py`/`validation.py` 0.3x), or its traceback's outermost frame "
        "is uvicorn's per-request `run_asgi` (`Exception in ASGI application`); and neither it nor its exception "
        "names EngineDeadError, EngineGenerateError or the engine core, nor do its frames pass through V0's engine "
        "loop (`run_engine_loop`, `engine_step`). An exception the same process logged on its way to such a "
        "handler (chat_utils.py's `An error occurred in mistral_common while applying chat template`), which "
        "the handler then reports as its own (same type, same first line, later), is that request's too.",
        "events/requests.py request_error, request_tracebacks; diagnosis/engine.py",
        ("real/healthy/th15", "real/healthy/p807", "real/healthy/p408"),
        ("real/multiproc/rmp11", "real/other/r801")),
    Precedence(
        "wait-with-its-reason",
        "A start-up that ends waiting for its placement group, where another rule's stall says why the wait never "
        "ends, is that rule's failure, and the plain start-up stall is the same wait (its lines support it, no "
        "second finding); a pasted `ray status` names a count problem only where its GPU total is below what the "
        "pending group asks for.",
        "Beside the wait, Ray's autoscaler's `No available node types can fulfill resource request …` or `ray "
        "status`'s `{'GPU': 1.0} * N (PACK): 1+ pending placement groups` with its `Total Usage:` line `x/T GPU`, T "
        "below the GPUs the pending shapes ask for. A pending group alone, or with enough GPUs counted, says nothing "
        "about why: the start-up stall stands.",
        "diagnosis/arbitration.py explained_waits; refine/ray_placement.py classify",
        ("real/parallel/rp30",),
        ("real/nccl/rn22",)),
    Precedence(
        "pinned-ip-not-a-ray-node",
        "Ray's autoscaler unable to place vLLM's first bundle, pinned to `node:<ip>`, is nccl-network (the driver's "
        "address is not one Ray registered: VLLM_HOST_IP): vLLM checked that its own Ray node has a free GPU before "
        "it pinned the bundle, so only the label can be missing. It holds where the pin is no address (a host name), "
        "an address the paste hid, or an address outside every Ray address the log shows; otherwise, and wherever "
        "vLLM's own count says the cluster has too few GPUs, it stays parallel-exceeds-gpus' stall.",
        "The pinned request itself unplaceable (not the GPU-only bundles: those are a count), with a pin that Ray "
        "cannot label a node by: a host name, `<IP>`, or an address in another block than the cluster the driver "
        "joined (`Connecting to existing Ray cluster at address: A:P`) and the nodes' `ip=` prefixes; and no "
        "`required GPUs exceeds the total number of available GPUs` (0.4-0.8's count of the cluster; 0.11+'s "
        "`Tensor parallel size (N) exceeds available GPUs (M)` counts the driver's own GPUs before it joins Ray, so "
        "it says nothing of the cluster). One block "
        "proves nothing: a worker node of the same network, or a node whose GPU Ray registered as something else.",
        "refine/ray_placement.py classify",
        ("real/multinode/rmn11", "real/multinode/g202"),
        ("parallel/p18-v0111-ray-pg-timeout",)),

)


def precedence_markdown() -> str:
    """docs/precedences.md: one section per precedence."""
    out = ["# Causal precedences", "",
           "Generated from `src/vllm_doctor/diagnosis/precedence.py` (tests/test_precedence.py keeps it so). Each "
           "precedence names the evidence that makes it hold and the real logs of `logs_corpus/` where it holds "
           "and where it must not.", ""]
    for p in PRECEDENCES:
        out += [f"## {p.name}", "", p.says, "",
                f"- evidence: {p.evidence}",
                f"- applied in: `{p.where}`",
                f"- holds: {', '.join(f'`{c}`' for c in p.holds)}",
                f"- must not hold: {', '.join(f'`{c}`' for c in p.must_not)}", ""]
    return "\n".join(out)
