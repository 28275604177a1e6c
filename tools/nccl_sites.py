"""NCCL's failure messages as sites, and what the doctor makes of each: shared by tools/harvest_nccl.py (which
writes docs/coverage/nccl-sites.jsonl and nccl.md) and tests/test_nccl_coverage.py (which keeps the table true).

A site is one `WARN(...)` format string of NCCL's source (`{name}` where NCCL fills in a value) or one
`ncclGetErrorString` text, with where it is and the releases it is in. NCCL prints a WARN as
`host:pid:tid [dev] file.cc:line NCCL WARN <message>` just before the call fails; the caller (PyTorch's
ProcessGroupNCCL, vLLM's pynccl) then raises with the result's text (`NCCL error: unhandled system error (run
with NCCL_DEBUG=INFO for details)`). So a WARN's mapping is the rule the real engine names for that pair of
lines -- the rule that the WARN makes more specific than nccl-generic -- or `other:<reason>`.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from vllm_sites import HOLE, ROOT, Site, first_finding, literal_chars, render, read_reviews, write_sites  # noqa: F401

SITES_FILE = ROOT / "docs" / "coverage" / "nccl-sites.jsonl"
TABLE_FILE = ROOT / "docs" / "coverage" / "nccl.md"
REVIEWS_FILE = ROOT / "docs" / "coverage" / "nccl-reviews.jsonl"

# Why a site maps to no rule more specific than nccl-generic. Fixed: a new reason is a decision, made here.
OTHER_REASONS = {
    "built-at-run-time": "the message has under 12 characters of fixed text (a `%s` passed through, a "
                         "propagation trace `file:line -> code`): nothing a pattern could read",
    "result-text": "an ncclResult_t's own text (ncclGetErrorString): nccl-generic reads it, the WARN before it "
                   "says more",
    "config-check": "an NCCL_* variable (or a plugin's) has a value NCCL cannot use; the message names it and "
                    "NCCL_DEBUG=WARN shows it",
    "api-misuse": "the caller (PyTorch, vLLM, a plugin) passed an argument or made a call NCCL rejects: a bug "
                  "above NCCL, not the set-up",
    "internal-check": "an invariant of NCCL's own code or data (an unknown enum, a size that cannot happen)",
    "plugin": "an optional plugin (net, tuner, profiler, env, collnet) failed to load or answer; NCCL goes on "
              "with its own or fails with the plugin's message",
    "feature-unsupported": "a feature asked for (NVLS, CollNet, user buffer registration, symmetric memory, "
                           "multi-node NVLink, CUDA graph capture of a call) is unsupported on this system or "
                           "combination; NCCL falls back or refuses",
    "value-decides": "a wrapper around a value (a CUDA error string, strerror, a system call's name, an errno): "
                     "the rules read the value, as in `Cuda failure 'out of memory'` (cuda-oom-runtime) or `Call to "
                     "posix_fallocate failed : No space left on device` (nccl-shm)",
    "environment-failure": "an OS, CUDA or driver call failed as it happened (memory, files, threads, a "
                           "device query) with no cause beyond it that a rule could name",
    "while-running": "raised while collectives run (an abort, a remote error, a proxy or network progress "
                     "failure mid-operation), after the start-up",
    "not-reviewed": "no rule names it and no one has decided yet: the backlog this table exists to shrink",
}

# The areas of NCCL's source, by path prefix (first match wins)
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bootstrap", ("src/bootstrap",)),
    ("network transport", ("src/transport/net", "src/transport/coll_net", "src/misc/socket", "src/misc/ibvwrap",
                           "src/misc/ibvsymbols", "src/misc/mlx5dv", "src/transport/gin", "src/gin/")),
    ("shared memory transport", ("src/transport/shm",)),
    ("peer-to-peer transport", ("src/transport/p2p", "src/transport/nvls", "src/transport/generic")),
    ("proxy", ("src/proxy",)),
    ("topology and graph", ("src/graph/",)),
    ("plugins", ("src/plugin/", "src/net.cc", "src/misc/net", "src/tuner", "src/profiler")),
    ("CUDA, NVML and memory", ("src/misc/cudawrap", "src/misc/nvmlwrap", "src/allocator", "src/include/alloc",
                               "src/misc/shmutils", "src/include/checks", "src/misc/utils", "src/mnnvl")),
    ("buffer registration", ("src/register/",)),
    ("RAS", ("src/ras/",)),
    ("init and communicators", ("src/init", "src/channel", "src/transport.cc", "src/misc/argcheck")),
    ("enqueue and groups", ("src/enqueue", "src/group", "src/collectives", "src/device/", "src/sym", "src/ce_coll",
                            "src/scheduler", "src/dev_runtime")),
)

# The engine's reading of a WARN is taken just before PyTorch raises with the result's text
GENERIC_FAILURE = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                   "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
ENV_VAR = re.compile(r"\bNCCL_[A-Z][A-Z0-9_]{2,}")
PLUGIN_WORDS = re.compile(r"(?i)\bplugin\b|dlopen|dlsym|ncclNet(?:Plugin)?_v\d|ncclTuner|ncclProfiler|ncclCollNet")
FEATURE_WORDS = re.compile(r"(?i)\bNVLS\b|CollNet|\bMNNVL\b|user ?buffer registration|symmetric|not supported|"
                           r"unsupported|graph capture|capturing")


# What NCCL fills in, by the hole's name (lower case), before tools/vllm_sites.PLAUSIBLE: a peer as
# ncclSocketToString prints it, an OS error's text, an InfiniBand completion status
NCCL_VALUES: tuple[tuple[str, str], ...] = (
    (r"recv_from_send_to", "recv from"), (r"sockettostring|addr|sockstr|remote", "10.0.0.2<43215>"),
    (r"strerror|errcode|wsaerror", "Connection refused"), (r"ibvwcstatusstr", "transport retry counter exceeded"),
    (r"wc_status|wc_i_status", "12"), (r"funcname", "socketPollConnect"), (r"version", "22105"), (r"ifenv|ifname", "eth9"), (r"devname|dev_devname", "mlx5_0"),
)


def area_of(path: str) -> str:
    for area, prefixes in AREAS:
        if path.startswith(prefixes):
            return area
    return "misc"


# A hole whose value depends on where it is: the verbs wrappers' {name} is the verb they wrap
WHERE_VALUES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("src/misc/ibvwrap.cc", ((r"^name$", "ibv_reg_mr"),)),
    ("src/misc/mlx5dvwrap.cc", ((r"^name$", "mlx5dv_create_qp"),)),
)


def log_lines(site: Site) -> list[str]:
    """The lines NCCL and its caller print for the site: a WARN then the caller's error, or the caller's error
    with the result's text."""
    first = next((values for prefix, values in WHERE_VALUES if site.where and site.where[0].startswith(prefix)), ())
    # printf's %m is errno's text
    text = render(site.template, first + NCCL_VALUES).replace("%m", "Cannot allocate memory")
    if site.kind == "ncclResult":
        return [f"RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, {text}, "
                "NCCL version 2.21.5"]
    file = site.where[0].split(":", 1)[0].removeprefix("src/") if site.where else "init.cc"
    return [f"node-1:4242:4300 [0] {file}:100 NCCL WARN {text}", GENERIC_FAILURE]


