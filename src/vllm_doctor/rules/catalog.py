"""The rule catalog: rules/*.toml loaded, validated and compiled once.

Each rule file is self-documenting data (see docs/DESIGN.md). Files whose name starts with `_` hold
internal tables (wrapper errors, structural literals) rather than a rule.

`cached_catalog` keeps the validated catalog in a cache file (parsing costs more than a small log's diagnosis).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable

import regex

from vllm_doctor.rules.errors import CatalogError
from vllm_doctor.rules.hooks import HOOK_PACKAGES, check_hook_spec, hook_files
from vllm_doctor.rules.search import LONG_LINE, bounded_search, search_line
from vllm_doctor import __version__

SEVERITIES = ("error", "warning", "info")
# fatal: the failure itself. supporting: corroborates a fatal line. warning: predicts trouble (not a finding).
# precursor: not a finding alone, the root cause once any failure follows it or the server never becomes
# ready ("No platform detected", "Error in inspecting model architecture"). stall: a waiting state, the
# finding when the log ends in it (no failure, no progress after it, never ready); progress: a line that
# ends that rule's wait ("Init COMPLETE" after "Init START").
KINDS = ("fatal", "supporting", "warning", "precursor", "stall", "progress")
REQUIRED = ("id", "title", "severity", "family", "summary", "explanation")


@dataclass
class Pattern:
    """Compiled on first use: ~200 regexes cost a quarter of a second to compile, and a typical log
    needs a handful of them (the literal prefilter decides which)."""
    rule_id: str
    name: str
    literal: str
    source: str
    ignorecase: bool = False
    kind: str = "fatal"
    versions: str = ""
    where: str = ""
    # printed by vLLM as a WARNING with nothing failing after it (a fragment), the line still names the cause
    # (an extension with an undefined symbol fails at its first kernel); otherwise such a line stays a warning
    warning_alone: bool = False
    # a wait that stalls only a start-up (Ray's autoscaler on a bundle no node can hold): after the server served
    # it is someone else's request, not a hang of this server
    startup_only: bool = False
    _compiled: regex.Pattern | None = None
    _anchored_end: bool | None = None

    def __getstate__(self) -> dict:   # a compiled regex pickles as its source, recompiled on load
        return {**self.__dict__, "_compiled": None}

    @property
    def regex(self) -> regex.Pattern:
        if self._compiled is None:
            try:
                self._compiled = regex.compile(self.source, regex.IGNORECASE if self.ignorecase else 0)
            except regex.error as exc:
                raise CatalogError(f"{self.where}: pattern '{self.name}' does not compile: {exc}") from None
        return self._compiled

    def search(self, text: str, hits: Iterable[int] = (), skipped: dict[str, int] | None = None):
        """The regex's match in `text`, bounded (rules/search.py); `hits` are the literal's start offsets
        (found here when not given); a search that runs out of time is no match, counted in `skipped`
        (rule id -> lines) when given."""
        if self._anchored_end is None:
            self._anchored_end = "$" in self.source or "\\Z" in self.source
        try:
            return search_line(self.regex, text, self.literal, self.ignorecase, self._anchored_end, hits)
        except TimeoutError:
            if skipped is not None:
                skipped[self.rule_id] = skipped.get(self.rule_id, 0) + 1
            return None


# A rule below this priority names a generic symptom ("NCCL error: unhandled cuda error"): it is the root
# cause only when nothing more specific is in the log, and otherwise corroborates whatever is.
GENERIC_PRIORITY = 20


@dataclass
class Rule:
    id: str
    title: str
    severity: str
    family: str
    summary: str
    explanation: str
    priority: int = 50
    remedy: str | None = None
    refine: str | None = None
    fix_method: str = ""
    versions: str = ""
    patterns: list[Pattern] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    counterexamples: list[dict] = field(default_factory=list)
    raised_in: list[str] = field(default_factory=list)   # vLLM functions whose raise is this rule's failure
    path: str = ""

    @property
    def answerable(self) -> bool:
        """Its waits have an answer line (a `progress` pattern: NCCL's `Init COMPLETE` after `Init START`)."""
        return any(p.kind == "progress" for p in self.patterns)


@dataclass
class Catalog:
    rules: dict[str, Rule]
    wrapper_sources: list[str]         # wrapper exceptions that are never the root cause (§1.3)
    structural: list[str]              # literals that mark lines the engine must see (tracebacks ...)

    @cached_property
    def wrappers(self) -> list[regex.Pattern]:
        return [regex.compile(source) for source in self.wrapper_sources]

    def __getstate__(self) -> dict:   # the fields: compiled wrappers and fuzzy phrases rebuild on use
        return {k: v for k, v in self.__dict__.items() if k in ("rules", "wrapper_sources", "structural")}

    @property
    def patterns(self) -> list[Pattern]:
        return [p for r in self.rules.values() for p in r.patterns]

    def is_wrapper(self, text: str) -> bool:
        return any(bounded_search(w, text[:LONG_LINE]) for w in self.wrappers)

    @property
    def raisers(self) -> dict[str, str]:
        """Function name -> rule id, from the rules' `raised_in` (a traceback cut before its message)."""
        return {func: rule.id for rule in self.rules.values() for func in rule.raised_in}

    def rule_named(self, word: str) -> tuple[str | None, str | None]:
        """(the rule id `word` names in any case, None) or (None, the one it most likely meant: an id it starts,
        else the closest spelling; None when none is close) -- `explain` and `--ignore` read rule ids alike."""
        import difflib

        by_lower = {rule_id.lower(): rule_id for rule_id in self.rules}
        wanted = word.strip().lower()
        if wanted in by_lower:
            return by_lower[wanted], None
        close = [r for r in sorted(by_lower) if r.startswith(wanted)] or \
            difflib.get_close_matches(wanted, list(by_lower), n=1, cutoff=0.5)
        return None, by_lower[close[0]] if close else None

    def raised_in_pattern(self, rule_id: str) -> Pattern:
        return Pattern(rule_id, "raised-in", "", "", kind="fatal", where=f"{rule_id}: raised_in")


def default_rules_dir() -> Path:
    """Rules ship inside the wheel as `vllm_doctor/_rules`; a source checkout uses the top-level `rules/`."""
    env = os.environ.get("VLLM_DOCTOR_RULES")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_rules"
    if packaged.is_dir():
        return packaged
    return here.parent.parent / "rules"


def _typed(where: str, table: dict, key: str, kind: type, default):
    """table[key] when it is a `kind` (TOML accepts `priority = "high"`; the loader must not), else the
    default when absent; a wrong type is one CatalogError line naming the file and the key."""
    value = table.get(key, default)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if value is None and default is None:
        return None
    names = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "a table"}
    raise CatalogError(f"{where}: '{key}' = {value!r:.60} should be {names[kind]}")


