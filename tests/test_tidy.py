"""tidy: the project checks its own consistency, in the spirit of rustc's `tidy`.

Each check is one test whose failure names file:line and says what to do. Where the code does not meet
a check yet, the known cases sit in an exemption list beside it: a module-level constant that may only
shrink. A new violation fails the test; an exemption that is no longer needed is reported (a warning,
or a failure once STALE_EXEMPTIONS_FAIL is True) so the list gets smaller.

The checks read the code with `ast` (nothing is imported unless the check is about importing):
  a. every rule's remedy / refine spec resolves to a real function (import and getattr);
  b. every pattern name and capture name a remedy or refine hook reads exists in the rules that hook
     serves (its own rules, plus those whose refine hook relabels matches into them);
  c. every fact key read in src has a writer in src, and every key is in vllm_doctor/facts/keys.py;
  d. every `--flag` a rule's text names is in the shipped flag lists (some vLLM release had it);
  f. every `check` prediction (checks/preflight.py) is matched by a pattern of its own rule;
  g. module and (remedies) function sizes;
  plus the catalog's own load-time spec validation (rules/catalog.py) through the CLI.
(e. every rule has corpus cases: tests/test_corpus.py::test_every_rule_has_corpus_cases, left there.)
"""
from __future__ import annotations

import ast
import inspect
import re
import shutil
import warnings
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import pytest

from conftest import CORPUS_DEV, ROOT, run_cli
from vllm_doctor.rules.hooks import HOOK_PACKAGES, resolve_hook
from vllm_doctor.rules import hooks

SRC = ROOT / "src" / "vllm_doctor"
RULES = ROOT / "rules"

# An exemption that is no longer needed: True fails the test (the lists may only shrink), False warns.
STALE_EXEMPTIONS_FAIL = True


class TidyWarning(UserWarning):
    """An exemption list can shrink."""


def _stale(what: str, entries, where: str = "tests/test_tidy.py") -> None:
    entries = sorted(entries)
    if not entries:
        return
    message = f"{what}: no longer needed, remove from {where} (the list may only shrink): {entries}"
    if STALE_EXEMPTIONS_FAIL:
        pytest.fail(message)
    warnings.warn(message, TidyWarning, stacklevel=2)


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _src_files(under: str = "") -> list[Path]:
    return sorted(p for p in (SRC / under).rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=1)
def _rules() -> dict:
    from vllm_doctor.rules.catalog import load_catalog

    return load_catalog(RULES).rules


def _rule_file(rule) -> str:
    return "rules/" + Path(rule.path).name


def _spec_line(rule, key: str) -> int:
    for n, line in enumerate(Path(rule.path).read_text(encoding="utf-8").splitlines(), 1):
        if line.split("=", 1)[0].strip() == key:
            return n
    return 1


def _hooks():
    """(rule, kind, package, module, function) for every remedy/refine spec of every rule."""
    for rule in _rules().values():
        for kind, package in HOOK_PACKAGES.items():
            spec = getattr(rule, kind)
            if spec:
                module, _, func = spec.partition(":")
                yield rule, kind, package, module, func


# =========================================================================== a. specs resolve

def test_every_hook_spec_resolves_to_a_function():
    problems = []
    for rule, kind, package, module, func in _hooks():
        where = f"{_rule_file(rule)}:{_spec_line(rule, kind)}"
        try:
            fn = resolve_hook(kind, f"{module}:{func}")     # the lookup the engine and remedies/apply use
        except ImportError as exc:
            problems.append(f"{where}: {kind} '{module}:{func}': cannot import vllm_doctor.{package}.{module}: {exc}")
            continue
        except AttributeError:
            fn = None
        if not callable(fn):
            problems.append(f"{where}: {kind} '{module}:{func}': vllm_doctor.{package}.{module} has no function {func}")
            continue
        try:
            inspect.signature(fn).bind(object())
        except TypeError:
            problems.append(f"{where}: {kind} '{module}:{func}': does not take exactly one argument (the context)")
    assert not problems, "\n".join(problems)


# =========================================================================== b. names hooks read
# A small flow analysis over remedies/ and refine/: which string literals reach a capture read, a pattern
# name comparison or a fact read, directly or through helpers' parameters (`_cap(ctx, "gpu")`,
# `matches_named(ctx, "topo-row")`, `pick("heads", ("heads",), ...)`).

CAPTURE_METHODS = {"capture", "capture_int", "capture_float", "captures_all", "int_capture"}  # ctx.<m>("name")
PATTERN_METHODS = {"has_pattern", "matches_named"}                    # ctx.<m>("a", "b")
FACT_METHODS = {"fact", "fact_int", "fact_float"}                     # ctx.<m>("key", ...)
ARG_METHODS = {"arg", "arg_int", "arg_float"}                         # ctx.arg("snake") reads args.snake
CAPS_PARAMS = {"caps", "captures"}             # a parameter of that name holds a captures dict
CONTEXT_MODULE = SRC / "remedies" / "context.py"


@dataclass(frozen=True)
class Lit:
    value: str


@dataclass(frozen=True)
class Param:
    func: "Func"
    name: str
    prefix: str = ""
    suffix: str = ""


@dataclass(frozen=True)
class Dyn:
    prefix: str                # a key built at run time from this literal prefix


@dataclass(frozen=True)
class Read:
    kind: str                  # capture | pattern | fact
    value: str                 # the name or key (a Dyn's prefix + "*")
    path: Path
    line: int
    func: "Func"


