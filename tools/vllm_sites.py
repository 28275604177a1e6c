"""vLLM's start-up messages as sites, and what the doctor makes of each: shared by tools/harvest_vllm.py (which
writes docs/coverage/) and tests/test_vllm_coverage.py (which keeps the table true).

A site is one message template (`{name}` where vLLM fills in a value), the way it is raised or logged, and where
it is (file:function) in which releases. Its mapping is the rule the real diagnosis engine names for the message
rendered with plausible values, or `other:<reason>` from the fixed reasons below when it names none.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITES_FILE = ROOT / "docs" / "coverage" / "vllm-sites.jsonl"
TABLE_FILE = ROOT / "docs" / "coverage" / "vllm.md"

# Why a site maps to no rule. Fixed: a new reason is a decision, made here with its definition.
OTHER_REASONS = {
    "built-at-run-time": "the message has under 12 characters of fixed text: nothing a pattern could read",
    "warning": "a warning: vLLM goes on after it (a rule's warning pattern, where one exists, maps it)",
    "internal-check": "an assert: an invariant of vLLM's own code, not a check of user input",
    "not-implemented": "NotImplementedError: a combination vLLM does not build; the message names it",
    "config-check": "a check of the arguments, the engine config or a model's own config class (its config.json); "
                    "the message names the setting and the doctor shows it",
    "logged-error": "an error vLLM logs on its way down: the failure it reports carries the cause",
    "while-serving": "raised where vLLM runs or checks a request (forward, apply, execute, sampling, a request's "
                     "parameters), after the start-up",
    # given site by site in docs/coverage/reviews.jsonl (each with its one-line why), where the kind of raise
    # alone decides nothing
    "quant-config": "a quantization method refuses the checkpoint's quantization settings (bits, group size, zero "
                    "points, scheme, ignored layers) or their combination with the dtype or other flags, whatever "
                    "the GPU; the message names them",
    "kernel-support": "a kernel or attention backend refuses a shape, dtype or feature it does not implement (head "
                      "size, block size, sliding window, KV-cache dtype), whatever the GPU generation",
    "model-code": "a check inside one model's implementation or processor of that model's checkpoint, config or "
                  "inputs",
    "checkpoint-content": "the checkpoint's files do not match what the loader or model expects (missing or "
                          "unexpected tensors, shapes, unreadable files, a missing tokenizer file)",
    "optional-package": "a package an optional feature needs is missing or too old; the message names it",
    "environment-failure": "an OS, network, file-system or subprocess failure reported as it happens (a helper "
                           "service's timeout, a refused connection, a full disk), no rule's cause",
    "internal-state": "raised on vLLM's own state that user input cannot reach (a bug, a wrong call order, an "
                      "impossible branch)",
    "not-reviewed": "no rule names it and no one has decided yet: the backlog this table exists to shrink",
}
REVIEWS_FILE = ROOT / "docs" / "coverage" / "reviews.jsonl"

# Values a template's holes get, by what their name says (first match wins): numbers where rules read numbers.
PLAUSIBLE: tuple[tuple[str, str], ...] = (
    (r"^n_|^len_", "2"), (r"ips$|_ids$|^list_|_keys$", "['10.0.0.1', '10.0.0.2']"),
    (r"min_cap|required_cap|min_capability", "80"), (r"head", "40"), (r"tensor_parallel|tp_size|\btp\b|world_size", "3"), (r"pipeline|pp_size", "2"),
    (r"capab", "75"), (r"version", "0.6.0"), (r"dtype", "bfloat16"), (r"device_str|device_type|device_name", "GPU"), (r"env_var$", "CUDA_VISIBLE_DEVICES"),
    (r"control_env$|visible_devices$", "0,2"), (r"device_id$|device_index$", "3"), (r"device_count$", "2"), (r"device", "cuda:1"), (r"port", "8000"),
    (r"architectures|archs", "['FooForCausalLM']"), (r"memory|gib|_gb|bytes|mem", "12.5"),
    (r"derived|available|free", "2048"), (r"group|block|thread|pack|tile", "128"),
    # not a multiple of any group or tile size: a size the message says does not divide reads as one that does not
    (r"len|length|tokens|size|num|count|partition", "4100"),
    (r"model|name|path|arch", "meta-llama/Llama-3.1-8B"), (r"quant", "awq"), (r"backend", "FLASH_ATTN"),
)


@dataclass
class Site:
    template: str
    kind: str                 # raise, assert, logger.error, logger.warning, logger.exception, ...
    exc: str                  # the exception type raised; AssertionError for asserts; "" for logger calls
    area: str
    where: list[str] = field(default_factory=list)      # "path:function", each once
    releases: list[str] = field(default_factory=list)
    maps: str = ""            # a rule id, or other:<reason>

    def as_json(self) -> str:
        return json.dumps({"template": self.template, "kind": self.kind, "exc": self.exc, "area": self.area,
                           "where": self.where, "releases": self.releases, "maps": self.maps},
                          ensure_ascii=False, sort_keys=False)


def load_sites(path: Path = SITES_FILE) -> tuple[list[str], list[Site]]:
    """(the releases harvested, the sites) from the data file; its first line is the header."""
    lines = path.read_text("utf-8").splitlines()
    header = json.loads(lines[0])
    return header["releases"], [Site(**json.loads(ln)) for ln in lines[1:] if ln.strip()]


def write_sites(releases: list[str], sites: list[Site], path: Path = SITES_FILE,
                note: str = "generated by tools/harvest_vllm.py; see docs/coverage/vllm.md") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"releases": releases, "note": note})
    path.write_text("\n".join([header] + [s.as_json() for s in sites]) + "\n", "utf-8")


HOLE = re.compile(r"\{([A-Za-z0-9_]*)\}")


def func_name(place: str) -> str:
    """The bare function name of a `path:Class.function` place: what a traceback frame shows of it."""
    return place.split(":", 1)[1].rsplit(".", 1)[-1]


def literal_chars(template: str) -> int:
    return len(HOLE.sub("", template).strip(" .:,;'\"()[]"))


def render(template: str, first: tuple[tuple[str, str], ...] = ()) -> str:
    """The message with each hole filled by a plausible value for its name (`first`: values tried before these)."""
    def value(m: re.Match) -> str:
        name = m.group(1).lower()
        for pattern, val in (*first, *PLAUSIBLE):
            if re.search(pattern, name):
                return val
        return "8"            # a number by default: rules read numbers, and a name seldom decides a match
    return HOLE.sub(value, template)


def log_line(site: Site) -> str:
    """The rendered message as vLLM prints it: an exception line, or its logger's header at the level."""
    text = render(site.template)
    if site.kind in ("raise", "assert"):
        return f"{site.exc or 'AssertionError'}: {text}"
    level = {"logger.warning": "WARNING", "logger.critical": "CRITICAL", "logger.fatal": "CRITICAL"}.get(site.kind, "ERROR")
    file = site.where[0].split(":", 1)[0].rsplit("/", 1)[-1] if site.where else "x.py"
    return f"{level} 01-01 00:00:00 [{file}:1] {text}"


