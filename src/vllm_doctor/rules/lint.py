r"""The catalog lint: a rule regex that can backtrack catastrophically is refused when the catalog loads.

A backtracking engine tries every way a pattern can split a line before it gives up on it. Where two
repeats can take the same characters, the ways multiply with the line's length: a 300-character line can
stall a pipe for seconds, a 100k one for hours. The lint reads the pattern's syntax tree (Python's own
regex parser, which reads the common syntax of the `regex` module) and refuses:

- nested repeats whose inner repeat can take a whole iteration of the outer one: `(a+)+`, `(\s*\w+)*`;
- adjacent unbounded repeats over overlapping characters, optional parts between them included, or
  text both can take: `\s*\s*`, `.*\s+.*`, `\w+\d+`, `.+?\s*$`, `.*(?:x)?.*`, `\w*C\w*`, `.*?: .*?`;
- alternatives that can match the same text, under a repeat: `(a|ab)*`;
- a pattern that starts with an unbounded repeat and no anchor or guard before it: `\d+ is not`
  (a search restarts inside every run of digits: quadratic in the run's length).

A repeat of at most LONG characters counts as bounded: `.{0,200}` before `\s*` costs at most 200 steps a
character. Characters are compared on a sample alphabet (ASCII, the pattern's own literals and a few
Unicode letters, digits and spaces), which is exact for the classes rules use. Python's parser merges
one-character alternatives into a class (`(?:a|a)` reads as `[a]`), so those escape the lint: the
run-time timeout (rules/search.py SEARCH_TIMEOUT) is what bounds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vllm_doctor.rules.regex_syntax import ATOMIC as _ATOMIC, ATOMS as _ATOMS, C, POSSESSIVE as _POSSESSIVE, \
    REPEATS as _REPEATS, portable as _portable, show as _show, show_seq as _show_seq, sre_parse

LONG = 256            # a repeat allowed more than this many times is unbounded for the lint
FEW = 8               # an outer repeat of at most this many iterations multiplies the ways by little
ADVICE = ("bound the repeat (e.g. {0,200}), make the parts take different characters, or make the first "
          "one possessive (*+, ++) where it never needs to give characters back")
_EXTRA = "\x85\xa0\u2003\u3000\u2028éßЖ中٣\U0001F600"   # Unicode spaces, letters, a digit, an emoji
_BASE = frozenset(map(chr, range(128))) | frozenset(_EXTRA)
_START_ANCHORS = {C.AT_BEGINNING, C.AT_BEGINNING_STRING, C.AT_BOUNDARY, getattr(C, "AT_UNI_BOUNDARY", C.AT_BOUNDARY)}
_IGNORECASE, _DOTALL = sre_parse.SRE_FLAG_IGNORECASE, sre_parse.SRE_FLAG_DOTALL


@dataclass(frozen=True)
class Repeat:
    """A repeat the lint weighs: the characters it can take (and start with), whether it can run long,
    whether it gives characters back (a possessive repeat or one in an atomic group does not), how it
    is written."""
    chars: frozenset
    first: frozenset
    last: frozenset
    long: bool
    firm: bool
    shown: str


class Linter:
    def __init__(self, source: str, ignorecase: bool = False) -> None:
        self.tree = sre_parse.parse(source, _IGNORECASE if ignorecase else 0)
        flags = self.tree.state.flags
        self.icase, self.dotall = bool(flags & _IGNORECASE), bool(flags & _DOTALL)
        literals = {chr(av) for op, av in _walk(self.tree.data) if op in (C.LITERAL, C.NOT_LITERAL)}
        self.alphabet = _BASE | frozenset(literals)
        self._own = frozenset(literals) - _BASE
        self.problems: list[str] = []
        self._chars: dict[int, frozenset] = {}        # by id of the item's value: the tree outlives the lint
        self._categories: dict[str, frozenset] = {}

    # ------------------------------------------------------------------ characters
    def chars(self, op, av) -> frozenset:
        """The sample characters a one-character item matches."""
        if op == C.IN:
            got = self._chars.get(id(av))
            if got is None:
                got = self._chars[id(av)] = self._fold(self._class(av))
            return got
        if op == C.LITERAL:
            got = frozenset({chr(av)})
        elif op == C.NOT_LITERAL:
            got = self.alphabet - self._fold({chr(av)})
        else:
            got = self.alphabet if self.dotall else self.alphabet - {"\n"}
        return self._fold(got)

    def _class(self, items) -> frozenset:
        negate = bool(items) and items[0][0] == C.NEGATE
        got: set[str] = set()
        for op, av in items[1:] if negate else items:
            if op == C.LITERAL:
                got.add(chr(av))
            elif op == C.RANGE:
                got |= {c for c in self.alphabet if av[0] <= ord(c) <= av[1]}
            elif op == C.CATEGORY:
                got |= self._category(str(av))
        got = set(self._fold(frozenset(got)))
        return self.alphabet - got if negate else frozenset(got)

    def _category(self, category: str) -> frozenset:
        got = self._categories.get(category)
        if got is None:
            got = self._categories[category] = _base_category(category) | {
                c for c in self._own if _in_category(c, category)}
        return got

    def _fold(self, chars: frozenset) -> frozenset:
        if not self.icase:
            return chars
        return frozenset(chars | {c.swapcase() for c in chars if len(c.swapcase()) == 1})

    def alphabet_of(self, items) -> frozenset:
        """Every character a sequence can take (lookarounds aside)."""
        out: set[str] = set()
        for op, av in items:
            if op in _ATOMS:
                out |= self.chars(op, av)
            else:
                for body in _bodies(op, av, lookarounds=False):
                    out |= self.alphabet_of(body)
        return frozenset(out)

    # ------------------------------------------------------------------ shape
    def nullable(self, items) -> bool:
        return all(self._nullable_item(op, av) for op, av in items)

    def _nullable_item(self, op, av) -> bool:
        if op in _ATOMS:
            return False
        if op in _REPEATS:
            return av[0] == 0 or self.nullable(av[2])
        if op == C.BRANCH:
            return any(self.nullable(b) for b in av[1])
        if op == C.GROUPREF_EXISTS:
            return self.nullable(av[1]) or av[2] is None or self.nullable(av[2])
        bodies = _bodies(op, av, lookarounds=False)
        return all(self.nullable(b) for b in bodies)      # anchors, lookarounds, back-references: width 0 here

    def within(self, items, allowed: frozenset) -> tuple[bool, bool]:
        """(can match the empty string, can match a non-empty one) using only `allowed` characters."""
        empty, nonempty = True, False
        for op, av in items:
            e, n = self._within_item(op, av, allowed)
            if not (e or n):
                return False, False
            empty, nonempty = empty and e, nonempty or n
        return empty, nonempty

    def _within_item(self, op, av, allowed) -> tuple[bool, bool]:
        if op in _ATOMS:
            return False, bool(self.chars(op, av) & allowed)
        if op in _REPEATS:
            e, n = self.within(av[2], allowed)
            return av[0] == 0 or e, n and av[1] > 0
        if op == C.BRANCH:
            parts = [self.within(b, allowed) for b in av[1]]
            return any(p[0] for p in parts), any(p[1] for p in parts)
        if op == C.GROUPREF_EXISTS:
            parts = [self.within(b, allowed) for b in (av[1], av[2] or []) ]
            return any(p[0] for p in parts), any(p[1] for p in parts)
        bodies = _bodies(op, av, lookarounds=False)
        return self.within(bodies[0], allowed) if bodies else (True, False)

    def first(self, items, reverse: bool = False) -> frozenset:
        """The characters a match of the sequence can start with (`reverse`: end with)."""
        out: set[str] = set()
        for op, av in reversed(items) if reverse else items:
            if op in _ATOMS:
                return frozenset(out | self.chars(op, av))
            if op == C.BRANCH:
                out |= {c for b in av[1] for c in self.first(b, reverse)}
            elif op == C.GROUPREF_EXISTS:
                out |= self.first(av[1], reverse) | self.first(av[2] or [], reverse)
            else:
                for body in _bodies(op, av, lookarounds=False):
                    out |= self.first(body, reverse)
            if not self._nullable_item(op, av):
                break
        return frozenset(out)

    def repeat(self, op, av, firm: bool) -> Repeat:
        low, high, body = av
        return Repeat(self.alphabet_of(body), self.first(body), self.first(body, reverse=True), high > LONG,
                      firm or op == _POSSESSIVE, _show(op, av))

    def lead(self, items, firm: bool = False) -> list[Repeat]:
        """The unbounded repeats a match of the sequence can begin with (through optional parts)."""
        out: list[Repeat] = []
        for op, av in items:
            out += self._edge(op, av, firm, self.lead)
            if not self._nullable_item(op, av):
                break
        return out

    def trail(self, items, firm: bool = False) -> list[Repeat]:
        """The unbounded repeats a match of the sequence can end with."""
        out: list[Repeat] = []
        for op, av in reversed(items):
            out += self._edge(op, av, firm, self.trail)
            if not self._nullable_item(op, av):
                break
        return out

    def _edge(self, op, av, firm, edge) -> list[Repeat]:
        if op in _REPEATS:
            got = edge(av[2], firm or op == _POSSESSIVE)
            if av[1] > LONG:
                got.append(self.repeat(op, av, firm))
            return got
        if op == C.BRANCH:
            return [r for b in av[1] for r in edge(b, firm)]
        if op == C.GROUPREF_EXISTS:
            return edge(av[1], firm) + edge(av[2] or [], firm)
        if op == _ATOMIC:
            return edge(av, True)
        bodies = _bodies(op, av, lookarounds=False)
        return edge(bodies[0], firm) if bodies else []

    # ------------------------------------------------------------------ the checks
    def check(self) -> list[str]:
        self._sequence(self.tree.data, firm=False)
        self._leading(self.tree.data)
        return list(dict.fromkeys(self.problems))

    def _leading(self, items) -> None:
        """A search tries the pattern at every position: one that starts with an unbounded repeat retries
        it from inside every run of its characters, unless an anchor or a look-behind starts the pattern."""
        for k, (op, av) in enumerate(items):
            if op == C.AT and av in _START_ANCHORS:
                return
            if op == C.ASSERT or op == C.ASSERT_NOT:
                if av[0] < 0:                       # a look-behind: the start must follow something
                    return
                continue
            if op == C.BRANCH:
                for branch in av[1]:
                    self._leading(list(branch) + list(items[k + 1:]))
                return
            if op == C.SUBPATTERN:
                self._leading(list(av[3]) + list(items[k + 1:]))
                return
            if op in _REPEATS and av[1] > LONG:
                self.problems.append(f"it starts with the unbounded repeat {_show(op, av)}, which a search "
                                     f"retries from inside every run of it: put an anchor or a look-behind "
                                     f"before it (^, \\b, (?<!\\S)) or bound it (e.g. {{0,200}})")
                return
            if not self._nullable_item(op, av):
                return

    def _sequence(self, items, firm: bool) -> None:
        items = list(items)
        for i, (op, av) in enumerate(items):
            self._item(op, av, firm)
            for left in self.trail([(op, av)], firm):
                if not left.firm:
                    self._after(left, items[i + 1:], firm)

    def _after(self, left: Repeat, rest: list, firm: bool) -> None:
        r"""`left` then each later unbounded repeat the boundary can slide to: through optional parts
        (`.+?\s*`, `.*(?:x)?.*`) or through text both repeats can take (`\w*C\w*`, `.*?: .*?`)."""
        for j, (op, av) in enumerate(rest):
            between = rest[:j]
            for right in self.lead([(op, av)], firm):
                if self._slides(left, between, right):
                    where = "one after the other" if self.nullable(between) else f"around {_show_seq(between)}"
                    self.problems.append(f"the unbounded repeats {left.shown} and {right.shown} can take the "
                                         f"same characters {where}: {ADVICE}")
            if not any(self.within(rest[:j + 1], left.chars)):
                return                                  # `left` cannot run past this item

    def _slides(self, left: Repeat, between: list, right: Repeat) -> bool:
        """Whether one text splits between `left`, `between` and `right` in several ways: `right` can
        start on what `left` or `between` start with, `left` end on what `right` or `between` end with,
        and `between` is optional or made of characters both repeats take (then it can be either's)."""
        if not (right.first & (left.chars | self.first(between))
                and left.last & (right.chars | self.first(between, reverse=True))):
            return False
        return self.nullable(between) or self.within(between, left.chars & right.chars)[1]

    def _item(self, op, av, firm: bool) -> None:
        if op in _REPEATS:
            inner_firm = firm or op == _POSSESSIVE
            if av[1] >= 2 and not inner_firm:
                self._nested(op, av)
                self._iterations(op, av)
            self._sequence(av[2], inner_firm)
            return
        if op == C.BRANCH:
            for branch in av[1]:
                self._sequence(branch, firm)
            return
        if op == _ATOMIC:
            self._sequence(av, True)
            return
        for body in _bodies(op, av, lookarounds=True):
            self._sequence(body, firm)

    def _nested(self, op, av) -> None:
        """`(a+)+`: a repeat inside a repeat, where the inner one can take a whole iteration of the outer
        one: every split of a run between iterations is tried."""
        outer_low, outer_high, body = av
        for inner_op, inner_av in _walk(body, into_firm=False):
            if inner_op not in _REPEATS or inner_av[1] <= inner_av[0] or inner_op == _POSSESSIVE:
                continue
            if inner_av[1] <= LONG and outer_high <= FEW:
                continue
            inner = self.repeat(inner_op, inner_av, False)
            if self.within(body, inner.chars)[1]:
                self.problems.append(f"the repeat {inner.shown} inside the repeated {_show(op, av)} can take "
                                     f"a whole iteration of it: make each iteration start with a character "
                                     f"{inner.shown} cannot take, or {ADVICE}")
        if outer_high > FEW:
            for branch_op, branch_av in _walk(body, into_firm=False):
                if branch_op == C.BRANCH:
                    self._alternatives(op, av, branch_av[1])

    def _iterations(self, op, av) -> None:
        r"""`(?:x\s*\s*)+` across iterations: one iteration's end and the next one's start."""
        body = av[2]
        for left in self.trail(body):
            for right in self.lead(body):
                if not left.firm and self._slides(left, [], right):
                    self.problems.append(f"the unbounded repeats {left.shown} and {right.shown} meet between "
                                         f"iterations of {_show(op, av)}: {ADVICE}")

    def _alternatives(self, op, av, branches) -> None:
        heads = [self._heads(b) for b in branches]
        for i in range(len(heads)):
            for j in range(i + 1, len(heads)):
                if _may_share(heads[i], heads[j]):
                    self.problems.append(f"alternatives {_show_seq(branches[i])} and {_show_seq(branches[j])} "
                                         f"of the repeated {_show(op, av)} can match the same text: make them "
                                         f"start differently, or {ADVICE}")

    def _heads(self, items) -> tuple[list[frozenset], bool]:
        """The character sets of an alternative's first characters, as far as they are fixed (then the
        characters the rest starts with), and whether that is all of the alternative."""
        out: list[frozenset] = []
        items = list(items)
        for k, (op, av) in enumerate(items):
            if op in _ATOMS:
                out.append(self.chars(op, av))
                continue
            if op == C.SUBPATTERN and av[1] == av[2] == 0:
                inner, whole = self._heads(av[3])
                out += inner
                if whole:
                    continue
                return out, False
            if not self.nullable(items[k:]):         # what follows starts with one of these at least
                out.append(self.first(items[k:]))
            return out, False
        return out, True


def _may_share(a: tuple[list[frozenset], bool], b: tuple[list[frozenset], bool]) -> bool:
    """Whether two alternatives can match one text, or one a start of the other's (`a|ab`): unless some
    position tells them apart, they may (the same text, a prefix, or unknown past what is fixed)."""
    return all(x & y for x, y in zip(a[0], b[0]))


@lru_cache(maxsize=32)
def _base_category(category: str) -> frozenset:
    return frozenset(c for c in _BASE if _in_category(c, category))


def _in_category(c: str, category: str) -> bool:
    name = category.rpartition("CATEGORY_")[2].replace("UNI_", "").replace("LOC_", "")
    digit, space, word = c.isdecimal(), c.isspace(), c.isalnum() or c == "_"
    return {"DIGIT": digit, "NOT_DIGIT": not digit, "SPACE": space, "NOT_SPACE": not space, "WORD": word,
            "NOT_WORD": not word, "LINEBREAK": c == "\n", "NOT_LINEBREAK": c != "\n"}.get(name, True)


def _bodies(op, av, lookarounds: bool) -> list:
    """The sub-sequences of a compound item (a group's body, a repeat's body, a look-around's)."""
    if op == C.SUBPATTERN:
        return [av[3]]
    if op in _REPEATS:
        return [av[2]]
    if op == _ATOMIC:
        return [av]
    if op == C.BRANCH:
        return list(av[1])
    if op == C.GROUPREF_EXISTS:
        return [av[1]] + ([av[2]] if av[2] is not None else [])
    if op in (C.ASSERT, C.ASSERT_NOT) and lookarounds:
        return [av[1]]
    return []


def _walk(items, into_firm: bool = True):
    """Every item of a sequence, at any depth (look-arounds included)."""
    for op, av in items:
        yield op, av
        if not into_firm and (op == _ATOMIC or op == _POSSESSIVE):
            continue
        for body in _bodies(op, av, lookarounds=True):
            yield from _walk(body, into_firm)


def lint(source: str, ignorecase: bool = False) -> list[str]:
    """Why `source` can backtrack catastrophically (one sentence each); [] when it cannot, or when its
    syntax is beyond Python's parser even rewritten (the run-time timeout is then its only bound)."""
    try:          # rewritten first: Python's parser reads a fuzzy `{e<=1}` as literal text, not as an error
        linter = Linter(_portable(source), ignorecase)
    except (sre_parse.error, RecursionError, OverflowError, ValueError, TypeError, IndexError):
        return []
    return linter.check()
