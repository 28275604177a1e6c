"""A rule's `remedy` and `refine` hooks: "module:function" in vllm_doctor.remedies / vllm_doctor.refine.

They are checked without importing them (rules sit below remedies in the stage order): the module file
must exist in that package's directory and define the function at top level. `resolve_hook` is the one
place a checked spec is imported, when a finding first needs it."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from vllm_doctor.rules.errors import CatalogError

HOOK_PACKAGES = {"remedy": "remedies", "refine": "refine"}
_SPEC = r"([A-Za-z_]\w*):([A-Za-z_]\w*)"       # re compiles these at the first check: a cached catalog has none
_TOP_LEVEL = r"(?:async[ \t]+)?def[ \t]+(\w+)|(\w+)[ \t]*(?::[^=]*)?=(?!=)"
_FROM_IMPORT = r"from[ \t]+[\w.]+[ \t]+import[ \t]+\(?([^()#]*)"


@lru_cache(maxsize=8)
def package_dir(package: str) -> Path:
    return Path(__file__).resolve().parent.parent / package


@lru_cache(maxsize=64)
def _defined_names(path: str, mtime_ns: int) -> frozenset[str] | None:
    """Names a module defines at top level (`def f(`, `f = ...`, `from m import f`), from its unindented
    lines: a cheap look that is right for every module of ours. None: the file cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    names = set()
    for line in text.splitlines():
        if line.startswith("from "):            # a re-export: `from .x import fix_a, fix_b as fix_c`
            m = re.match(_FROM_IMPORT, line)
            if m:
                names.update(part.split()[-1] for part in m.group(1).split(",") if part.strip())
        elif line[:1].isalpha() or line[:1] == "_":
            m = re.match(_TOP_LEVEL, line)
            if m:
                names.add(m.group(1) or m.group(2))
    return frozenset(names)


@lru_cache(maxsize=64)
def _bound_names(path: str, mtime_ns: int) -> frozenset[str]:
    """Every name a module binds at top level (imports included), from its syntax tree: exact, and only
    needed when the cheap look missed (a re-exported function, or a spec that is wrong)."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def check_hook_spec(kind: str, spec: object, where: str) -> None:
    """Raise CatalogError unless `spec` ("module:function") names a top-level function of a module in the
    vllm_doctor.remedies (kind "remedy") or vllm_doctor.refine (kind "refine") package directory. Nothing
    is imported: rules sit below remedies in the stage order."""
    package = HOOK_PACKAGES[kind]
    if not isinstance(spec, str) or not re.fullmatch(_SPEC, spec):
        raise CatalogError(f"{where}: {kind} {spec!r} is not 'module:function'")
    module, func = spec.split(":")
    directory = package_dir(package)
    for path, shown in ((directory / f"{module}.py", f"{package}/{module}.py"),
                        (directory / module / "__init__.py", f"{package}/{module}/__init__.py")):
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            continue
        names = _defined_names(str(path), mtime)
        if names is None:
            raise CatalogError(f"{where}: {kind} {spec!r}: cannot read {shown}")
        if func in names or func in _bound_names(str(path), mtime):
            return
        raise CatalogError(f"{where}: {kind} {spec!r}: no function {func} in {shown}")
    raise CatalogError(f"{where}: {kind} {spec!r}: no module {module} in {package}/")


def resolve_hook(kind: str, spec: str):
    """The function a checked spec names, imported when a finding first needs it (the one place a rule's
    remedy or refine hook is looked up; the import is by name, so rules still import nothing above them)."""
    import importlib

    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(f"vllm_doctor.{HOOK_PACKAGES[kind]}.{module}"), func)


def hook_files(rules: Iterable) -> set[Path]:
    """The module files check_hook_spec looks in for these rules' specs (both candidates of each)."""
    paths = set()
    for rule in rules:
        for kind, package in HOOK_PACKAGES.items():
            module = (getattr(rule, kind) or "").split(":")[0]
            if module:
                paths |= {package_dir(package) / f"{module}.py", package_dir(package) / module / "__init__.py"}
    return paths
