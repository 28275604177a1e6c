"""Other readings of a line that pasting, wrapping or another layer has damaged.

Rules are written from the message as vLLM prints it; real logs carry it as people paste it: a terminal's
hard wrap leaves runs of spaces (sometimes inside a word), a colour code survives as text (`←[36m`), an
inference platform puts `[address=..., pid=...]` between the exception type and the message, a
capability check prints its message as a Python tuple of string fragments, Markdown eats backticks. The
engine matches a rule against these readings only when the line as printed matched nothing, and only on
lines the scanner already picked, so the clean path pays nothing. One place for this, not one per rule.
"""
from __future__ import annotations

import regex

# Colour codes whose ESC byte was lost or rendered: `←[36m`, `^[[0m`, a literal `\x1b[0m`/`\033[0m`/
# `\u001b[0m`, or a bare `[0;36m`/`[0m` (the ESC dropped by a paste).
# rsyslog writes control bytes as `#033` (ESC) and `#015` (CR).
REMNANT = regex.compile(r"(?:←|\^\[|\\x1b|\\033|\\u001b|\\e|#033)\[[0-9;]{0,12}[mK]|\[(?:0|[0-9]{1,2}(?:;[0-9]{1,3})+)m"
                        r"|#015$")
# Inference platforms and Ray put the calling actor between `Type: ` and the message.
WRAPPER_TAG = regex.compile(r"(?<=^|: |\] )(?:\[address=[^\]]*\]|ray::\S+\(\)? ?\((?:pid=\d+[^)]*)\)|\((?:pid=\d+[^)]*)\))\s*")
# `ValueError: ('Bfloat16 is only supported on GPUs ... ', 'Your Tesla T4 GPU has ...')`
TUPLE_REPR = regex.compile(r"\(\s*((?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))+)\s*,?\s*\)")
STRING = regex.compile(r"'([^']*)'|\"([^\"]*)\"")
SPACES = regex.compile(r"[ \t\u00a0]{2,}")
# A run of blanks between two letters of one word, as a terminal's wrap leaves it (`divisi      ble`).
IN_WORD = regex.compile(r"(?<=[a-z])[ \t]{2,}(?=[a-z])")
DAMAGE_HINTS = ("  ", "\t", "←", "^[", "\\x1b", "\\033", "\\u001b", "#033[", "#015", "[address=", "ray::", "('", "(\"", "[0m",
                "\u00a0", "pid=")


def looks_damaged(message: str) -> bool:
    return any(hint in message for hint in DAMAGE_HINTS)


def _join_tuple(m: regex.Match) -> str:
    return "".join((s.group(1) if s.group(1) is not None else s.group(2)) for s in STRING.finditer(m.group(1)))


def readings(message: str) -> list[str]:
    """Repaired readings of `message`, most faithful first, none equal to it; [] for a clean line."""
    if not looks_damaged(message):
        return []
    text = REMNANT.sub("", message)
    text = WRAPPER_TAG.sub("", text)
    if "('" in text or '("' in text:
        text = TUPLE_REPR.sub(_join_tuple, text)
    out: list[str] = []
    collapsed = SPACES.sub(" ", text).strip()
    for candidate in (collapsed, IN_WORD.sub("", text).strip()):
        candidate = SPACES.sub(" ", candidate)
        if candidate != message and candidate not in out:
            out.append(candidate)
    return out


def join_continuation(parts: list[str]) -> str:
    """A message the terminal or the logger wrapped over several lines, as one line."""
    return SPACES.sub(" ", " ".join(p.strip() for p in parts if p.strip()))
