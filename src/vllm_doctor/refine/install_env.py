"""The model-registry subprocess failing is install-broken only when vLLM itself does not import there, not when
the process's environment stops it. Python's getpass.getuser() (torch's inductor cache path asks it at import)
raises `KeyError: 'getpwuid(): uid not found: N'` where the process runs under a UID with no passwd entry and no
USER/LOGNAME in its environment: OpenShift's arbitrary UIDs, `docker run --user N` (vllm#44548, llm-d). The
installation is intact; no rule names that, so the failure stays the exception it is, with why in its note.

vLLM installed for an out-of-tree platform (`Platform plugin ascend is activated`) has no vllm._C: its warning
`Failed to import from vllm._C with ModuleNotFoundError("No module named 'vllm._C'")` is no cause there.

NCCL's refusal to be captured into a CUDA graph names an NCCL built before CUDA 11.3 or a driver before R465: it is
the driver only where the facts show one that old (a CUDA 12 wheel cannot run under it, so the library is the cause
otherwise).

A package that resolves to a file of the user's (`vllm.py` beside the script) is no install: Python's import messages
name that file (dependency-mismatch's module_file, dependency-submodule's not_a_package), and renaming it is the fix."""
from __future__ import annotations

from vllm_doctor.facts.keys import GPU_DRIVER_VERSION, LOG_PLATFORM_PLUGIN
from vllm_doctor.findings import RefineContext
from vllm_doctor.numbers import parse_int
from vllm_doctor.refine import version_skew

REGISTRY_PATTERNS = ("inspect-error", "inspect-failed", "registry-subprocess", "registry-subprocess-wrapped")


SHADOW_PATTERNS = ("dependency-mismatch", "dependency-submodule")
NCCL_GRAPH_DRIVER = 465     # strongstream.cc: NCCL graph capture needs a driver from R465


def classify(ctx: RefineContext) -> str | None:
    if ctx.match.pattern.name == "plugin-signature-mismatch":
        return version_skew.classify(ctx)
    plugin = ctx.facts.get(LOG_PLATFORM_PLUGIN)
    if ctx.match.pattern.name == "no-module" and ctx.match.printed_as_warning and plugin \
            and str(ctx.match.captures.get("module", "")).startswith("vllm._"):
        ctx.match.unsupported = (
            f"`No module named '{ctx.match.captures['module']}'` is vLLM's warning on the {plugin} platform plugin: "
            "vLLM installed for an out-of-tree platform carries no CUDA extension, by design.")
        return "unrecognized"
    if ctx.match.pattern.name in SHADOW_PATTERNS:
        return _shadowed(ctx)
    if ctx.match.pattern.name == "nccl-graph-capture-old-cuda":
        major = parse_int(str(ctx.facts.get(GPU_DRIVER_VERSION) or "").split(".")[0])
        return "driver-too-old" if major is not None and major < NCCL_GRAPH_DRIVER else None
    uid = ctx.facts.get("log.uid_without_user")
    if ctx.match.pattern.name not in REGISTRY_PATTERNS or uid is None:
        return None
    ctx.match.unsupported = (
        f"The model-registry subprocess stopped at Python's getpass.getuser(): UID {uid} has no passwd entry and "
        "the environment names no USER, so torch's cache path cannot be built. The installation is intact: set USER "
        "(and HOME to a writable directory) in the container, or run it as a UID the image knows.")
    return "unrecognized"


def _shadowed(ctx: RefineContext) -> str | None:
    """A package name that resolved to a module of the user's: importlib's `'vllm' is not a package` (a top-level
    name only: a package's own plain submodule is its code's), or the importing module's file being `<name>.py`
    where the package's is `<name>/__init__.py`. A circular import inside the package itself names no install."""
    caps = ctx.match.captures
    top = str(caps.get("dependency", "")).split(".")[0]
    plain = str(caps.get("not_a_package") or "")
    module_file = str(caps.get("module_file") or "").strip()
    if plain and "." not in plain:
        where = f"a file named `{plain}.py` (in the working directory or on PYTHONPATH)"
        top = plain
    elif module_file.replace("\\", "/").rsplit("/", 1)[-1] == f"{top}.py":
        where = f"`{module_file}`"
    else:
        return "unrecognized" if caps.get("partial") else None
    ctx.match.unsupported = (
        f"`{top}` resolved to {where}, not to the installed package: a file of that name shadows it. The "
        "installation is intact: rename the file (and delete its __pycache__) and rerun.")
    return "unrecognized"
