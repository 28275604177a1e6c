"""Python's parse tree of a rule regex, for the lint (rules/lint.py): the parser (3.10's and 3.11's
names), the regex module's own syntax rewritten into what that parser reads, and a parsed part shown
back as pattern text for the lint's messages."""
from __future__ import annotations

try:                                   # Python 3.11+
    from re import _constants as C
    from re import _parser as sre_parse  # noqa: F401  (the lint parses with it)
except ImportError:                    # 3.10
    import sre_constants as C          # type: ignore[no-redef]
    import sre_parse                   # type: ignore[no-redef]  # noqa: F401

import regex as _regex

REPEATS = {C.MAX_REPEAT, C.MIN_REPEAT} | ({C.POSSESSIVE_REPEAT} if hasattr(C, "POSSESSIVE_REPEAT") else set())
ATOMIC = getattr(C, "ATOMIC_GROUP", None)
POSSESSIVE = getattr(C, "POSSESSIVE_REPEAT", None)
ATOMS = {C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN}


# ---------------------------------------------------------------------- showing a part of a pattern
def show_seq(items) -> str:
    text = "".join(show(op, av) for op, av in items) or "(empty)"
    return text if len(text) <= 40 else text[:37] + "..."


def show(op, av) -> str:
    if op == C.LITERAL:
        return _escape(av)
    if op == C.NOT_LITERAL:
        return f"[^{_escape(av)}]"
    if op == C.ANY:
        return "."
    if op == C.IN:
        if len(av) == 1 and av[0][0] == C.CATEGORY:
            return _CATEGORY_SHOWN.get(str(av[0][1]).rpartition("CATEGORY_")[2].replace("UNI_", ""), "[...]")
        return "[" + "".join(_show_in(o, a) for o, a in av) + "]"
    if op in REPEATS:
        low, high, body = av
        q = {(0, 1): "?", (0, C.MAXREPEAT): "*", (1, C.MAXREPEAT): "+"}.get(
            (low, high), f"{{{low},{'' if high == C.MAXREPEAT else high}}}")
        q += "?" if op == C.MIN_REPEAT else "+" if op == POSSESSIVE else ""
        inner = show_seq(body)
        single = len(body) == 1 and body[0][0] in ATOMS | {C.SUBPATTERN}
        return (inner if single else f"(?:{inner})") + q
    if op == C.SUBPATTERN:
        body = av[3]
        if len(body) == 1 and body[0][0] == C.BRANCH:
            return "(" + "|".join(show_seq(b) for b in body[0][1][1]) + ")"
        return f"({show_seq(body)})"
    if op == C.BRANCH:
        return "(?:" + "|".join(show_seq(b) for b in av[1]) + ")"
    if op in (C.GROUPREF, C.GROUPREF_EXISTS):
        return "(?P=...)"
    if op == ATOMIC:
        return f"(?>{show_seq(av)})"
    if op == C.AT:
        return {C.AT_BEGINNING: "^", C.AT_END: "$"}.get(av, "\\b")
    return "(...)"


def _escape(code: int) -> str:
    c = chr(code)
    if c in ".^$*+?{}[]\\|()":
        return "\\" + c
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c, c if c.isprintable() else f"\\x{code:02x}")


_CATEGORY_SHOWN = {"DIGIT": r"\d", "NOT_DIGIT": r"\D", "SPACE": r"\s", "NOT_SPACE": r"\S", "WORD": r"\w",
                   "NOT_WORD": r"\W"}


def _show_in(op, av) -> str:
    if op == C.NEGATE:
        return "^"
    if op == C.RANGE:
        return f"{_escape(av[0])}-{_escape(av[1])}"
    if op == C.CATEGORY:
        return _CATEGORY_SHOWN.get(str(av).rpartition("CATEGORY_")[2].replace("UNI_", ""), "")
    return _escape(av) if op == C.LITERAL else ""


# ---------------------------------------------------------------------- the regex module's own syntax
# Rewrites that keep a pattern's repeats and classes but drop what Python's parser does not know.
_REGEX_ONLY = [
    (_regex.compile(r"\\[pP]\{[^}]*\}|\\[pP][A-Za-z]"), r"\\w"),            # Unicode properties: letters
    (_regex.compile(r"\{[eisd]\s*[<=>][^}]*\}"), ""),                        # fuzzy constraints
    (_regex.compile(r"\(\?\|"), "(?:"),                                      # branch reset
    (_regex.compile(r"\\[mM]"), r"\\b"),                                     # word start / end
    (_regex.compile(r"\(\?V[01]\)|\(\?[bew]+\)"), ""),                       # version and matching flags
    (_regex.compile(r"\\L<\w+>"), "x"),                                      # named lists
]
_NAMED_GROUP = _regex.compile(r"\(\?P?<(?![=!])(\w+)>")


def portable(source: str) -> str:
    """The pattern as Python's parser reads it: each group name made unique (the regex module lets two
    alternatives name the same group), the regex module's own syntax rewritten."""
    counter, first = iter(range(1 << 30)), {}

    def unique(m) -> str:
        name = f"{m.group(1)}_{next(counter)}"
        first.setdefault(m.group(1), name)
        return f"(?P<{name}>"

    source = _NAMED_GROUP.sub(unique, source)
    source = _regex.sub(r"\(\?P=(\w+)\)", lambda m: f"(?P={first.get(m.group(1), m.group(1))})", source)
    for pattern, replacement in _REGEX_ONLY:
        source = pattern.sub(replacement, source)
    return source