def _list_of(where: str, table: dict, key: str, kind: type) -> list:
    items = _typed(where, table, key, list, [])
    for item in items:
        if not isinstance(item, kind):
            what = "tables ([[" + key + "]])" if kind is dict else "strings"
            raise CatalogError(f"{where}: '{key}' should hold {what}, not {item!r:.60}")
    return items


def _compile(rule_id: str, where: str, spec: dict, index: int) -> Pattern:
    for key in ("name", "versions"):
        _typed(where, spec, key, str, "")
    _typed(where, spec, "ignorecase", bool, False)
    for key in ("literal", "regex"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise CatalogError(f"{where}: pattern {index + 1} has no '{key}'")
    kind = spec.get("kind", "fatal")
    if kind not in KINDS:
        raise CatalogError(f"{where}: pattern {index + 1} has kind '{kind}', expected one of {', '.join(KINDS)}")
    name = spec.get("name") or f"p{index + 1}"
    _lint(f"{where}: rule '{rule_id}', pattern '{name}'", spec["regex"], bool(spec.get("ignorecase")))
    flags = {}
    for flag in ("warning_alone", "startup_only"):
        flags[flag] = spec.get(flag, False)
        if not isinstance(flags[flag], bool):
            raise CatalogError(f"{where}: pattern '{name}' has {flag} = {flags[flag]!r}, expected true or false")
    return Pattern(rule_id, name, spec["literal"], spec["regex"],
                   bool(spec.get("ignorecase")), kind, spec.get("versions", ""), where, **flags)


def _lint(what: str, source: str, ignorecase: bool = False) -> None:
    """A regex that can backtrack catastrophically on a log line is refused (rules/lint.py)."""
    from vllm_doctor.rules.lint import lint

    problems = lint(source, ignorecase)
    if problems:
        raise CatalogError(f"{what} can backtrack catastrophically on a long line: {problems[0]}")


def load_rule(path: Path) -> Rule:
    import tomllib

    where = path.name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{where}: not valid TOML: {exc}") from None
    missing = [k for k in REQUIRED if not isinstance(data.get(k), str) or not data[k].strip()]
    if missing:
        raise CatalogError(f"{where}: missing {', '.join(missing)}")
    if data["severity"] not in SEVERITIES:
        raise CatalogError(f"{where}: severity '{data['severity']}' is not one of {', '.join(SEVERITIES)}")
    for kind in HOOK_PACKAGES:
        if data.get(kind) is not None:
            check_hook_spec(kind, data[kind], f"{path.parent.name}/{where}")
    specs = _list_of(where, data, "patterns", dict)
    if not specs:
        raise CatalogError(f"{where}: no [[patterns]]")
    rule = Rule(
        id=data["id"], title=data["title"], severity=data["severity"], family=data["family"],
        summary=data["summary"].strip(), explanation=data["explanation"].strip(),
        priority=_typed(where, data, "priority", int, 50), remedy=_typed(where, data, "remedy", str, None),
        refine=_typed(where, data, "refine", str, None),
        fix_method=_typed(where, data, "fix_method", str, "").strip(), versions=_typed(where, data, "versions", str, ""),
        examples=_list_of(where, data, "examples", dict), counterexamples=_list_of(where, data, "counterexamples", dict),
        raised_in=_list_of(where, data, "raised_in", str), path=str(path))
    rule.patterns = [_compile(rule.id, where, s, i) for i, s in enumerate(specs)]
    return rule


def load_catalog(rules_dir: str | Path | None = None) -> Catalog:
    directory = Path(rules_dir) if rules_dir else default_rules_dir()
    if not directory.is_dir():
        raise CatalogError(f"rules directory not found: {directory}")
    import tomllib

    rules: dict[str, Rule] = {}
    wrappers: list[regex.Pattern] = []
    structural: list[str] = []
    for path in sorted(directory.glob("*.toml")):
        if path.name.startswith("_"):
            try:
                table = tomllib.loads(path.read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise CatalogError(f"{path.name}: not valid TOML: {exc}") from None
            entries = _list_of(path.name, table, "wrappers", dict)
            try:
                wrappers += [regex.compile(w["regex"]) for w in entries]
            except (KeyError, TypeError, regex.error) as exc:
                raise CatalogError(f"{path.name}: bad wrapper entry: {exc}") from None
            for w in entries:
                _lint(f"{path.name}: wrapper {w['regex']!r}", w["regex"])
            structural += _list_of(path.name, table, "structural_literals", str)
            continue
        rule = load_rule(path)
        if rule.id in rules:
            raise CatalogError(f"{path.name}: duplicate rule id '{rule.id}' (also in {Path(rules[rule.id].path).name})")
        rules[rule.id] = rule
    if not rules:       # else every log would read as "no problem found"
        raise CatalogError(f"{directory}: no rule files (*.toml) in this rules directory")
    catalog = Catalog(rules, [w.pattern for w in wrappers], structural)
    catalog.wrappers = wrappers            # compiled already (that was their check): keep them
    return catalog


@lru_cache(maxsize=4)
def cached_catalog(rules_dir: str | None = None) -> Catalog:
    """The catalog of `rules_dir` (default: the shipped rules): from the cache when the files it was
    validated from are unchanged, else loaded with every regex compiled (a broken one fails here) and cached."""
    directory = Path(rules_dir) if rules_dir else default_rules_dir()
    if not directory.is_dir():
        raise CatalogError(f"rules directory not found: {directory}")
    key, file = _source_key(directory), _cache_file(directory)
    catalog = _load_cached(file, key) if file else None
    if catalog is None:
        catalog = load_catalog(directory)
        for pattern in catalog.patterns:
            pattern.regex                  # compiled to be checked: a broken one raises CatalogError
        if file:
            _store(file, key.encode() + b"\n", (_hooks_digest(catalog), catalog))
    return catalog


# --------------------------------------------------------------------------- the compiled catalog cache
# One file per rules directory: a line with the key of the rule files (names and bytes, the package and
# Python versions), then the pickle of (digest of the remedy/refine modules the specs were checked in, catalog).
CACHE_FORMAT = "3"       # 2: patterns linted (rules/lint.py) when the catalog is built; 3: Pattern.startup_only


def cache_dir() -> Path | None:
    """$VLLM_DOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/vllm-doctor, else ~/.cache/vllm-doctor."""
    own, xdg = os.environ.get("VLLM_DOCTOR_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME", "")
    try:
        return Path(own) if own else (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "vllm-doctor"
    except RuntimeError:                   # no home directory: no cache
        return None


def _digest(parts: list[str], paths: list[Path]) -> str:
    try:
        from _blake2 import blake2b        # hashlib loads OpenSSL first (~3 ms)
    except ImportError:
        from hashlib import blake2b
    h = blake2b("\0".join(parts).encode("utf-8", "surrogateescape"), digest_size=20)
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:                    # missing or unreadable: hashed as such
            data = None
        size = -1 if data is None else len(data)
        h.update(f"\0{path}\0{size}\0".encode("utf-8", "surrogateescape") + (data or b""))
    return h.hexdigest()


def _cache_file(directory: Path) -> Path | None:
    base = cache_dir()
    return None if base is None else base / f"catalog-{_digest([str(directory.resolve())], [])[:16]}.pickle"


def _source_key(directory: Path) -> str:
    return _digest([CACHE_FORMAT, __version__, sys.version, str(directory)], sorted(directory.glob("*.toml")))


def _hooks_digest(catalog: Catalog) -> str:
    """The module files check_hook_spec looked in for the rules' remedy/refine specs (both candidates)."""
    return _digest([], sorted(hook_files(rule for rule in catalog.rules.values())))


def _load_cached(file: Path, key: str) -> Catalog | None:
    try:
        try:
            from _pickle import loads      # what pickle.loads is, without pickle.py's imports (~1.5 ms)
        except ImportError:
            from pickle import loads
        with open(file, "rb") as f:
            if hasattr(os, "getuid") and os.fstat(f.fileno()).st_uid != os.getuid():
                return None                # another user's file: unpickling runs code, so never theirs
            head, _, body = f.read().partition(b"\n")
        if head == key.encode():
            digest, catalog = loads(body)
            if isinstance(catalog, Catalog) and digest == _hooks_digest(catalog):
                return catalog
    except Exception:                      # unreadable, truncated, corrupt, from other code: rebuild it
        pass
    return None


def _store(file: Path, head: bytes, value: object) -> None:
    """Written whole or not at all (temp file, os.replace); a directory that cannot be written is no error."""
    import pickle
    import tempfile

    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=file.name, suffix=".tmp", dir=file.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(head + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(temp, file)
    except Exception:
        Path(temp).unlink(missing_ok=True)


def match_text(rule: Rule, text: str):
    """The first pattern of `rule` that matches `text` (a raw log line), as (pattern, captures) or None."""
    from vllm_doctor.sources.lines import parse_line

    message = parse_line(text).message
    for pattern in rule.patterns:
        if pattern.literal in message:
            m = pattern.search(message)
            if m:
                return pattern, {k: v for k, v in m.groupdict().items() if v is not None}
    return None


def check_catalog(catalog: Catalog) -> list[str]:
    """Problems that make a catalog unfit to ship: every pattern compiles, every rule has examples
    that behave."""
    problems: list[str] = []
    for rule in catalog.rules.values():
        name = Path(rule.path).name
        for pattern in rule.patterns:
            try:
                pattern.regex
            except CatalogError as exc:
                problems.append(str(exc))
        if not rule.examples:
            problems.append(f"{name}: no [[examples]]")
        if not rule.counterexamples:
            problems.append(f"{name}: no [[counterexamples]]")
        for pattern in rule.patterns:
            if not any(pattern.literal in parse_message(ex.get("text", "")) for ex in rule.examples):
                problems.append(f"{name}: pattern '{pattern.name}' has no example containing its literal")
        for ex in rule.examples:
            got = match_text(rule, ex.get("text", ""))
            if got is None:
                problems.append(f"{name}: example does not match: {ex.get('text', '')[:100]!r}")
                continue
            want_pattern = ex.get("pattern")
            if want_pattern and got[0].name != want_pattern:
                problems.append(f"{name}: example matched pattern '{got[0].name}', expected '{want_pattern}'")
            for key, value in (ex.get("captures") or {}).items():
                if got[1].get(key) != str(value):
                    problems.append(f"{name}: example capture {key}={got[1].get(key)!r}, expected {value!r}")
        for ex in rule.counterexamples:
            if match_text(rule, ex.get("text", "")) is not None:
                problems.append(f"{name}: counterexample matches: {ex.get('text', '')[:100]!r}")
    return problems


def parse_message(text: str) -> str:
    from vllm_doctor.sources.lines import parse_line

    return parse_line(text).message