def engine_rule(lines: list[str], catalog) -> str | None:
    rule = first_finding(lines, catalog)
    return None if rule == "unrecognized" else rule


def mapping(site: Site, catalog) -> str:
    """The rule the engine names for the site's lines when it is not the caller's generic one alone; nccl-generic
    only when the WARN by itself is read as nccl-generic; else other:<reason>."""
    lines = log_lines(site)
    rule = engine_rule(lines, catalog)
    if site.kind == "ncclResult":
        return rule if rule and rule != "nccl-generic" else "other:" + other_reason(site)
    if rule and rule != "nccl-generic":
        return rule
    if rule == "nccl-generic" and engine_rule(lines[:1], catalog) == "nccl-generic":
        return rule
    return "other:" + other_reason(site)


def other_reason(site: Site) -> str:
    """From what the message and its place say, else the site's review, else not-reviewed."""
    if literal_chars(site.template) < 12:
        return "built-at-run-time"
    if site.kind == "ncclResult":
        return "result-text"
    review = load_reviews().get(site.template)
    if review:
        return review[0]
    if ENV_VAR.search(HOLE.sub("", site.template)):
        return "config-check"
    if site.area == "plugins" or PLUGIN_WORDS.search(site.template):
        return "plugin"
    return "not-reviewed"


@lru_cache(maxsize=1)
def load_reviews() -> dict[str, tuple[str, str]]:
    return {r["template"]: (r["reason"], r["why"]) for r in read_reviews(REVIEWS_FILE)}


def write(releases: list[str], sites: list[Site]) -> None:
    write_sites(releases, sites, SITES_FILE, note="generated by tools/harvest_nccl.py; see docs/coverage/nccl.md")
    TABLE_FILE.write_text(table_markdown(releases, sites), "utf-8")


def table_markdown(releases: list[str], sites: list[Site]) -> str:
    from vllm_sites import coverage_tables

    intro = ("# NCCL's failure messages and the rules that read them\n\n"
             "Generated by `tools/harvest_nccl.py` from NCCL's source at each release below "
             "(tests/test_nccl_coverage.py keeps it true). A site is a `WARN(...)` format string (`{name}`: a value "
             "NCCL fills in) or an `ncclGetErrorString` text. A WARN maps to the rule the real engine names when the "
             "WARN comes before PyTorch's `NCCL error: unhandled system error` -- the rule the WARN makes more "
             "specific than nccl-generic. `other:` reasons:\n")
    return coverage_tables(intro, OTHER_REASONS, releases, sites, sort_key=_release_key)


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", release))


def load(path: Path = SITES_FILE):
    from vllm_sites import load_sites

    return load_sites(path)