def template_regex(template: str) -> re.Pattern:
    """What the template says, as a regex: its literal text (spaces loose), any value where a hole is."""
    parts = HOLE.split(template)
    return re.compile("".join(re.escape(p).replace(r"\ ", r"\s*") if i % 2 == 0 else ".*?"
                              for i, p in enumerate(parts)))


def has_example(site: Site, rule) -> bool:
    """One of the rule's examples is this template's message (rendered with some values)."""
    wanted = template_regex(site.template)
    return any(wanted.search(e["text"]) for e in rule.examples)


# Functions that run per request or per step, by name: a site only in these is no start-up failure
SERVING_FUNCS = re.compile(r"^(?:_?forward\w*|apply\w*|__call__|execute_model|_?execute\w*|step|_?sample\w*|"
                           r"add_request|process_inputs|_?validate_(?:inputs|params|logprobs|structured_output|"
                           r"model_input|prompt\w*)|generate|encode|embed|chat|score|_?update_states|"
                           r"_?prepare_inputs\w*)$")


def other_reason(site: Site) -> str:
    """The reason a site the engine names no rule for maps to `other:` (OTHER_REASONS): from the kind of raise
    and where it is, else the site's review, else not-reviewed."""
    if literal_chars(site.template) < 12:
        return "built-at-run-time"
    if site.where and all(SERVING_FUNCS.match(func_name(w)) for w in site.where):
        return "while-serving"
    if site.kind == "logger.warning":
        return "warning"
    if site.kind == "assert":
        return "internal-check"
    if site.exc == "NotImplementedError":
        return "not-implemented"
    if site.area == "arguments and config" and site.exc in ("ValueError", "TypeError", "ArgumentTypeError",
                                                            "ArgumentError", "ValidationError", "KeyError"):
        return "config-check"
    if site.exc in ("ValueError", "TypeError", "KeyError") and site.where and all(
            "/transformers_utils/configs/" in w for w in site.where):
        return "config-check"         # a model's own PretrainedConfig subclass rejecting its config.json
    if site.kind.startswith("logger."):
        return "logged-error"
    review = load_reviews().get(site.template)
    return review[0] if review else "not-reviewed"


@lru_cache(maxsize=1)
def load_reviews() -> dict[str, tuple[str, str]]:
    """template -> (reason, why): the sites someone read and gave a reason (docs/coverage/reviews.jsonl)."""
    return {r["template"]: (r["reason"], r["why"]) for r in read_reviews()}


def read_reviews(path: Path = REVIEWS_FILE) -> list[dict]:
    """The review entries, in file order ({template, reason, why}); none when the file is absent."""
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text("utf-8").splitlines() if ln.strip()]


