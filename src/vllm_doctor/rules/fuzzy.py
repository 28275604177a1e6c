"""The last resort for retyped text: a rule's phrase found with a few typos or another letter case.

People retype errors into issues (`valueerror: ... 'trust_remote_code=true'`, `The server sockethas failed
to listen`). When nothing in a log explains its failure, the engine asks this module about the few error
lines that matched no rule. Bounded on purpose: only fatal patterns' literals of 16+ characters, only
lines that already share most of a phrase's words, at most one edit per 12 characters; a hit is repaired
(the phrase written back into the line) so the pattern's own regex still takes its captures.
"""
from __future__ import annotations

from dataclasses import dataclass

import regex

from vllm_doctor.regex_time import timed
from vllm_doctor.rules.catalog import Catalog, Pattern
from vllm_doctor.rules.search import LONG_LINE

MIN_PHRASE = 16
PHRASE_ALONE = 32     # a phrase this long names its rule even where the rest of the pattern does not match
WORD = regex.compile(r"[a-z]{4,}")
# A phrase's short words (`PP`, `not`, `TP`) carry its meaning in one or two letters: an edit there is another
# message (`--enable-hc-sp is not supported for this model` is not `PP is not supported for this model`).
SHORT = regex.compile(r"(?<![A-Za-z0-9])[A-Za-z]{1,3}(?![A-Za-z0-9])")
# A search with errors allowed costs more than an exact one: a larger bound, on few lines (the last error
# lines no rule matched, once the log ends), each cut to its first LONG_LINE characters.
FUZZY_TIMEOUT = 0.05


@dataclass(frozen=True)
class Phrase:
    pattern: Pattern
    text: str
    words: frozenset[str]
    fuzzy: regex.Pattern

    @property
    def caseless(self) -> regex.Pattern:      # the regex module caches compiled patterns itself
        return regex.compile(self.pattern.source, regex.IGNORECASE)

    @property
    def edited(self) -> regex.Pattern:
        return regex.compile(f"(?:{self.pattern.source}){{e<=2}}", regex.IGNORECASE | regex.BESTMATCH)


def _phrases(catalog: Catalog) -> tuple[Phrase, ...]:
    """Compiled once per catalog (kept on it: a fuzzy regex costs ~1 ms to compile)."""
    cached = getattr(catalog, "_fuzzy_phrases", None)
    if cached is not None:
        return cached
    out = []
    for pattern in catalog.patterns:
        literal = pattern.literal.strip()
        if pattern.kind != "fatal" or len(literal) < MIN_PHRASE:
            continue
        words = frozenset(WORD.findall(literal.lower()))
        if len(words) < 2:
            continue
        errors = max(1, len(literal) // 12)
        fuzzy = regex.compile(f"(?:{regex.escape(literal)}){{e<={errors}}}", regex.IGNORECASE | regex.BESTMATCH)
        out.append(Phrase(pattern, literal, words, fuzzy))
    catalog._fuzzy_phrases = tuple(out)
    return catalog._fuzzy_phrases


def _search(compiled: regex.Pattern, text: str):
    try:
        return timed(compiled, "search", text, budget=FUZZY_TIMEOUT)
    except TimeoutError:                  # as good as no match: this is the last resort already
        return None


def _keeps_short_words(phrase: str, found: str) -> bool:
    """Each short word of the phrase is in the text found, whole and case-blind."""
    words = {w.lower() for w in SHORT.findall(found)}
    return all(w.lower() in words for w in SHORT.findall(phrase))


def fuzzy_match(catalog: Catalog, text: str, skipped: dict[str, int] | None = None
                ) -> tuple[Pattern, dict[str, str]] | None:
    """The pattern whose phrase `text` holds (retyped), with the captures of the repaired text. A pattern
    whose whole regex also matches (exactly, case-blind, or with a few edits) beats one whose phrase alone
    does (`address already in use` is the phrase of several port patterns; one regex takes the port).
    Every search is bounded (`skipped` counts the rules whose own regex ran out of time); a phrase is looked
    for in a line's first LONG_LINE characters, and only a line that short is read case-blind or edited."""
    head = text[:LONG_LINE]
    lower = head.lower()
    present = set(WORD.findall(lower))
    first: tuple[Pattern, dict[str, str]] | None = None
    for phrase in _phrases(catalog):
        shared = len(phrase.words & present) + sum(1 for w in phrase.words - present if w in lower)
        if shared < 0.6 * len(phrase.words):
            continue
        # the phrase lies around the first places its words are: search that window, not the whole head (a
        # search with errors costs ~10 ms per 4k characters, and a long line repeats many phrases' words)
        firsts = [i for w in phrase.words if (i := lower.find(w)) >= 0]
        lo = max(0, min(firsts) - len(phrase.text)) if firsts else 0
        hi = min(len(head), max(firsts) + 2 * len(phrase.text)) if firsts else len(head)
        m = _search(phrase.fuzzy, head[lo:hi])
        if m is None:
            continue
        start, end = lo + m.start(), lo + m.end()
        if not _keeps_short_words(phrase.text, head[max(0, start - 3):end + 3]):
            continue
        repaired = text[:start] + phrase.text + text[end:]
        exact = phrase.pattern.search(repaired, skipped=skipped)
        if not exact and len(repaired) <= LONG_LINE:
            exact = _search(phrase.caseless, repaired) or _search(phrase.edited, repaired)
        if exact:
            return phrase.pattern, {k: v for k, v in exact.groupdict().items() if v is not None}
        if len(phrase.text) >= PHRASE_ALONE:     # a short phrase is no evidence without its pattern
            first = first or (phrase.pattern, {})
    return first
