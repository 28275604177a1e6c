"""The model-registry subprocess failing is install-broken only when vLLM itself does not import there, not when
the process's environment stops it. Python's getpass.getuser() (torch's inductor cache path asks it at import)
raises `KeyError: 'getpwuid(): uid not found: N'` where the process runs under a UID with no passwd entry and no
USER/LOGNAME in its environment: OpenShift's arbitrary UIDs, `docker run --user N` (vllm#44548, llm-d). The
installation is intact; no rule names that, so the failure stays the exception it is, with why in its note."""
from __future__ import annotations

from vllm_doctor.findings import RefineContext
from vllm_doctor.refine import version_skew

REGISTRY_PATTERNS = ("inspect-error", "inspect-failed", "registry-subprocess", "registry-subprocess-wrapped")


def classify(ctx: RefineContext) -> str | None:
    if ctx.match.pattern.name == "plugin-signature-mismatch":
        return version_skew.classify(ctx)
    uid = ctx.facts.get("log.uid_without_user")
    if ctx.match.pattern.name not in REGISTRY_PATTERNS or uid is None:
        return None
    ctx.match.unsupported = (
        f"The model-registry subprocess stopped at Python's getpass.getuser(): UID {uid} has no passwd entry and "
        "the environment names no USER, so torch's cache path cannot be built. The installation is intact: set USER "
        "(and HOME to a writable directory) in the container, or run it as a UID the image knows.")
    return "unrecognized"
