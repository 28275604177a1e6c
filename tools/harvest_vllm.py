#!/usr/bin/env python3
"""Harvest what vLLM can say at start-up, release by release: every `raise X(...)`, `logger.error/warning/
exception/critical(...)` and `assert ..., msg` in the files of the start-up path, as message templates.

Not run at diagnosis time. Input: vLLM sources, each a release name and either a directory that holds the
`vllm/` package or a source distribution (`vllm-X.Y.Z.tar.gz`, read without unpacking):

    python3 tools/harvest_vllm.py 0.6.6=vllm-0.6.6.post1.tar.gz 0.32.0=~/src/vllm

Output: docs/coverage/vllm-sites.jsonl (one line per distinct message: template, kind, exception type, area,
where it is, the releases it appears in, and its mapping: the rule the real engine names for it, or
`other:<reason>`) and docs/coverage/vllm.md, the table (tools/vllm_sites.py). A template keeps the message's
literal text; what the code fills in at run time (f-string holes, `%s` arguments, `.format` fields) becomes
`{name}`, named after the expression. `--remap` redoes the mappings of the data file without the sources
(after a rule changed).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_sites import Site, func_name, load_sites, mapping, table_markdown, write_sites, TABLE_FILE  # noqa: E402

# The start-up path: (area, path prefixes relative to the package root). The first matching area wins.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("arguments and config", ("vllm/engine/arg_utils.py", "vllm/config.py", "vllm/config/",
                              "vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/cli/", "vllm/utils/argparse",
                              "vllm/entrypoints/utils.py", "vllm/scripts.py")),
    ("platforms and devices", ("vllm/platforms/", "vllm/envs.py", "vllm/_custom_ops.py", "vllm/utils/platform",
                               "vllm/device_allocator/")),
    ("executors", ("vllm/executor/", "vllm/v1/executor/", "vllm/ray/")),
    ("workers and device init", ("vllm/worker/", "vllm/v1/worker/")),
    ("distributed init", ("vllm/distributed/parallel_state.py", "vllm/distributed/utils.py",
                          "vllm/distributed/device_communicators/", "vllm/distributed/communication_op.py",
                          "vllm/distributed/kv_transfer/")),
    ("model loading", ("vllm/model_executor/model_loader/", "vllm/transformers_utils/",
                       "vllm/model_executor/models/registry.py", "vllm/model_executor/models/__init__.py",
                       "vllm/model_executor/models/utils.py", "vllm/model_executor/models/interfaces",
                       "vllm/model_executor/parameter.py", "vllm/model_executor/utils.py")),
    ("quantization", ("vllm/model_executor/layers/quantization/",)),
    ("layers and kernels", ("vllm/model_executor/layers/linear.py", "vllm/model_executor/layers/vocab_parallel",
                            "vllm/model_executor/layers/fused_moe/", "vllm/model_executor/layers/rotary_embedding",
                            "vllm/attention/", "vllm/v1/attention/", "vllm/model_executor/layers/attention")),
    ("KV cache sizing", ("vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/kv_cache_manager.py",
                         "vllm/worker/cache_engine.py", "vllm/core/block_manager", "vllm/v1/kv_cache_interface.py",
                         "vllm/v1/core/sched/", "vllm/core/scheduler.py")),
    ("engine start-up", ("vllm/engine/llm_engine.py", "vllm/engine/async_llm_engine.py",
                         "vllm/engine/multiprocessing/", "vllm/v1/engine/", "vllm/v1/utils.py",
                         "vllm/utils.py", "vllm/utils/__init__.py", "vllm/utils/system_utils.py",
                         "vllm/utils/network_utils.py", "vllm/utils/mem_utils.py")),
    ("entrypoints", ("vllm/entrypoints/openai/api_server.py", "vllm/entrypoints/api_server.py",
                     "vllm/entrypoints/llm.py", "vllm/entrypoints/launcher.py", "vllm/entrypoints/openai/serving_models",
                     "vllm/entrypoints/serve/")),
)

# Inside the areas, what runs after start-up or only checks vLLM's own shapes: KV connectors' transfer code
# (their factory and set-up stay), kernel ops; and asserts in layers, kernels and quantization methods
# (forward-time shape invariants).
EXCLUDED = ("vllm/distributed/kv_transfer/kv_connector/v1/", "vllm/distributed/kv_transfer/kv_pipe/",
            "vllm/distributed/kv_transfer/kv_lookup_buffer/", "vllm/v1/attention/ops/", "vllm/attention/ops/")
NO_ASSERTS = ("layers and kernels", "quantization")

# logger method -> the level it logs at
LOG_LEVELS = {"error": "error", "error_once": "error", "warning": "warning", "warn": "warning",
              "warning_once": "warning", "exception": "exception", "critical": "critical", "fatal": "fatal"}
LOGGER_NAMES = {"logger", "log", "_logger", "LOGGER", "logging", "init_logger"}


def area_of(path: str) -> str | None:
    if path.startswith(EXCLUDED):
        return None
    for area, prefixes in AREAS:
        if any(path.startswith(p) for p in prefixes):
            return area
    return None


def _hole(node: ast.AST) -> str:
    """A name for what the code fills in: the expression, reduced to an identifier."""
    try:
        text = ast.unparse(node)
    except Exception:   # pragma: no cover - ast.unparse handles every node the parser makes
        text = "value"
    text = re.sub(r"^self\.|\(\)$", "", text)
    name = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_").lower()
    return (name or "value")[:40]


def template_of(node: ast.AST | None) -> str | None:
    """The literal text of a message expression with named holes; None when nothing of it is literal."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                parts.append("{" + _hole(v.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template_of(node.left), template_of(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else "{" + _hole(node.left) + "}") + \
               (right if right is not None else "{" + _hole(node.right) + "}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):       # "..." % (a, b)
        fmt = template_of(node.left)
        if fmt is None:
            return None
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        return percent_fill(fmt, [_hole(a) for a in args])
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"):
        fmt = template_of(node.func.value)
        if fmt is None:
            return None
        positional = [_hole(a) for a in node.args]
        named = {k.arg: _hole(k.value) for k in node.keywords if k.arg}
        counter = iter(range(len(positional)))

        def field_name(m: re.Match) -> str:
            key = m.group(1).split(":", 1)[0].split("!", 1)[0]
            if key == "":
                i = next(counter, None)
                return "{" + (positional[i] if i is not None else "value") + "}"
            if key.isdigit():
                i = int(key)
                return "{" + (positional[i] if i < len(positional) else "value") + "}"
            return "{" + named.get(key, key) + "}"
        return re.sub(r"(?<!\{)\{([^{}]*)\}(?!\})", field_name, fmt)
    return None


PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrifgxXeE%]")


def percent_fill(fmt: str, names: list[str]) -> str:
    it = iter(names)

    def repl(m: re.Match) -> str:
        if m.group(0) == "%%":
            return "%"
        named = re.match(r"%\(([^)]*)\)", m.group(0))
        if named:
            return "{" + named.group(1) + "}"
        return "{" + next(it, "value") + "}"
    return PERCENT.sub(repl, fmt)


class Collector(ast.NodeVisitor):
    def __init__(self, path: str, area: str):
        self.path, self.area = path, area
        self.stack: list[str] = []
        self.sites: list[Site] = []

    def _func(self) -> str:
        return ".".join(self.stack) or "<module>"

    def visit_FunctionDef(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    def add(self, kind: str, exc: str, text: str | None) -> None:
        if text is not None and text.strip():
            self.sites.append(Site(" ".join(text.split()), kind, exc, self.area, [f"{self.path}:{self._func()}"]))

    def visit_Raise(self, node):
        exc = node.exc
        if isinstance(exc, ast.Call):
            name = exc.func.attr if isinstance(exc.func, ast.Attribute) else getattr(exc.func, "id", "")
            msg = exc.args[0] if exc.args else next((k.value for k in exc.keywords if k.arg in ("msg", "message")), None)
            text = template_of(msg)
            # `raise RuntimeError("… not supported for ", f"the current GPU. Min capability: {m}. ", …)`: a tuple of
            # strings, printed as one; every part is the message
            parts = [template_of(a) for a in exc.args[1:]]
            if text is not None and parts and all(p is not None for p in parts):
                text += "".join(parts)
            if name:
                self.add("raise", name, text)
        self.generic_visit(node)

    def visit_Assert(self, node):
        if node.msg is not None and self.area not in NO_ASSERTS:
            self.add("assert", "AssertionError", template_of(node.msg))
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in LOG_LEVELS and node.args
                and (getattr(f.value, "id", None) in LOGGER_NAMES or getattr(f.value, "attr", None) in LOGGER_NAMES)):
            text = template_of(node.args[0])
            if text is not None and len(node.args) > 1 and PERCENT.search(text):     # logger.x("%s", value)
                text = percent_fill(text, [_hole(a) for a in node.args[1:]])
            self.add(f"logger.{LOG_LEVELS[f.attr]}", "", text)
        self.generic_visit(node)