class Func:
    def __init__(self, module: "Module", node, qualname: str, parent: "Func | None") -> None:
        self.module, self.node, self.qualname, self.parent = module, node, qualname, parent
        args = node.args
        self.params = [a.arg for a in args.posonlyargs + args.args]
        self.vararg = args.vararg.arg if args.vararg else None
        self.kwonly = [a.arg for a in args.kwonlyargs]
        self.children: dict[str, Func] = {}
        self._bindings: dict[str, list] | None = None   # name -> [("expr", node) | ("elem", iter node)]
        self.param_sinks: dict[tuple[str, str], set[tuple[str, str]]] = {}   # (kind, param) -> {(prefix, suffix)}
        self.returns: set[str] = set()            # caps | pname | pnames
        self.calls: set[Func] = set()
        self._body: list | None = None

    def __repr__(self) -> str:
        return f"{_rel(self.module.path)}:{self.qualname}"

    def __hash__(self) -> int:
        return id(self)

    @property
    def bindings(self) -> dict[str, list]:
        if self._bindings is None:
            self._bindings = _bind(self)
        return self._bindings

    def has_param(self, name: str) -> bool:
        return name in self.params or name == self.vararg or name in self.kwonly

    def body_nodes(self) -> list:
        """Every node of this function's own body (nested functions and lambdas are their own Func)."""
        if self._body is None:
            stack = [self.node.body] if isinstance(self.node, ast.Lambda) else list(self.node.body)
            self._body = []
            while stack:
                node = stack.pop()
                self._body.append(node)
                stack += [c for c in ast.iter_child_nodes(node)
                          if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        return self._body


class Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = _tree(path)
        self.funcs: list[Func] = []
        self.top: dict[str, Func] = {}
        self.constants: dict[str, ast.expr] = {}
        self.imports: dict[str, tuple[str, str]] = {}     # local name -> (module, name)
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.constants[t.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.constants[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = ".".join(("vllm_doctor." + _rel(path)[:-3].replace("/", ".")).split(".")[:-node.level])
                    base = f"{pkg}.{base}" if base else pkg
                for a in node.names:
                    self.imports[a.asname or a.name] = (base, a.name)
        self._collect(self.tree, None, "")
        self.by_node = {id(f.node): f for f in self.funcs}
        self._parents: dict[int, ast.AST] | None = None
        self._nodes: list | None = None

    @property
    def parents(self) -> dict[int, ast.AST]:
        """id(node) -> its parent, for every node of the module (computed once)."""
        if self._parents is None:
            self._nodes, self._parents = _index(self.tree)
        return self._parents

    @property
    def nodes(self) -> list:
        if self._nodes is None:
            self._nodes, self._parents = _index(self.tree)
        return self._nodes

    def _collect(self, node, parent: Func | None, prefix: str, in_class: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                self._collect(child, parent, f"{prefix}{child.name}.", in_class=True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = Func(self, child, prefix + child.name, parent)
                self._add(f, child.name, parent, in_class)
                self._collect(child, f, f.qualname + ".")
            elif isinstance(child, ast.Assign) and isinstance(child.value, ast.Lambda) \
                    and len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
                name = child.targets[0].id
                f = Func(self, child.value, f"{prefix}{name}", parent)
                self._add(f, name, parent, in_class)
                self._collect(child.value, f, f.qualname + ".")
            else:
                self._collect(child, parent, prefix, in_class)

    def _add(self, f: Func, name: str, parent: Func | None, in_class: bool) -> None:
        self.funcs.append(f)
        if parent is not None:
            parent.children[name] = f
        elif not in_class:          # a method is not a module-level name
            self.top[name] = f


class Analysis:
    """Literal flow over a set of modules (vllm_doctor.<dotted> names)."""

    def __init__(self, paths: list[Path], flow: bool = True) -> None:
        self.modules = {_dotted(p): Module(p) for p in paths}
        self.funcs = [f for m in self.modules.values() for f in m.funcs]
        self.reads: set[Read] = set()
        if flow:
            self._flow()

    def _flow(self) -> None:
        for _ in range(20):                        # to a fixed point: summaries feed each other
            before = (sum(len(v) for f in self.funcs for v in f.param_sinks.values()),
                      sum(len(f.returns) for f in self.funcs), len(self.reads))
            for f in self.funcs:
                self._summarise(f)
            after = (sum(len(v) for f in self.funcs for v in f.param_sinks.values()),
                     sum(len(f.returns) for f in self.funcs), len(self.reads))
            if after == before:
                break

    # -- scopes ---------------------------------------------------------------------------------
    def _lookup(self, f: Func | None, module: Module, name: str):
        """('param', func) | ('bound', func, [bindings]) | ('const', module, expr) | ('func', Func) | None"""
        scope = f
        while scope is not None:
            if scope.has_param(name):
                return ("param", scope)
            if name in scope.bindings:
                return ("bound", scope, scope.bindings[name])
            if name in scope.children:
                return ("func", scope.children[name])
            scope = scope.parent
        if name in module.top:
            return ("func", module.top[name])
        if name in module.constants:
            return ("const", module, module.constants[name])
        if name in module.imports:
            src_mod, src_name = module.imports[name]
            other = self.modules.get(src_mod)
            if other is not None and other is not module:
                if src_name in other.top:
                    return ("func", other.top[src_name])
                if src_name in other.constants:
                    return ("const", other, other.constants[src_name])
            elif other is None:
                const = _foreign_constant(src_mod, src_name)
                if const is not None:
                    return ("const", None, const)
        return None

    def top_level(self, dotted: str, name: str, depth: int = 0) -> Func | None:
        """The function `name` of module `dotted`, following re-exports (a package's __init__.py)."""
        module = self.modules.get(dotted)
        if module is None or depth > 5:
            return None
        if name in module.top:
            return module.top[name]
        if name in module.imports:
            return self.top_level(*module.imports[name], depth + 1)
        return None

    def callee(self, f: Func, node: ast.Call) -> Func | None:
        if isinstance(node.func, ast.Name):
            found = self._lookup(f, f.module, node.func.id)
            if found and found[0] == "func":
                return found[1]
        return None

    # -- values ---------------------------------------------------------------------------------
    def values(self, f: Func | None, module: Module, expr, seen=frozenset()) -> set:
        """The strings `expr` can be: Lit, Param (of f or an enclosing function), Dyn. Tuples etc. give
        their elements."""
        if expr is None or id(expr) in seen:
            return set()
        seen = seen | {id(expr)}
        if isinstance(expr, ast.Constant):
            return {Lit(expr.value)} if isinstance(expr.value, str) else set()
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.values(f, module, e, seen) for e in expr.elts)) if expr.elts else set()
        if isinstance(expr, ast.Starred):
            return self.values(f, module, expr.value, seen)
        if isinstance(expr, ast.IfExp):
            return self.values(f, module, expr.body, seen) | self.values(f, module, expr.orelse, seen)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.values(f, module, v, seen) for v in expr.values))
        if isinstance(expr, ast.Name):
            found = self._lookup(f, module, expr.id)
            if found is None:
                return set()
            if found[0] == "param":
                return {Param(found[1], expr.id)}
            if found[0] == "const":
                return self.values(None, found[1] or module, found[2], seen)
            if found[0] == "bound":
                out = set()
                for kind, value in found[2]:
                    out |= self.values(found[1], module, value, seen)
                return out
            return set()
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return _concat(self.values(f, module, expr.left, seen), self.values(f, module, expr.right, seen))
        if isinstance(expr, ast.JoinedStr):
            out = {Lit("")}
            for v in expr.values:
                if isinstance(v, ast.Constant):
                    part = {Lit(v.value)}
                elif v.format_spec is None and v.conversion == -1:
                    part = self.values(f, module, v.value, seen)
                else:
                    part = set()
                out = _concat(out, part)
            return out
        return set()

    # -- expression kinds -----------------------------------------------------------------------
    def kind(self, f: Func, expr, seen=frozenset()) -> set[str]:
        """What `expr` holds: 'caps' (a captures dict), 'pat' (a Pattern), 'pname' (a pattern name),
        'pnames' (a collection of pattern names)."""
        if expr is None or id(expr) in seen:
            return set()
        seen = seen | {id(expr)}
        def k(e):
            return self.kind(f, e, seen)

        out: set[str] = set()
        if isinstance(expr, ast.Attribute):
            if expr.attr == "captures":
                out.add("caps")
            elif expr.attr == "pattern":
                out.add("pat")
            elif expr.attr == "pattern_names":
                out.add("pnames")
            elif expr.attr == "name" and "pat" in k(expr.value):
                out.add("pname")
        elif isinstance(expr, ast.Call):
            fn = expr.func
            if isinstance(fn, ast.Name) and fn.id == "getattr" and len(expr.args) >= 2 \
                    and isinstance(expr.args[1], ast.Constant):
                attr = expr.args[1].value
                if attr == "captures":
                    out.add("caps")
                elif attr == "pattern":
                    out.add("pat")
                elif attr == "name" and "pat" in k(expr.args[0]):
                    out.add("pname")
            elif isinstance(fn, ast.Name) and fn.id in ("str",) and expr.args:
                out |= k(expr.args[0]) & {"pname"}
            elif isinstance(fn, ast.Name) and fn.id in ("set", "frozenset", "list", "sorted", "tuple") and expr.args:
                out |= k(expr.args[0]) & {"pnames"}
            elif isinstance(fn, ast.Name) and fn.id == "dict" and expr.args:
                out |= k(expr.args[0]) & {"caps"}
            elif isinstance(fn, ast.Name) and fn.id == "next" and expr.args \
                    and isinstance(expr.args[0], ast.GeneratorExp):
                out |= k(expr.args[0].elt) & {"caps", "pname", "pat"}
            elif isinstance(fn, ast.Attribute) and fn.attr == "copy":
                out |= k(fn.value) & {"caps"}
            else:
                callee = self.callee(f, expr)
                if callee is not None:
                    out |= callee.returns
        elif isinstance(expr, ast.BoolOp):
            for v in expr.values:
                out |= k(v)
        elif isinstance(expr, ast.IfExp):
            out |= k(expr.body) | k(expr.orelse)
        elif isinstance(expr, ast.Subscript):
            if "pnames" in k(expr.value):
                out.add("pname")
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.BitAnd, ast.Sub, ast.BitOr)):
            out |= (k(expr.left) | k(expr.right)) & {"pnames"}
        elif isinstance(expr, (ast.SetComp, ast.ListComp, ast.GeneratorExp)):
            if "pname" in k(expr.elt):
                out.add("pnames")
        elif isinstance(expr, ast.DictComp):
            it = expr.generators[0].iter
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items" \
                    and "caps" in k(it.func.value):
                out.add("caps")
        elif isinstance(expr, ast.Name):
            found = self._lookup(f, f.module, expr.id)
            if found and found[0] == "param" and expr.id in CAPS_PARAMS:
                out.add("caps")
            elif found and found[0] == "bound":
                for how, value in found[2]:
                    sub = self.kind(found[1], value, seen)
                    out |= sub if how == "expr" else ({"pname"} if "pnames" in sub else set())
        return out

    # -- one pass over a function ---------------------------------------------------------------
    def _sink(self, f: Func, kind: str, expr, line: int, prefix: str = "", suffix: str = "") -> None:
        for v in self.values(f, f.module, expr):
            self._emit(f, kind, v, line, prefix, suffix)

    def _emit(self, f: Func, kind: str, v, line: int, prefix: str, suffix: str) -> None:
        if isinstance(v, Lit):
            self.reads.add(Read(kind, prefix + v.value + suffix, f.module.path, line, f))
        elif isinstance(v, Param):
            v.func.param_sinks.setdefault((kind, v.name), set()).add((prefix + v.prefix, v.suffix + suffix))
        elif isinstance(v, Dyn) and kind == "fact" and prefix + v.prefix:
            self.reads.add(Read(kind, prefix + v.prefix + "*", f.module.path, line, f))

    def _summarise(self, f: Func) -> None:
        if isinstance(f.node, ast.Lambda):
            f.returns |= self.kind(f, f.node.body)
        for node in f.body_nodes():
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Return) and node.value is not None:
                f.returns |= self.kind(f, node.value) & {"caps", "pname", "pnames"}
            elif isinstance(node, ast.Call):
                self._call(f, node, line)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and "caps" in self.kind(f, node.value):
                self._sink(f, "capture", node.slice, line)
            elif isinstance(node, ast.Compare):
                self._compare(f, node, line)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.Sub, ast.BitOr, ast.BitXor)):
                for a, b in ((node.left, node.right), (node.right, node.left)):
                    if "pnames" in self.kind(f, a):
                        self._sink(f, "pattern", b, line)

    def _compare(self, f: Func, node: ast.Compare, line: int) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            lk, rk = self.kind(f, left), self.kind(f, right)
            if isinstance(op, (ast.Eq, ast.NotEq)):
                if "pname" in lk or "pnames" in lk:
                    self._sink(f, "pattern", right, line)
                if "pname" in rk or "pnames" in rk:
                    self._sink(f, "pattern", left, line)
            elif isinstance(op, (ast.In, ast.NotIn)):
                if "pnames" in rk:
                    self._sink(f, "pattern", left, line)
                if "caps" in rk:
                    self._sink(f, "capture", left, line)
                if "pname" in lk:
                    self._sink(f, "pattern", right, line)
            left = right

    def _call(self, f: Func, node: ast.Call, line: int) -> None:
        fn = node.func
        if isinstance(fn, ast.Attribute):
            recv = self.kind(f, fn.value)
            if fn.attr in CAPTURE_METHODS and _is_ctx(fn.value, f):
                for a in node.args:
                    self._sink(f, "capture", a, line)
            elif fn.attr in PATTERN_METHODS and _is_ctx(fn.value, f):
                for a in node.args:
                    self._sink(f, "pattern", a, line)
            elif fn.attr in FACT_METHODS and _is_ctx(fn.value, f):
                for a in node.args:
                    self._sink(f, "fact", a, line)
            elif fn.attr in ARG_METHODS and _is_ctx(fn.value, f) and node.args:
                self._sink(f, "fact", node.args[0], line, prefix="args.")
            elif fn.attr in ("get", "pop", "setdefault") and "caps" in recv and node.args:
                self._sink(f, "capture", node.args[0], line)
            elif fn.attr in ("intersection", "isdisjoint", "issubset", "issuperset", "difference") and "pnames" in recv:
                for a in node.args:
                    self._sink(f, "pattern", a, line)
            elif fn.attr in ("get", "source") and _is_facts(fn.value) and node.args:
                self._sink(f, "fact", node.args[0], line)
            return
        callee = self.callee(f, node)
        if callee is None:
            return
        f.calls.add(callee)
        bound: list[tuple[str, ast.expr]] = []
        for i, a in enumerate(node.args):
            if isinstance(a, ast.Starred):
                continue
            if i < len(callee.params):
                bound.append((callee.params[i], a))
            elif callee.vararg:
                bound.append((callee.vararg, a))
        bound += [(k.arg, k.value) for k in node.keywords if k.arg]
        for pname, arg in bound:
            for (kind, p), affixes in list(callee.param_sinks.items()):
                if p == pname:
                    for prefix, suffix in list(affixes):
                        self._sink(f, kind, arg, line, prefix, suffix)


