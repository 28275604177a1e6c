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

from vllm_doctor.rules.catalog import Catalog, Pattern

MIN_PHRASE = 16
PHRASE_ALONE = 32     # a phrase this long names its rule even where the rest of the pattern does not match
WORD = regex.compile(r"[a-z]{4,}")


@dataclass(frozen=True)
class Phrase:
    pattern: Pattern
    text: str
    words: frozenset[str]
    fuzzy: regex.Pattern


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


def fuzzy_match(catalog: Catalog, text: str) -> tuple[Pattern, dict[str, str]] | None:
    """The pattern whose phrase `text` holds (retyped), with the captures of the repaired text. A pattern
    whose whole regex also matches (exactly, case-blind, or with a few edits) beats one whose phrase alone
    does (`address already in use` is the phrase of several port patterns; one regex takes the port)."""
    lower = text.lower()
    present = set(WORD.findall(lower))
    first: tuple[Pattern, dict[str, str]] | None = None
    for phrase in _phrases(catalog):
        shared = len(phrase.words & present) + sum(1 for w in phrase.words - present if w in lower)
        if shared < 0.6 * len(phrase.words):
            continue
        m = phrase.fuzzy.search(text)
        if m is None:
            continue
        repaired = text[:m.start()] + phrase.text + text[m.end():]
        source = phrase.pattern.source
        exact = (phrase.pattern.regex.search(repaired) or regex.search(source, repaired, regex.IGNORECASE)
                 or regex.search(f"(?:{source}){{e<=2}}", repaired, regex.IGNORECASE | regex.BESTMATCH, timeout=0.5))
        if exact:
            return phrase.pattern, {k: v for k, v in exact.groupdict().items() if v is not None}
        if len(phrase.text) >= PHRASE_ALONE:     # a short phrase is no evidence without its pattern
            first = first or (phrase.pattern, {})
    return first