def sources(spec: str):
    """(path relative to the package root, text) for each start-up file of one source."""
    root = Path(spec).expanduser()
    if root.is_file():
        with tarfile.open(root) as tar:
            for member in tar:
                if not member.isfile() or not member.name.endswith(".py"):
                    continue
                rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                if area_of(rel):
                    yield rel, tar.extractfile(member).read().decode("utf-8", "replace")
        return
    for path in sorted(root.rglob("vllm/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if area_of(rel):
            yield rel, path.read_text("utf-8", "replace")


def harvest(release: str, spec: str) -> list[Site]:
    sites: list[Site] = []
    for rel, text in sources(spec):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        c = Collector(rel, area_of(rel))
        c.visit(tree)
        for site in c.sites:
            site.releases = [release]
        sites += c.sites
    return sites


def merge(per_release: list[list[Site]]) -> list[Site]:
    """One entry per message (kind, exception, template), with every place it is raised and its releases."""
    merged: dict[tuple, Site] = {}
    for sites in per_release:
        for s in sites:
            have = merged.setdefault((s.kind, s.exc, s.template), Site(s.template, s.kind, s.exc, s.area))
            for place in s.where:
                if place not in have.where:
                    have.where.append(place)
            for r in s.releases:
                if r not in have.releases:
                    have.releases.append(r)
    return sorted(merged.values(), key=lambda s: (s.area, s.template, s.kind, s.exc))


def remap(releases: list[str], sites: list[Site]) -> None:
    from vllm_doctor.rules.catalog import load_catalog

    catalog = load_catalog()
    for s in sites:
        s.maps = mapping(s, catalog)
    write_sites(releases, sites)
    TABLE_FILE.write_text(table_markdown(releases, sites), "utf-8")
    counts: dict[str, int] = {}
    for s in sites:
        key = "rule" if not s.maps.startswith("other:") else s.maps
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(sites)} messages: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)


def add_examples() -> int:
    from vllm_doctor.rules.catalog import load_catalog
    from vllm_sites import has_example, log_line

    catalog = load_catalog()
    _, sites = load_sites()
    added, left = 0, []
    for s in sites:
        rule = catalog.rules.get(s.maps)
        if rule is None or has_example(s, rule):
            continue
        text = log_line(s)
        pattern = next((p for p in rule.patterns if p.search(text)), None)
        if pattern is None:       # read only by a refine, raised_in or a retyped-text reading: a person decides
            left.append(f"{s.maps}: {text}")
            continue
        block = (f"\n[[examples]]\n# rendered from vLLM's template ({s.where[0]}, {s.releases[0]}"
                 f"{'..' + s.releases[-1] if len(s.releases) > 1 else ''})\n"
                 f"text = {json.dumps(text, ensure_ascii=False)}\npattern = \"{pattern.name}\"\n")
        with open(rule.path, "a", encoding="utf-8") as f:
            f.write(block)
        rule.examples.append({"text": text})    # a second template of the same message finds it
        added += 1
    print(f"{added} examples added; {len(left)} templates no pattern reads exactly:", file=sys.stderr)
    for line in left:
        print("  " + line, file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", nargs="*", help="RELEASE=PATH (a directory holding vllm/, or an sdist .tar.gz), "
                                              "oldest first")
    ap.add_argument("--remap", action="store_true", help="redo the mappings of the data file (no sources)")
    ap.add_argument("--add-examples", action="store_true",
                    help="append to each rule file an example rendered from each template mapped to it that "
                         "no example of the rule shows yet (the pattern that reads it named)")
    a = ap.parse_args(argv)
    if a.add_examples:
        return add_examples()
    if a.remap:
        releases, sites = load_sites()
        remap(releases, sites)
        return 0
    if not a.source:
        ap.error("give RELEASE=PATH sources, or --remap")
    per, releases = [], []
    for spec in a.source:
        release, _, path = spec.partition("=")
        if not path:
            ap.error(f"{spec}: expected RELEASE=PATH")
        releases.append(release)
        per.append(harvest(release, path))
        print(f"{release}: {len(per[-1])} sites", file=sys.stderr)
    remap(releases, merge(per))
    return 0


if __name__ == "__main__":
    sys.exit(main())
