"""Remedies for NCCL / communication failures: P2P, /dev/shm, timeouts, generic NCCL errors (the network's is
remedies/network.py).

Every remedy reads the evidence of its own rule (pattern names and captures, incl. supporting matches such as
the `nvidia-smi topo -m` rows or NCCL's `NET/Socket : Using …` INFO lines), the facts (gpu.p2p, gpu.topology,
env.shm_total_bytes, env.in_container …) and the launch command, and proposes edits the command model applies.
"""
from __future__ import annotations

import re

from vllm_doctor.command.edits import DockerOption, SetEnv, SetFlag
from vllm_doctor.command.flags import env_var_since
from vllm_doctor.command.versions import parse_version
from vllm_doctor.findings import Alternative, Fix
from vllm_doctor.numbers import as_int as _int
from vllm_doctor.remedies.context import RemedyContext

GIB = 1024 ** 3
MIB = 1024 ** 2
DISABLE_CAR = "--disable-custom-all-reduce"


def fmt_bytes(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


# --- P2P ------------------------------------------------------------------------------------------

_TOPO_TOKEN = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
_P2P_OK = ("OK", "True", "true", "1")


def topology_matrix(ctx: RemedyContext) -> tuple[list[list[str]] | None, str | None]:
    """The GPU topology matrix: the log's pasted `nvidia-smi topo -m` rows, else gpu.topology."""
    rows: dict[int, list[str]] = {}
    for m in ctx.matches_named("topo-row"):
        gpu = _int(m.captures.get("topo_gpu"))
        if gpu is not None:
            rows.setdefault(gpu, _TOPO_TOKEN.findall(m.captures.get("topo_row") or ""))
    if rows:
        n = max(rows) + 1
        matrix = [rows.get(i, []) for i in range(n)]
        if all(len(r) >= n for r in matrix):
            return [r[:n] for r in matrix], "log (nvidia-smi topo -m)"
    topo = ctx.fact("gpu.topology")
    if isinstance(topo, list) and topo:
        return [[str(x) for x in r] for r in topo], ctx.facts.source("gpu.topology") or "facts"
    return None, None


def _off_diagonal(matrix: list[list[str]]) -> list[str]:
    return [v for i, r in enumerate(matrix) for j, v in enumerate(r) if i != j]


def p2p_status(ctx: RemedyContext) -> tuple[bool | None, str]:
    """True: every pair can do P2P; False: some pair cannot; None: unknown. With a description."""
    p2p = ctx.fact("gpu.p2p")
    if isinstance(p2p, dict):
        p2p = p2p.get("read") or p2p.get("write") or next(iter(p2p.values()), None)
    cells = [str(v) for v in _off_diagonal(p2p)] if isinstance(p2p, list) and p2p else []
    if cells and all(c in _P2P_OK for c in cells):
        return True, "NVML reports P2P OK between every GPU pair"
    if any(c not in _P2P_OK + ("?",) for c in cells):
        pairs = [f"{i}-{j}" for i, r in enumerate(p2p) for j, v in enumerate(r)
                 if i < j and str(v) not in _P2P_OK + ("?", "X")]
        return False, f"NVML reports no P2P between GPU pairs {', '.join(pairs[:8])}"
    return None, ""


def nvlink_everywhere(ctx: RemedyContext) -> bool:
    p2p = ctx.fact("gpu.p2p")
    matrix = p2p.get("nvlink") if isinstance(p2p, dict) else None
    cells = [str(v) for v in _off_diagonal(matrix)] if matrix else []
    return bool(cells) and all(c == "OK" for c in cells)


def fix_p2p(ctx: RemedyContext) -> Fix:
    custom_ar = ctx.has_pattern("custom-allreduce-peer", "custom-allreduce-cuda-error")
    nccl_p2p = ctx.has_pattern("nccl-cuda-failure-peer", "nccl-failed-to-peer")
    ok, p2p_desc = p2p_status(ctx)
    topo, topo_src = topology_matrix(ctx)
    links = _off_diagonal(topo) if topo else []
    nvlink = (bool(links) and all(v.startswith("NV") for v in links)) or nvlink_everywhere(ctx)
    pcie_levels = [] if nvlink else sorted({v for v in links if not v.startswith("NV")})
    facts_used, arithmetic, notes = {}, [], []
    if p2p_desc:
        facts_used["gpu.p2p"] = p2p_desc
        arithmetic.append(p2p_desc + ".")
    if topo:
        facts_used["gpu.topology"] = " / ".join(" ".join(r) for r in topo)
        arithmetic.append(f"GPU links ({topo_src}): " + ("all NVLink" if nvlink else ", ".join(pcie_levels)))
    if ctx.capture("src_file"):
        arithmetic.append(f"failing call: {ctx.capture('src_file')}:{ctx.capture('src_line') or '?'} "
                          f"'{ctx.capture('cuda_error') or ''}' (vLLM's custom all-reduce kernel)")
    disable_car = SetFlag(DISABLE_CAR)
    disable_p2p = SetEnv("NCCL_P2P_DISABLE", "1")
    cost = "all-reduce goes through NCCL over PCIe / host memory instead of direct GPU-to-GPU copies: slower"
    if ok is True or (nvlink and ok is not False):
        # NVLink box whose P2P works: the hardware is not the cause.
        driver = ctx.fact("gpu.driver_version")
        summary = ("P2P is reported working on this machine" + (" (NVLink between every GPU)" if nvlink else "")
                   + ", so the GPUs' peer links are not the cause: re-test P2P with VLLM_SKIP_P2P_CHECK=0 and "
                     "check the driver")
        notes.append("Check that the driver inside the container matches the host driver"
                     + (f" (host driver {driver})" if driver else "")
                     + ", that nvidia-fabricmanager runs on NVSwitch systems, and whether the 535 driver series "
                       "(known custom all-reduce hangs) is installed.")
        notes.append("VLLM_SKIP_P2P_CHECK=0 makes vLLM really test P2P at start-up instead of trusting the "
                     "driver's report; if the test fails it turns custom all-reduce off by itself.")
        return Fix(summary=summary, edits=[SetEnv("VLLM_SKIP_P2P_CHECK", "0")],
                   alternatives=[Alternative(f"work around it with {DISABLE_CAR}", [disable_car], cost)],
                   arithmetic=arithmetic, facts_used=facts_used, notes=notes)
    if custom_ar and not nccl_p2p:
        edits = [disable_car]
        summary = (f"Start with {DISABLE_CAR}: vLLM's custom all-reduce needs GPU peer-to-peer access, which "
                   "these GPUs do not have" if ok is False or pcie_levels else
                   f"Start with {DISABLE_CAR}: vLLM's custom all-reduce failed on GPU peer-to-peer access")
        alternatives = [Alternative("also keep NCCL off the P2P transport (NCCL_P2P_DISABLE=1)",
                                    [disable_car, disable_p2p], cost)]
    else:
        edits = [disable_p2p, disable_car]
        summary = ("Set NCCL_P2P_DISABLE=1 and start with " + DISABLE_CAR + ": NCCL's peer-to-peer transport "
                   "failed because the GPUs cannot access each other's memory")
        alternatives = [Alternative("only NCCL_P2P_LEVEL=PHB (keep P2P inside one PCIe host bridge)",
                                    [SetEnv("NCCL_P2P_LEVEL", "PHB"), disable_car], cost)]
    notes.append("Cost: " + cost + "; decode throughput typically drops a few percent (more at small batch).")
    if any(v in ("PIX", "PXB") for v in pcie_levels):
        notes.append("GPUs behind one PCIe switch (PIX/PXB) normally can do P2P: when they cannot, PCIe ACS or the "
                     "IOMMU (also in a VM) is blocking it — disabling ACS / setting iommu=pt in BIOS / kernel is "
                     "the real fix, the flags above are the workaround.")
    elif pcie_levels:
        notes.append("The GPUs are connected through " + "/".join(pcie_levels) + " (across PCIe host bridges or "
                     "CPU sockets): consumer and many PCIe boards do not support P2P there, so disabling it is "
                     "the fix, not a workaround.")
    else:
        notes.append("Run `nvidia-smi topo -m` (or `nvidia-smi topo -p2p r`) to see which GPU pairs support P2P; "
                     "BIOS / IOMMU / ACS settings decide it on PCIe servers.")
    return Fix(summary=summary, edits=edits, alternatives=alternatives, arithmetic=arithmetic,
               facts_used=facts_used, notes=notes)


# --- /dev/shm -------------------------------------------------------------------------------------

def fix_shm(ctx: RemedyContext) -> Fix:
    need = max([_int(v) or 0 for v in ctx.captures_all("shm_bytes") + ctx.captures_all("shm_size")] or [0]) or None
    total = ctx.fact_int("env.shm_total_bytes")
    total_src = "env.shm_total_bytes"
    ray = [v for v in map(_int, ctx.captures_all("shm_avail_bytes")) if v]
    if total is None and ray:
        total, total_src = min(ray), "Ray's /dev/shm report in the log"
    free = ctx.fact_int("env.shm_free_bytes")
    arithmetic, notes, facts_used = [], [], {}
    if need:
        arithmetic.append(f"NCCL asked for a {fmt_bytes(need)} segment ({need} bytes) per peer and channel")
        facts_used["shm_needed_bytes"] = need
    if total is not None:
        arithmetic.append(f"/dev/shm size: {fmt_bytes(total)} ({total_src})"
                          + (f", free {fmt_bytes(free)}" if free is not None else ""))
        facts_used["env.shm_total_bytes"] = total
        if total <= 64 * MIB:
            arithmetic.append("64 MiB is Docker's default /dev/shm: far too small for NCCL between several GPUs")
    cleanup = ("Segments leaked by crashed runs stay in /dev/shm: check `ls -la /dev/shm/nccl-*` and remove the "
               "ones no running process uses (not while a job runs).")
    not_shared = ctx.has_pattern("shm-attach-segment") and "2" in ctx.captures_all("errno")
    problem = ("the ranks do not share one /dev/shm (or the segment was removed)" if not_shared
               else "/dev/shm is too small for NCCL")
    if not_shared:
        notes.append("`attaching … No such file or directory` means the ranks do not share one /dev/shm: "
                     "processes in different containers/pods (IPC namespaces), or the segment was removed "
                     "meanwhile. Run all ranks of a node in one container with --ipc=host.")
    if ctx.has_pattern("bus-error", "sigbus"):
        notes.append("A Bus error can also come from a memory-mapped model file that changed or was truncated "
                     "on disk; with tensor parallelism in a container, /dev/shm is the usual cause.")
    found = {"arithmetic": arithmetic, "facts_used": facts_used}
    if ctx.has_pattern("shm-free-space"):
        return _vllm_shm_check(ctx, notes, cleanup)
    if ctx.is_docker:
        return Fix(summary=f"Start the container with --ipc=host (or --shm-size=16g): {problem}",
                   edits=[DockerOption("--ipc", "host")],
                   alternatives=[Alternative("a bigger private /dev/shm instead of the host's IPC namespace",
                                             [DockerOption("--shm-size", "16g")],
                                             "16 GiB of host RAM may be held by the container's /dev/shm"),
                                 Alternative("keep the container as is and turn off NCCL's shm transport",
                                             [SetEnv("NCCL_SHM_DISABLE", "1")], "slower intra-node all-reduce")],
                   notes=notes + [cleanup], **found)
    if ctx.in_container:
        notes.append("The launch command is not a `docker run`, so the container option cannot be added to it "
                     "here: change the container's definition (compose `ipc: host` / `shm_size: 16gb`).")
        return Fix(summary="Restart the container with --ipc=host or --shm-size=16g (Kubernetes: an emptyDir with "
                           "medium: Memory mounted on /dev/shm); until then NCCL_SHM_DISABLE=1 avoids /dev/shm",
                   edits=[SetEnv("NCCL_SHM_DISABLE", "1")], notes=notes + [cleanup], **found)
    if not_shared:
        summary = ("The ranks do not share one /dev/shm (separate containers or IPC namespaces), or the segment was "
                   "removed: run all ranks of a node in one container with --ipc=host; NCCL_SHM_DISABLE=1 avoids /dev/shm")
    else:
        summary = ("/dev/shm is full or too small: free it (leaked /dev/shm/nccl-* segments) or set NCCL_SHM_DISABLE=1; "
                   "in a container start it with --ipc=host or --shm-size=16g")
        notes.append("On bare metal /dev/shm is normally half of RAM, so running out usually means leaked segments, "
                     "another job, or a small tmpfs mount (`df -h /dev/shm`).")
    return Fix(summary=summary, edits=[SetEnv("NCCL_SHM_DISABLE", "1")], notes=notes + [cleanup], **found)


def _vllm_shm_check(ctx: RemedyContext, notes: list[str], cleanup: str) -> Fix:
    """vLLM's own check of /dev/shm before its broadcast buffers (0.32+): NCCL's shm switch does not help."""
    required, free = ctx.capture_float("required_mib"), ctx.capture_float("free_mib")
    arithmetic = [f"vLLM needs {required:g} MiB in /dev/shm for its broadcast buffers, {free:g} MiB are free"] \
        if required is not None and free is not None else []
    facts = {"required_mib": required} if required is not None else {}
    if ctx.is_docker:
        return Fix(summary="Start the container with --ipc=host (or --shm-size=16g): vLLM's own message queues "
                           "need more /dev/shm than the container has",
                   edits=[DockerOption("--ipc", "host")],
                   alternatives=[Alternative("a bigger private /dev/shm instead of the host's IPC namespace",
                                             [DockerOption("--shm-size", "16g")],
                                             "16 GiB of host RAM may be held by the container's /dev/shm")],
                   arithmetic=arithmetic, facts_used=facts, notes=notes + [cleanup])
    return Fix(summary="Give /dev/shm more room: free it (leaked segments of crashed runs) or enlarge it (a "
                       "container: --ipc=host or --shm-size=16g; Kubernetes: an emptyDir with medium: Memory on "
                       "/dev/shm); NCCL_SHM_DISABLE does not help, this is vLLM's own check",
               edits=[], arithmetic=arithmetic, facts_used=facts, notes=notes + [cleanup])


# --- timeouts -------------------------------------------------------------------------------------

CAUSE_LINES = ("`NCCL WARN … shared memory segment` / `failed to extend` (→ /dev/shm)",
               "`NCCL WARN Cuda failure 'peer access …'` / `failed to peer with device` (→ P2P)",
               "`socketStartConnect` / `Connection closed by remote peer` (→ network interface, peer died)",
               "`NET/IB : Got completion from peer … status=…` (→ InfiniBand)")


def fix_timeout(ctx: RemedyContext) -> Fix:
    arithmetic, notes = [], []
    if ctx.has_pattern("gloo-timeout") and ctx.capture("timeout_ms"):
        t = ctx.capture_int("timeout_ms") or 0
        arithmetic.append(f"Gloo's {ctx.capture('optype') or 'send'} (the CPU group) waited its whole timeout, "
                          f"{t / 1000:.0f} s, for a peer rank that never came")
        notes.append("Gloo carries vLLM's CPU-side collectives (the same-node check, barriers): a peer that never "
                     "reaches one is stuck in its own start-up (loading, compiling, a transport that hangs) or died.")
    elif ctx.capture("timeout_ms"):
        t = ctx.capture_int("timeout_ms") or 0
        e = ctx.capture_int("elapsed_ms") or 0
        arithmetic.append(f"rank {ctx.capture('rank') or '?'}: {ctx.capture('optype') or '?'} "
                          f"#{ctx.capture('seqnum') or '?'} waited {e / 1000:.0f} s (timeout {t / 1000:.0f} s)")
        if (ctx.capture_int("seqnum") or 99) <= 5:
            notes.append("The hang is in one of the first collectives (SeqNum ≤ 5): typical for a P2P or shm "
                         "transport that hangs at start-up, or a rank that never started.")
    elif ctx.capture("seqnum") and ctx.capture("last_completed"):
        arithmetic.append(f"collective #{ctx.capture('seqnum')} timed out; the last one completed was "
                          f"#{ctx.capture('last_completed')}")
    first = ctx.capture("timeout_from")
    if first and first.startswith("rank "):
        notes.append(f"This rank was told to dump by {first}, whose collective timed out first: that rank's "
                     "own lines (or its node's) say why it stopped.")
    if ctx.has_pattern("engine-core-timeout") and not ctx.has_pattern("watchdog"):
        waited = ctx.capture_int("waited_s") or 600
        new = max(1800, waited * 3)
        arithmetic.append(f"start-up waited {waited} s for the engine cores")
        return Fix(summary=f"Give start-up more time with VLLM_ENGINE_READY_TIMEOUT_S={new} (slow weight loading), "
                           "and rerun with NCCL_DEBUG=INFO if a worker is stuck in NCCL",
                   edits=[SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", str(new))],
                   alternatives=[Alternative("find a stuck worker: NCCL_DEBUG=INFO",
                                             [SetEnv("VLLM_ENGINE_READY_TIMEOUT_S", str(new)),
                                              SetEnv("NCCL_DEBUG", "INFO")], "a much longer log; no fix by itself")],
                   arithmetic=arithmetic, notes=notes)
    if ctx.has_pattern("engines-initial-message") and not ctx.has_pattern("watchdog"):
        return _engine_handshake(ctx, arithmetic, notes)
    notes.append("In the new log look for: " + "; ".join(CAUSE_LINES) + ".")
    summary = ("Rerun with NCCL_DEBUG=INFO: a collective timed out because some rank hung, and the NCCL WARN line "
               "of that rank names the cause")
    alternatives = [Alternative("if it hangs again at start-up, rule out P2P: NCCL_P2P_DISABLE=1 and "
                                + DISABLE_CAR, [SetEnv("NCCL_DEBUG", "INFO"), SetEnv("NCCL_P2P_DISABLE", "1"),
                                                SetFlag(DISABLE_CAR)], "slower all-reduce")]
    return Fix(summary=summary, edits=[SetEnv("NCCL_DEBUG", "INFO")], alternatives=alternatives,
               arithmetic=arithmetic, notes=notes)


def _engine_handshake(ctx: RemedyContext, arithmetic: list, notes: list) -> Fix:
    """The API server waited for the engine cores' first message, 600 s by default: engines still loading,
    compiling or warming up (DeepGEMM, CUDA graphs) when it gave up, or one stuck in a collective. Before
    VLLM_ENGINE_READY_TIMEOUT_S existed (vllm/envs.py, data/flags/env_vars.json) the wait was a fixed 600 s."""
    since = env_var_since(READY_TIMEOUT) or "0.15.0"
    version = parse_version(ctx.version)
    arithmetic.append("the API server waited 600 s (the default) for the engines' first message")
    notes.append("The engines may still have been starting (loading, compiling, warming up kernels) when the API "
                 "server gave up: their own last lines say where they were.")
    find = Alternative("find a stuck worker: NCCL_DEBUG=INFO", [SetEnv("NCCL_DEBUG", "INFO")],
                       "a much longer log; no fix by itself")
    if version is not None and version < parse_version(since):
        return Fix(summary=f"Shorten the start-up or upgrade: vLLM {ctx.version} gives the engines a fixed 600 s "
                           f"({READY_TIMEOUT}, from {since}, makes it longer); download the weights "
                           "beforehand, and --enforce-eager skips CUDA-graph capture",
                   edits=[], alternatives=[find], arithmetic=arithmetic, notes=notes)
    return Fix(summary=f"Give start-up more time with {READY_TIMEOUT}=1800 (the engines' first message came later "
                       "than 600 s), and rerun with NCCL_DEBUG=INFO if a worker is stuck in NCCL",
               edits=[SetEnv(READY_TIMEOUT, "1800")], alternatives=[find], arithmetic=arithmetic,
               notes=notes + ([] if version is not None else
                              [f"{READY_TIMEOUT} exists from vLLM {since}; before it the 600 s is fixed."]))


READY_TIMEOUT = "VLLM_ENGINE_READY_TIMEOUT_S"


# --- generic NCCL error ---------------------------------------------------------------------------

_SUSPECTS = {
    "unhandled system error": "a system call failed: most often /dev/shm too small (containers) or a socket/network "
                              "interface problem",
    "unhandled cuda error": "a CUDA call inside NCCL failed: most often GPU peer-to-peer (P2P/IPC) access",
    "internal error": "an internal check failed: often two different NCCL libraries (VLLM_NCCL_SO_PATH, torch vs "
                      "system NCCL) or mismatched versions across nodes",
    "remote process exited or there was a network error": "another rank died or the network dropped: look for "
                                                          "that rank's own error",
}


def fix_generic(ctx: RemedyContext) -> Fix:
    err = (ctx.capture("nccl_error") or "").strip()
    version = ctx.capture("nccl_version")
    seq, done = ctx.capture("seqnum"), ctx.capture("last_completed")
    if not err and seq:        # PyTorch's watchdog: an error or a timeout, it does not say which
        err = "an NCCL error or timeout"
        arithmetic = [f"PyTorch's watchdog: work {seq} failed or timed out (last completed: {done})"]
    else:
        arithmetic = [f"NCCL error: {err}" + (f" (NCCL {version})" if version else "")] if err else []
    notes = [f"'{err}': {_SUSPECTS[err]}."] if err in _SUSPECTS else []
    notes.append("In the new log look for: " + "; ".join(CAUSE_LINES) + ".")
    summary = ("Rerun with NCCL_DEBUG=INFO: only NCCL's WARN line (not in this log's evidence) names the cause of "
               f"'{err or 'the NCCL error'}'")
    alternatives = []
    if err == "unhandled system error" and ctx.in_container:
        alt = [DockerOption("--ipc", "host")] if ctx.is_docker else [SetEnv("NCCL_SHM_DISABLE", "1")]
        alternatives.append(Alternative("in a container the usual cause is /dev/shm: --ipc=host", alt,
                                        "the container shares the host's IPC namespace" if ctx.is_docker
                                        else "slower intra-node all-reduce"))
    elif err == "unhandled cuda error":
        alternatives.append(Alternative("if the WARN line names peer access: " + DISABLE_CAR + " and NCCL_P2P_DISABLE=1",
                                        [SetEnv("NCCL_P2P_DISABLE", "1"), SetFlag(DISABLE_CAR)], "slower all-reduce"))
    return Fix(summary=summary, edits=[SetEnv("NCCL_DEBUG", "INFO")], alternatives=alternatives,
               arithmetic=arithmetic, notes=notes)
