"""The dependency rule of docs/DESIGN.md, checked on the code's own imports.

Each stage imports only from the stages before it in STAGES, and no modules import each other in a
circle (lazy imports inside functions and `if TYPE_CHECKING:` imports count: they are dependencies
too). The walk reads the source with `ast`; nothing is imported.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "vllm_doctor"

# Bottom first. A stage is a top-level module or package of vllm_doctor.
STAGES = ["data", "numbers", "regex_time", "command", "sources", "facts", "events", "rules", "findings",
          "vllm_math", "refine", "remedies", "diagnosis", "checks", "reports", "streams", "tui", "cli"]
ENTRY_POINTS = {"vllm_doctor.__main__"}      # `python -m vllm_doctor`: above every stage
FACE = "vllm_doctor"                          # the package's __init__ (its version): below every stage


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, modules: set[str]) -> list[tuple[str, int]]:
    """(imported vllm_doctor module, line) for every import statement, wherever it stands. `from pkg
    import mod` depends on pkg.mod, `from pkg.mod import Name` on pkg.mod."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in modules else target, node.lineno))
    return [(t, ln) for t, ln in found if t == "vllm_doctor" or t.startswith("vllm_doctor.")]


def graph() -> dict[str, dict[str, int]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    for name, path in modules.items():
        for target, line in imports_of(path, name, set(modules)):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges[name].setdefault(target, line)
    return edges


def stage_of(module: str) -> int | None:
    if module in ENTRY_POINTS:
        return len(STAGES)
    if module == FACE:
        return -1
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def _stage_name(i: int) -> str:
    return "the package face" if i < 0 else STAGES[i] if i < len(STAGES) else "an entry point"


def upward_imports(edges: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for source, targets in edges.items():
        for target, line in targets.items():
            s, t = stage_of(source), stage_of(target)
            if s is None or t is None:
                continue
            if t > s:
                bad.append(f"{source}:{line} imports {target} ({_stage_name(s)} may not import "
                           f"{_stage_name(t)}, a later stage)")
    return bad


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_stage():
    strays = [m for m in graph() if stage_of(m) is None]
    assert not strays, f"modules outside every stage of STAGES (add them to a stage package): {strays}"


def test_no_stage_imports_a_later_stage():
    bad = upward_imports(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_circles():
    found = circles(graph())
    assert not found, "modules that import each other in a circle: " + "; ".join(" -> ".join(c) for c in found)


def test_nothing_imports_cli():
    importers = sorted(f"{s}:{ln}" for s, ts in graph().items() if not s.startswith("vllm_doctor.cli")
                       and s not in ENTRY_POINTS for t, ln in ts.items() if t.startswith("vllm_doctor.cli"))
    assert not importers, f"cli/ is the top: only the entry points may import it, not {importers}"


# The checks above are only worth something if they can fail: run them on made-up import graphs.
@pytest.mark.parametrize("edges, upward, circular", [
    ({"vllm_doctor.sources.scan": {"vllm_doctor.remedies.nccl": 3}, "vllm_doctor.remedies.nccl": {}}, 1, 0),
    ({"vllm_doctor.remedies.nccl": {"vllm_doctor.sources.scan": 3}, "vllm_doctor.sources.scan": {}}, 0, 0),
    ({"vllm_doctor.command.a": {"vllm_doctor.command.b": 1}, "vllm_doctor.command.b": {"vllm_doctor.command.a": 1}},
     0, 1),
])
def test_the_checks_catch_violations(edges, upward, circular):
    assert len(upward_imports(edges)) == upward
    assert len(circles(edges)) == circular