def first_finding(lines: list[str], catalog) -> str | None:
    """The rule (or `unrecognized`) the real diagnosis engine names first for these log lines; None: no finding.
    The one reading the coverage tables (vLLM's, NCCL's, the stack's) take of a message."""
    from vllm_doctor.diagnosis.engine import Diagnoser
    from vllm_doctor.facts import Facts
    from vllm_doctor.sources.scan import Scanner

    diagnoser = Diagnoser(catalog, Facts())
    scanner = Scanner(diagnoser.scan_literals, diagnoser, source="site")
    scanner.feed(("\n".join(lines) + "\n").encode())
    scanner.close()
    diagnoser.lines = len(lines)
    findings = diagnoser.finish().findings
    return findings[0].rule if findings else None


def engine_rule(site: Site, catalog) -> str | None:
    """The rule the real diagnosis engine names first for the site's rendered line (None: no finding;
    'unrecognized' is no rule)."""
    rule = first_finding([log_line(site)], catalog)
    return None if rule == "unrecognized" else rule


def mapping(site: Site, catalog) -> str:
    rule = engine_rule(site, catalog)
    return rule if rule else "other:" + other_reason(site)


def misplaced(sites, catalog, reasons) -> list[tuple[str, str]]:
    """(template, mapping) of the sites mapped to neither a rule of `catalog` nor an `other:` reason of `reasons`
    (the coverage tests of vLLM's and NCCL's tables ask the same of theirs)."""
    return [(s.template, s.maps) for s in sites
            if not (s.maps[len("other:"):] in reasons if s.maps.startswith("other:") else s.maps in catalog.rules)]


def table_markdown(releases: list[str], sites: list[Site]) -> str:
    """docs/coverage/vllm.md: counts per release and per area, then every site with its mapping."""
    intro = ("# vLLM's start-up messages and the rules that read them\n\n"
             "Generated by `tools/harvest_vllm.py` from vLLM's source at each release below (tests/test_vllm_coverage.py "
             "keeps it true: every site mapped, every rule-mapped message still named by its rule through the real "
             "engine, no `other:` message named by a rule). A site is a message template: `{name}` is a value vLLM "
             "fills in. `other:` reasons:\n")
    return coverage_tables(intro, OTHER_REASONS, releases, sites)


def coverage_tables(intro: str, reasons: dict[str, str], releases: list[str], sites: list[Site],
                    sort_key=None) -> str:
    """A coverage table (docs/coverage/*.md): the intro, the reasons, counts per release and per area, then every
    site with its mapping."""
    from collections import Counter

    def bucket(s: Site) -> str:
        return "rule" if not s.maps.startswith("other:") else s.maps
    out = intro.rstrip("\n").split("\n") + [""]
    out += [f"- `other:{k}`: {v}" for k, v in reasons.items()] + [""]
    cols = ["rule"] + [f"other:{k}" for k in reasons]
    out += ["## Per release", "", "| release | sites | " + " | ".join(cols) + " |",
            "|---" * (len(cols) + 2) + "|"]
    for r in (sorted(releases, key=sort_key) if sort_key else releases):
        c = Counter(bucket(s) for s in sites if r in s.releases)
        out.append(f"| {r} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |")
    areas = sorted({s.area for s in sites})
    out += ["", "## Per area (all releases)", "", "| area | sites | " + " | ".join(cols) + " |",
            "|---" * (len(cols) + 2) + "|"]
    for a in areas:
        c = Counter(bucket(s) for s in sites if s.area == a)
        out.append(f"| {a} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in cols) + " |")
    out += ["", "## Sites mapped to a rule", "", "| rule | kind | message | where | releases |", "|---|---|---|---|---|"]
    for s in sorted((s for s in sites if not s.maps.startswith("other:")), key=lambda s: (s.maps, s.template)):
        out.append(_row(s, s.maps))
    for a in areas:
        out += ["", f"## {a}: sites mapped to no rule", "", "| mapping | kind | message | where | releases |",
                "|---|---|---|---|---|"]
        for s in sorted((s for s in sites if s.area == a and s.maps.startswith("other:")),
                        key=lambda s: (s.maps, s.template)):
            out.append(_row(s, s.maps))
    return "\n".join(out) + "\n"


def _row(s: Site, first: str) -> str:
    text = s.template if len(s.template) <= 160 else s.template[:159] + "…"
    text = text.replace("|", "\\|").replace("`", "'")
    where = s.where[0] + (f" (+{len(s.where) - 1})" if len(s.where) > 1 else "")
    span = s.releases[0] if len(s.releases) == 1 else f"{s.releases[0]}–{s.releases[-1]}"
    kind = s.kind + (f" {s.exc}" if s.exc and s.kind == "raise" else "")
    return f"| {first} | {kind} | `{text}` | {where} | {span} |"