def _bind(f: Func) -> dict[str, list]:
    bindings: dict[str, list] = {}

    def target(t, kind, value):
        if isinstance(t, ast.Name):
            bindings.setdefault(t.id, []).append((kind, value))
        elif isinstance(t, (ast.Tuple, ast.List)) and kind == "expr" and isinstance(value, (ast.Tuple, ast.List)) \
                and len(value.elts) == len(t.elts):
            for a, b in zip(t.elts, value.elts):
                target(a, "expr", b)

    for node in f.body_nodes():
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t, "expr", node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            target(node.target, "expr", node.value)
        elif isinstance(node, ast.NamedExpr):
            target(node.target, "expr", node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            target(node.target, "elem", node.iter)
    return bindings


def _dotted(path: Path) -> str:
    return "vllm_doctor." + _rel(path)[:-3].replace("/", ".").removesuffix(".__init__")


def _is_ctx(expr, f: Func | None = None) -> bool:
    """The remedy/refine context: `ctx` in a hook, `self` inside RemedyContext's own methods."""
    if not isinstance(expr, ast.Name):
        return False
    return expr.id in ("ctx", "context") or (expr.id == "self" and f is not None and f.module.path == CONTEXT_MODULE)


def _is_facts(expr) -> bool:
    return (isinstance(expr, ast.Name) and expr.id == "facts") or \
        (isinstance(expr, ast.Attribute) and expr.attr == "facts")


def _concat(left: set, right: set) -> set:
    """The strings `a + b` can be; an unknown part makes a Dyn that keeps the literal prefix."""
    out = set()
    for a in left or {Dyn("")}:
        for b in right or {Dyn("")}:
            if isinstance(a, Lit) and isinstance(b, Lit):
                out.add(Lit(a.value + b.value))
            elif isinstance(a, Lit) and isinstance(b, Param):
                out.add(Param(b.func, b.name, a.value + b.prefix, b.suffix))
            elif isinstance(a, Param) and isinstance(b, Lit):
                out.add(Param(a.func, a.name, a.prefix, a.suffix + b.value))
            elif isinstance(a, Lit):
                out.add(Dyn(a.value + (b.prefix if isinstance(b, Dyn) else "")))
            else:
                out.add(Dyn(a.prefix))
    return out


def _foreign_constant(module: str, name: str):
    """A module-level constant of another vllm_doctor module (events.phases.PHASE_FACT ...), as an expr."""
    if not module.startswith("vllm_doctor."):
        return None
    path = SRC / (module.removeprefix("vllm_doctor.").replace(".", "/") + ".py")
    if not path.is_file():
        return None
    for node in _tree(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value if isinstance(node.value, ast.Constant) else None
    return None


@lru_cache(maxsize=1)
def _hook_analysis() -> Analysis:
    return Analysis(_src_files("remedies") + _src_files("refine"))


def _hook_funcs(analysis: Analysis) -> dict[Func, set[str]]:
    """Every function of remedies/ and refine/ -> the rule ids whose evidence it may see: the rules whose
    remedy/refine reaches it through calls. A remedy sees the matches of its own rule and of every rule
    whose refine hook relabels matches into it; a refine hook sees its own rule's matches."""
    rules = _rules()
    relabelled_into: dict[str, set[str]] = {rid: {rid} for rid in rules}
    for rule, kind, package, module, func in _hooks():
        if kind == "refine":
            target = analysis.top_level(f"vllm_doctor.{package}.{module}", func)
            for rid in _returned_rule_ids(analysis, target) if target else ():
                relabelled_into.setdefault(rid, set()).add(rule.id)
    served: dict[Func, set[str]] = {}
    for rule, kind, package, module, func in _hooks():
        target = analysis.top_level(f"vllm_doctor.{package}.{module}", func)
        if target is None:
            continue
        seen_rules = relabelled_into[rule.id] if kind == "remedy" else {rule.id}
        stack, seen = [target], set()
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            served.setdefault(fn, set()).update(seen_rules)
            stack += list(fn.calls) + list(fn.children.values())
    return served


def _returned_rule_ids(analysis: Analysis, func: Func) -> set[str]:
    out, stack, seen = set(), [func], set()
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack += list(fn.calls)
        for node in fn.body_nodes():
            if isinstance(node, ast.Return):
                out |= {v.value for v in analysis.values(fn, fn.module, node.value) if isinstance(v, Lit)}
    return out & set(_rules())


def _rule_names(rule_ids: set[str]) -> tuple[set[str], set[str]]:
    """(pattern names, capture names) of those rules; a rule with `raised_in` also gets the engine's
    `raised-in` match, whose one capture `raised_in` names the checker function."""
    patterns, captures = set(), set()
    for rid in rule_ids:
        for p in _rules()[rid].patterns:
            patterns.add(p.name)
            captures |= set(re.findall(r"\(\?P<(\w+)>", p.source))
        if _rules()[rid].raised_in:
            patterns.add("raised-in")
            captures.add("raised_in")
    return patterns, captures


def test_names_hooks_read_exist_in_their_rules():
    analysis = _hook_analysis()
    served = _hook_funcs(analysis)
    problems = []
    for read in sorted(analysis.reads, key=lambda r: (str(r.path), r.line, r.value)):
        if read.kind not in ("capture", "pattern"):
            continue
        rule_ids = served.get(read.func) or _module_rules(read.func.module)
        if not rule_ids:
            continue
        patterns, captures = _rule_names(rule_ids)
        if read.value in (patterns if read.kind == "pattern" else captures):
            continue
        shown = ", ".join(sorted(rule_ids))
        problems.append(f"src/vllm_doctor/{_rel(read.path)}:{read.line}: {read.func.qualname} reads "
                        f"{read.kind} '{read.value}', which no pattern of {shown} has"
                        + (" as a named group (?P<...>)" if read.kind == "capture" else " as its name"))
    assert not problems, "\n".join(problems)


def _module_rules(module: Module) -> set[str]:
    """A function no spec reaches (a dead helper, or one called in a way the analysis misses): checked
    against every rule whose remedy/refine lives in its module."""
    name = _rel(module.path)[:-3].removesuffix("/__init__")
    return {rule.id for rule, kind, package, mod, func in _hooks()
            if name == f"{package}/{mod}" or name.startswith(f"{package}/{mod}/")}


# =========================================================================== c. fact keys
# Writers: `<facts>.set(KEY, ...)` (KEY a literal, a constant, or an f-string / concatenation that builds
# a family like args.<name>), and the table modules below, whose literal keys become facts through a
# loop over a dict or table. Readers: every other fact-shaped literal in src (a `.get`, a table of keys,
# a membership test ...), dynamic keys (f"env.port_owner.{port}" reads the family env.port_owner.*),
# and the keys remedies/refine hooks reach through helpers and ctx.fact/ctx.arg (args.<name>).

FACT_KEY = re.compile(r"vllm\.version|(?:launch|args|log|model|gpu|env|memory|doctor|net|node|cluster|server)\.[a-z][a-z0-9_]*"
                      r"(?:\.[a-z0-9_]+)*")
FACT_FAMILY = re.compile(r"(?:launch|args|log|model|gpu|env|memory|doctor|net|node|cluster|server)\.(?:[a-z][a-z0-9_]*\.)*")
NOT_FACT_KEY = re.compile(r"\.(?:json|py|txt|md|toml|yaml|yml|safetensors|bin)$")
KEYS_MODULE = SRC / "facts" / "keys.py"

# Modules whose fact-key literals are written by a loop (the dict or table they sit in is set key by key).
TABLE_WRITERS = {
    "facts/model.py": "load_model_facts: values[...] = ..., then facts.set(key, value) for each",
    "facts/model_config.py": "normalise(): the model.* dict load_model_facts sets",
    "facts/collect_env.py": "parse_collect_env(): the dict facts/snapshot.py and events/logfacts.py set",
    "events/logfacts.py": "EXTRACTORS: (literal, regex, fact keys, converter) rows, each key set on a match",
}

# Keys read but never written in production code (tests set some of them by hand). May only shrink:
# fix the reader (or write the fact) and drop the entry.
DEAD_FACT_READS: dict[str, str] = {}


@dataclass(frozen=True)
class KeyUse:
    key: str                   # a key, or a family "prefix.*"
    path: Path
    line: int
    how: str                   # read | write


def _index(tree: ast.AST) -> tuple[list, dict[int, ast.AST]]:
    """(every node, id(node) -> parent)."""
    nodes, parents, stack = [], {}, [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
            stack.append(child)
    return nodes, parents


def _fact_key(text: str) -> str | None:
    """`text` as a fact key ("model.num_kv_heads"), or as a family ("env.port_owner.*") when it is the
    literal start of a key built at run time; None when it is not one."""
    if NOT_FACT_KEY.search(text):
        return None
    if FACT_KEY.fullmatch(text):
        return text
    return None


def _dynamic_family(expr) -> str | None:
    """f"args.{name}" / "args." + name -> "args.*"."""
    if isinstance(expr, ast.JoinedStr) and len(expr.values) > 1 and isinstance(expr.values[0], ast.Constant):
        head = str(expr.values[0].value)
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and isinstance(expr.left, ast.Constant) \
            and isinstance(expr.left.value, str) and not isinstance(expr.right, ast.Constant):
        head = expr.left.value
    else:
        return None
    return head + "*" if FACT_FAMILY.fullmatch(head) else None


@lru_cache(maxsize=1)
def _fact_uses() -> tuple[KeyUse, ...]:
    files = [p for p in _src_files() if p != KEYS_MODULE]
    resolver = Analysis(files, flow=False)
    uses: list[KeyUse] = []
    for path in files:
        module = resolver.modules[_dotted(path)]
        parents = module.parents
        nodes = module.nodes
        table = _rel(path) in TABLE_WRITERS
        docstrings = {id(n.value) for n in nodes if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        set_args = {}
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set" \
                    and len(node.args) >= 2:
                set_args[id(node.args[0])] = node
                func = _enclosing_func(module, node, parents)
                for v in resolver.values(func, module, node.args[0]):
                    key = _fact_key(v.value) if isinstance(v, Lit) else (
                        v.prefix + "*" if isinstance(v, Dyn) and FACT_FAMILY.fullmatch(v.prefix) else None)
                    if key:
                        uses.append(KeyUse(key, path, node.lineno, "write"))
        for node in nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings or id(node) in set_args or isinstance(parents.get(id(node)), ast.JoinedStr):
                    continue
                if isinstance(parents.get(id(node)), ast.BinOp) and _dynamic_family(parents[id(node)]):
                    continue
                key = _fact_key(node.value)
            elif isinstance(node, (ast.JoinedStr, ast.BinOp)):
                if id(node) in set_args:
                    continue
                key = _dynamic_family(node)
            else:
                continue
            if not key:
                continue
            how = _how_used(node, parents, table)
            if how:
                uses.append(KeyUse(key, path, node.lineno, how))
    for read in _hook_analysis().reads:
        if read.kind == "fact":
            key = _fact_key(read.value) or (read.value if read.value.endswith("*") and
                                            FACT_FAMILY.fullmatch(read.value[:-1]) else None)
            if key:
                uses.append(KeyUse(key, read.path, read.line, "read"))
    return tuple(sorted(set(uses), key=lambda u: (u.key, str(u.path), u.line, u.how)))


def _enclosing_func(module: Module, node, parents) -> Func | None:
    by_node = module.by_node
    cur = parents.get(id(node))
    while cur is not None:
        if id(cur) in by_node:
            return by_node[id(cur)]
        cur = parents.get(id(cur))
    return None


def _how_used(node, parents, table: bool) -> str | None:
    """read | write | None (a display key: facts_used={...}, finding facts)."""
    parent = parents.get(id(node))
    while isinstance(parent, (ast.Tuple, ast.List, ast.Set)) and table:
        node, parent = parent, parents.get(id(parent))
    reading = (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
               and parent.func.attr in ("get", "source", "pop") and parent.args and parent.args[0] is node) \
        or (isinstance(parent, ast.Compare) and parent.left is node)
    if table:
        return "read" if reading else "write"
    if isinstance(parent, ast.Dict) and any(k is node for k in parent.keys):
        return None
    if isinstance(parent, ast.Subscript) and parent.slice is node and isinstance(parent.ctx, ast.Store):
        return None
    return "read"


def _covers(family: str, key: str) -> bool:
    return family.endswith("*") and key.startswith(family[:-1])


def _registry() -> dict[str, str]:
    from vllm_doctor.facts import keys

    return keys.KEYS


def _registered(key: str, registry: dict[str, str]) -> bool:
    if key in registry or any(_covers(k, key) for k in registry):
        return True
    # a dynamic read of a namespace (f"log.{placeholder}"): some key of it is registered
    return key.endswith("*") and any(k.startswith(key[:-1]) for k in registry)


def test_every_fact_key_read_has_a_writer():
    uses = _fact_uses()
    written = {u.key for u in uses if u.how == "write"}
    problems, dead = [], set()
    for u in uses:
        if u.how != "read":
            continue
        if u.key in written or any(_covers(w, u.key) for w in written) or \
                (u.key.endswith("*") and any(w.startswith(u.key[:-1]) for w in written)):
            continue
        if u.key in DEAD_FACT_READS:
            dead.add(u.key)
            continue
        problems.append(f"src/vllm_doctor/{_rel(u.path)}:{u.line}: reads fact '{u.key}', which nothing in src "
                        f"writes (facts.set, a collector, a snapshot loader or events/logfacts.py)")
    assert not problems, "\n".join(problems)
    _stale("DEAD_FACT_READS (now written, or no longer read)", set(DEAD_FACT_READS) - dead)


def test_every_fact_key_is_in_the_registry():
    registry = _registry()
    uses = _fact_uses()
    problems = [f"src/vllm_doctor/{_rel(u.path)}:{u.line}: fact '{u.key}' ({u.how}) is not in "
                f"src/vllm_doctor/facts/keys.py: add it to KEYS with a one-line doc"
                for u in uses if not _registered(u.key, registry)]
    assert not problems, "\n".join(dict.fromkeys(problems))


def test_registry_has_no_stale_keys():
    used = {u.key for u in _fact_uses()}
    stale = [k for k in _registry() if k not in used and not any(_covers(k, u) or _covers(u, k) for u in used)]
    dead = [k for k in stale if k in DEAD_FACT_READS]       # its reader was fixed: drop the key too
    stale = [k for k in stale if k not in DEAD_FACT_READS]
    assert not stale, ("src/vllm_doctor/facts/keys.py: keys nothing in src reads or writes (remove them, or "
                       f"the code that should use them is missing): {stale}")
    _stale("dead-read keys no longer read", dead, "src/vllm_doctor/facts/keys.py and DEAD_FACT_READS")


def test_registry_entries_are_documented_and_constants_match():
    from vllm_doctor.facts import keys

    problems = [f"facts/keys.py: '{k}' has no one-line doc" for k, doc in keys.KEYS.items()
                if not doc.strip() or "\n" in doc]
    values = {v for n, v in vars(keys).items() if re.fullmatch(r"[A-Z][A-Z0-9_]*", n) and isinstance(v, str)}
    problems += [f"facts/keys.py: constant {n} = {v!r} is not in KEYS" for n, v in vars(keys).items()
                 if re.fullmatch(r"[A-Z][A-Z0-9_]*", n) and isinstance(v, str) and v not in keys.KEYS]
    problems += [f"facts/keys.py: KEYS['{k}'] has no constant" for k in keys.KEYS if k not in values]
    assert not problems, "\n".join(problems)


def test_design_doc_fact_keys_are_registered():
    """docs/DESIGN.md's "Facts" sections name keys (`args.<snake_name>` is the family args.*): each one is
    in the registry, so the doc and the code name the same facts."""
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    registry = _registry()
    problems = []
    for section in re.finditer(r"^## (Facts[^\n]*)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        for m in re.finditer(r"`([a-z]+\.[a-z0-9_.<>]+)`", section.group(2)):
            key = re.sub(r"\.?<[^>]+>", ".*", m.group(1)).replace("..*", ".*")
            if not (_fact_key(key) or key.endswith(".*") and FACT_FAMILY.fullmatch(key[:-1])):
                continue
            if not _registered(key, registry):
                line = text[:section.start(2) + m.start()].count("\n") + 1
                problems.append(f"docs/DESIGN.md:{line}: ## {section.group(1)} names fact `{m.group(1)}`, which "
                                "src/vllm_doctor/facts/keys.py does not list")
    assert not problems, "\n".join(dict.fromkeys(problems))


# =========================================================================== d. flags in rule text

RULE_TEXT_FIELDS = ("title", "summary", "explanation", "fix_method")    # examples are log text: not counted
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")

# Flags a rule names that are not vLLM's (other tools' options, deliberate non-flags). May only shrink.
NOT_VLLM_FLAGS = {
    ("nccl-shm", "--ipc"): "docker run --ipc=host",
    ("nccl-shm", "--shm-size"): "docker run --shm-size",
    ("no-gpu", "--gpus"): "docker run --gpus all",
    ("no-gpu", "--runtime"): "nvidia-ctk runtime configure --runtime=docker",
    ("cli-unknown-arg", "--max-seq-len"): "named as a flag that never existed (the mistake the rule explains)",
    ("cli-unknown-arg", "--flag"): "a placeholder in `\"--flag value\"`",
}


@lru_cache(maxsize=1)
def _shipped_flags() -> frozenset[str]:
    """Every option string some vLLM release in the shipped flag lists had (command.flags.known_flags at
    each release a range ends with, and at HEAD)."""
    import json
    from importlib import resources

    from vllm_doctor.command import flags

    data = json.loads(resources.files("vllm_doctor.data.flags").joinpath("versions.json").read_text(encoding="utf-8"))
    ends = {rng.partition("..")[2].lstrip(">") for rng in data["flags"].values()} - {"", "HEAD"}
    versions = [None] + sorted(ends) + list(data.get("snapshots") or [])
    return frozenset().union(*(flags.known_flags(v) for v in versions))


def test_flags_named_in_rule_text_exist():
    from vllm_doctor.command import flags

    known = _shipped_flags()
    problems, used = [], set()
    for rule in _rules().values():
        text = Path(rule.path).read_text(encoding="utf-8").splitlines()
        for field_name in RULE_TEXT_FIELDS:
            for m in FLAG.finditer(getattr(rule, field_name) or ""):
                flag = m.group(0).rstrip("-")
                if flags.canonical(flag) in known or flag in known:
                    continue
                if (rule.id, flag) in NOT_VLLM_FLAGS:
                    used.add((rule.id, flag))
                    continue
                line = next((n for n, s in enumerate(text, 1) if flag in s), 1)
                hint = flags.suggest(flag)
                problems.append(f"{_rule_file(rule)}:{line}: {field_name} names {flag}, which no vLLM release in "
                                "src/vllm_doctor/data/flags/ has"
                                + (f" (did you mean {', '.join(hint)}?)" if hint else ""))
    assert not problems, "\n".join(dict.fromkeys(problems))
    _stale("NOT_VLLM_FLAGS", set(NOT_VLLM_FLAGS) - used)


# =========================================================================== f. `check` predictions
# checks/preflight.py's Checker writes the line vLLM would print and matches it against the rule it
# names (`self.add("nccl-shm", "NCCL WARN Error while creating shared memory segment ...")`). Every such
# line must be matched by that rule's patterns, or the prediction silently loses its captures.

CHECK_MODULES = {SRC / "checks" / "checker.py": "Checker.", SRC / "checks" / "memory_checks.py": "MemoryChecks."}

# Predictions whose line no pattern of their own rule matches: checks/preflight.py's _finding then falls
# back to the rule's first pattern (a wrong pattern name in the evidence) and to the captures the Checker
# passed. In a real log these lines are another rule's, relabelled by its refine hook. May only shrink:
# write the line the rule's own patterns match, or predict the matching rule and run its refine hook.
# Keyed by (rule id, a piece of the predicted line).
UNMATCHED_PREDICTIONS = {
    ("tp-heads-indivisible", " is not divisible by "):
        "the vision tower's `AssertionError: N is not divisible by T` is tp-shape-indivisible's divide pattern "
        "(refine/divide.py relabels it); tp-heads-indivisible has no such pattern",
}

# Emission sites whose text is not in the code. May only shrink.
DYNAMIC_PREDICTIONS = {
    "Checker.arguments": "the text is argparse's own error for this command (command.argcheck.accepts); "
                         "tests/test_check.py runs it through the rules",
}


def _sample(value_node) -> str:
    """A stand-in for an f-string field: a number, formatted with the field's spec."""
    spec = value_node.format_spec
    if spec is not None:
        text = "".join(v.value for v in spec.values if isinstance(v, ast.Constant))
        try:
            return format(8.0 if any(c in text for c in "efg%") else 8, text)
        except (TypeError, ValueError):
            return "8"
    return "8"


def _texts(analysis: Analysis, f: Func, expr, seen=frozenset()) -> list[str] | None:
    """The lines `expr` can be, f-string fields filled with samples; None when it is not in the code."""
    if id(expr) in seen:
        return None
    seen = seen | {id(expr)}
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else _sample(v) for v in expr.values)]
    if isinstance(expr, ast.IfExp):
        a, b = _texts(analysis, f, expr.body, seen), _texts(analysis, f, expr.orelse, seen)
        return None if a is None or b is None else a + b
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        a, b = _texts(analysis, f, expr.left, seen), _texts(analysis, f, expr.right, seen)
        return None if a is None or b is None else [x + y for x in a for y in b]
    if isinstance(expr, ast.Name):
        found = analysis._lookup(f, f.module, expr.id)
        if found and found[0] == "bound" and all(how == "expr" for how, _ in found[2]):
            out = []
            for _, value in found[2]:
                got = _texts(analysis, found[1], value, seen)
                if got is None:
                    return None
                out += got
            return out
    return None


def _prediction_sites():
    """(method qualname, line, rule ids or None, texts or None) for every Checker.add(...) / Prediction(...)."""
    analysis = Analysis(list(CHECK_MODULES), flow=False)
    for path, owner in CHECK_MODULES.items():
        yield from _sites_in(analysis, analysis.modules[_dotted(path)], owner)


def _sites_in(analysis, module, owner: str):
    for f in module.funcs:
        if not f.qualname.startswith(owner):
            continue
        for node in f.body_nodes():
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            is_add = isinstance(fn, ast.Attribute) and fn.attr == "add" and isinstance(fn.value, ast.Name) \
                and fn.value.id == "self"
            if not (is_add or (isinstance(fn, ast.Name) and fn.id == "Prediction")):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue                 # Checker.add itself: Prediction(*args, **kwargs)
            args = list(node.args) + [None, None]
            kw = {k.arg: k.value for k in node.keywords}
            rule_expr, text_expr = kw.get("rule", args[0]), kw.get("message", args[1])
            rules = {v.value for v in analysis.values(f, module, rule_expr) if isinstance(v, Lit)} or None
            texts = _texts(analysis, f, text_expr) if text_expr is not None else None
            yield f.qualname, node.lineno, rules, texts


def test_check_predictions_match_their_rules():
    from vllm_doctor.rules.catalog import match_text

    problems, dynamic, unmatched, sites = [], set(), set(), 0
    for qualname, line, rule_ids, texts in _prediction_sites():
        sites += 1
        where = f"src/vllm_doctor/checks/{'memory_checks' if qualname.startswith('MemoryChecks.') else 'checker'}.py:{line}: {qualname}"
        if rule_ids is None or texts is None:
            if qualname in DYNAMIC_PREDICTIONS:
                dynamic.add(qualname)
            else:
                problems.append(f"{where}: the predicted rule or line is not a literal in the code, so it cannot "
                                "be checked: write it out, or add the site to DYNAMIC_PREDICTIONS with the reason")
            continue
        for rid in sorted(rule_ids):
            rule = _rules().get(rid)
            if rule is None:
                problems.append(f"{where}: predicts rule '{rid}', which is not in rules/")
                continue
            for text in texts:
                if match_text(rule, text) is not None:
                    continue
                known = [k for k in UNMATCHED_PREDICTIONS if k[0] == rid and k[1] in text]
                if known:
                    unmatched.update(known)
                else:
                    problems.append(f"{where}: predicts {rid} with {text[:110]!r}, which no pattern of "
                                    f"{_rule_file(rule)} matches")
    assert sites >= 10, f"found only {sites} Checker.add(...) sites in checks/preflight.py: has the API changed?"
    assert not problems, "\n".join(problems)
    _stale("DYNAMIC_PREDICTIONS", set(DYNAMIC_PREDICTIONS) - dynamic)
    _stale("UNMATCHED_PREDICTIONS", set(UNMATCHED_PREDICTIONS) - unmatched)


# =========================================================================== g. sizes

MAX_MODULE_LINES = 450
MAX_REMEDY_FUNCTION_LINES = 80

# Modules over MAX_MODULE_LINES, with the reason. May only shrink.
LONG_MODULES = {
    "tui/app.py": "one Textual App class: its bindings, actions and message handlers must live on it "
                  "(screens and messages are in tui/screens.py and tui/messages.py)",
}

# Remedy functions over MAX_REMEDY_FUNCTION_LINES ("path/under/remedies.py:function"). May only shrink.
LONG_REMEDY_FUNCTIONS: dict[str, str] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _over_limits(sized, limit: int, exempt, what: str) -> None:
    """`sized`: (key, length, message-if-over) triples. Over the limit and not exempt is a problem; an
    exemption no longer needed is stale."""
    problems, used = [], set()
    for key, n, message in sized:
        if n <= limit:
            continue
        if key in exempt:
            used.add(key)
            continue
        problems.append(message)
    assert not problems, "\n".join(problems)
    _stale(f"{what} (now within the limit, or gone)", set(exempt) - used)


def test_module_sizes():
    sized = []
    for path in _src_files():
        n, rel = _lines(path), _rel(path)
        sized.append((rel, n, f"src/vllm_doctor/{rel}:{n}: {n} lines, over the limit of {MAX_MODULE_LINES}: split "
                              "the module (or add it to LONG_MODULES with the reason)"))
    _over_limits(sized, MAX_MODULE_LINES, LONG_MODULES, "LONG_MODULES")


def test_remedy_function_sizes():
    sized = []
    for path in _src_files("remedies"):
        for node in ast.walk(_tree_now(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                sized.append((f"{path.relative_to(SRC / 'remedies').as_posix()}:{node.name}", n,
                              f"src/vllm_doctor/{_rel(path)}:{node.lineno}: {node.name} is {n} lines, over the "
                              f"limit of {MAX_REMEDY_FUNCTION_LINES}: split it"))
    _over_limits(sized, MAX_REMEDY_FUNCTION_LINES, LONG_REMEDY_FUNCTIONS, "LONG_REMEDY_FUNCTIONS")


def _tree_now(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


# =========================================================================== b'. old evidence idioms
# Remedies read evidence and facts through remedies/context.py's RemedyContext (ctx.capture, ctx.has_pattern,
# ctx.matches_named, ctx.fact, ctx.arg ...), whose string arguments the checks above read; a match from
# ctx.matches_named(...) is read as m.captures / m.pattern.name. The older spellings (ctx.captures[...],
# ctx.facts.get(...), ctx.int_capture, getattr(m, "pattern"/"captures"/"name", ...)) still work and are
# still checked where the analysis can follow them, but they are on their way out: per file, at most this
# many. May only shrink.
OLD_IDIOMS: dict[str, int] = {}
OLD_IDIOM_EXEMPT_FILES = {"remedies/context.py", "remedies/base.py", "remedies/apply.py", "remedies/__init__.py"}


def _old_idioms(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(_tree_now(path)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx" \
                and node.attr in ("captures", "int_capture"):
            out.append((node.lineno, f"ctx.{node.attr}"))
        elif isinstance(node, ast.Attribute) and node.attr == "get" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "facts" and isinstance(node.value.value, ast.Name) \
                and node.value.value.id == "ctx":
            out.append((node.lineno, "ctx.facts.get"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in ("pattern", "captures", "name", "facts"):
            out.append((node.lineno, f"getattr(..., {node.args[1].value!r})"))
    return sorted(out)


def test_old_evidence_idioms_only_shrink():
    problems, shrunk = [], []
    for path in _src_files("remedies"):
        rel = _rel(path)
        if rel in OLD_IDIOM_EXEMPT_FILES:
            continue
        found = _old_idioms(path)
        allowed = OLD_IDIOMS.get(rel, 0)
        if len(found) > allowed:
            shown = ", ".join(f"{line} {what}" for line, what in found[:12]) + (" ..." if len(found) > 12 else "")
            problems.append(f"src/vllm_doctor/{rel}: {len(found)} old evidence/fact accessors, {allowed} allowed "
                            f"(OLD_IDIOMS): use ctx.capture/has_pattern/fact/arg instead. Lines: {shown}")
        elif len(found) < allowed:
            shrunk.append(f"{rel}: {len(found)} < {allowed}")
    assert not problems, "\n".join(problems)
    _stale("OLD_IDIOMS (lower the counts)", shrunk)
    _stale("OLD_IDIOMS (files gone)", [rel for rel in OLD_IDIOMS if not (SRC / rel).is_file()])


# =========================================================================== catalog: specs checked at load

def _rules_copy(tmp_path: Path) -> Path:
    out = tmp_path / "rules"
    shutil.copytree(RULES, out)
    return out


def _set_line(path: Path, key: str, value: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.split("=", 1)[0].strip() == key:
            lines[i] = f'{key} = "{value}"\n'
            break
    else:
        lines.insert(1, f'{key} = "{value}"\n')
    path.write_text("".join(lines), encoding="utf-8")


@pytest.mark.parametrize("kind,spec,message", [
    ("remedy", "nccl:nope", "rules/nccl-shm.toml: remedy 'nccl:nope': no function nope in remedies/nccl.py"),
    ("remedy", "ncclx:fix_shm", "rules/nccl-shm.toml: remedy 'ncclx:fix_shm': no module ncclx in remedies/"),
    ("remedy", "nccl.fix_shm", "rules/nccl-shm.toml: remedy 'nccl.fix_shm' is not 'module:function'"),
    ("refine", "divide:nope", "rules/nccl-shm.toml: refine 'divide:nope': no function nope in refine/divide.py"),
])
def test_catalog_rejects_a_bad_hook_spec_at_load(tmp_path, kind, spec, message):
    from vllm_doctor.rules.catalog import CatalogError, load_catalog

    rules = _rules_copy(tmp_path)
    _set_line(rules / "nccl-shm.toml", kind, spec)
    with pytest.raises(CatalogError) as exc:
        load_catalog(rules)
    assert str(exc.value) == message


def test_catalog_accepts_re_exported_and_package_hooks(tmp_path, monkeypatch):
    pkg = tmp_path / "remedies"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "flat.py").write_text("from vllm_doctor.remedies.nccl import fix_shm as fix_alias\n\n"
                                 "def fix_own(ctx):\n    return None\n\nfix_bound = fix_own\n")
    (pkg / "sub" / "__init__.py").write_text("from .impl import fix_sub\n")
    monkeypatch.setattr(hooks, "package_dir", lambda package: tmp_path / package)
    for spec in ("flat:fix_alias", "flat:fix_own", "flat:fix_bound", "sub:fix_sub"):
        hooks.check_hook_spec("remedy", spec, "x.toml")
    with pytest.raises(hooks.CatalogError, match=r"no function fix_none in remedies/sub/__init__\.py"):
        hooks.check_hook_spec("remedy", "sub:fix_none", "x.toml")


def test_cli_bad_hook_spec_is_one_line_exit_2(tmp_path):
    rules = _rules_copy(tmp_path)
    _set_line(rules / "nccl-shm.toml", "remedy", "nccl:nope")
    proc = run_cli("--rules-dir", str(rules), str(CORPUS_DEV / "07-tp3-40heads.log"))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "rules/nccl-shm.toml: remedy 'nccl:nope': no function nope in remedies/nccl.py" in err
