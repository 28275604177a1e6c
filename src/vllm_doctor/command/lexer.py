"""Shell and YAML-list tokenisers that keep every character, so a command renders back unchanged.

A Token keeps the separator before it (spaces, ' \\\n  ' continuations, ', ' in YAML flow lists),
its raw spelling (quotes kept) and the value the program receives.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass


@dataclass
class Token:
    sep: str
    raw: str
    value: str


_OPERATOR = re.compile(r"\d*(?:\|\|?|&&|;|&|>>?|<)")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./~^-]+")
# runs the lexer takes whole instead of one character at a time (a command of 10^6 characters is lexed in
# a fraction of a second): unquoted text with no quote, escape, blank or operator, and the inside of a
# double-quoted string up to its next quote or backslash
_PLAIN_RUN = re.compile(r"""[^ \t\r\n|;&<>'"\\]+""")
_DQUOTED_RUN = re.compile(r'[^"\\]+')


def lex_shell(text: str) -> tuple[list[Token], str]:
    """Split a shell command line into tokens; returns (tokens, tail).

    The tail starts at the first unquoted control operator or redirection (`| tee log`, `2>&1`,
    `&`, `# comment`) and is kept verbatim, like trailing whitespace.
    """
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        start = i
        while i < n and (text[i] in " \t\r\n" or text.startswith("\\\n", i) or text.startswith("\\\r\n", i)):
            i += 3 if text.startswith("\\\r\n", i) else (2 if text[i] == "\\" else 1)
        sep = text[start:i]
        if i >= n or text[i] == "#" or _OPERATOR.match(text, i) and _is_operator_start(text, i):
            return tokens, text[start:]
        j, value = i, []
        while j < n and text[j] not in " \t\r\n" and not (text[j] in "|;&<>" ):
            c = text[j]
            run = _PLAIN_RUN.match(text, j)
            if run:
                value.append(run.group())
                j = run.end()
            elif c == "'":
                k = text.find("'", j + 1)
                k = n - 1 if k < 0 else k
                value.append(text[j + 1:k])
                j = k + 1
            elif c == '"':
                j += 1
                while j < n and text[j] != '"':
                    run = _DQUOTED_RUN.match(text, j)
                    if run:
                        value.append(run.group())
                        j = run.end()
                        continue
                    if text[j] == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                        j += 1
                    value.append(text[j])
                    j += 1
                j += 1
            elif c == "\\" and j + 1 < n:
                if text[j + 1] == "\n":
                    break
                value.append(text[j + 1])
                j += 2
            else:
                value.append(c)
                j += 1
        if j == i:   # a lone operator character inside the line: keep the rest as tail
            return tokens, text[start:]
        tokens.append(Token(sep, text[i:j], "".join(value)))
        i = j
    return tokens, ""


def _is_operator_start(text: str, i: int) -> bool:
    m = _OPERATOR.match(text, i)
    # digits count only as a redirection like 2>&1, not as a plain number token
    return bool(m) and (not text[i].isdigit() or m.end() > i and not m.group(0).isdigit())


def quote_shell(value: str, like: str | None = None) -> str:
    """Shell-quote value, reusing the quote style of `like` (the raw text it replaces)."""
    if like and like.startswith("'") and "'" not in value:
        return f"'{value}'"
    if like and like.startswith('"'):
        return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'
    if value and _SHELL_SAFE.fullmatch(value):
        return value
    return shlex.quote(value)


# ---- YAML lists (docker compose `command:` / Kubernetes `args:`) -------------------------------

_YAML_PLAIN_BAD = re.compile(r"""^$|^[\[\]{},#&*!|>'"%@`]|^[-?:](\s|$)|:\s|\s#|^\s|\s$""")
_YAML_SCALAR = re.compile(r"(?i)^(true|false|yes|no|on|off|null|~|[-+]?(\d[\d_]*\.?\d*|\.\d+)(e[-+]?\d+)?)$")


def yaml_value(raw: str) -> str:
    """Decode one YAML scalar as written in a list item."""
    raw = raw.strip()
    if raw.startswith('"') and raw.endswith('"') and len(raw) > 1:
        try:
            return json.loads(raw)
        except ValueError:
            return raw[1:-1]
    if raw.startswith("'") and raw.endswith("'") and len(raw) > 1:
        return raw[1:-1].replace("''", "'")
    return raw


def quote_yaml(value: str, like: str | None = None, flow: bool = False) -> str:
    """Spell value as a YAML list item in the style of `like`; quote only what YAML would misread."""
    if like and like.startswith("'"):
        return "'" + value.replace("'", "''") + "'"
    if like and like.startswith('"'):
        return json.dumps(value)
    numeric_like = like is not None and bool(_YAML_SCALAR.match(like))
    if _YAML_PLAIN_BAD.search(value) or (flow and re.search(r"[,\[\]{}]", value)):
        return json.dumps(value)
    if _YAML_SCALAR.match(value) and not numeric_like:
        return json.dumps(value)
    return value


def lex_yaml_flow(body: str) -> tuple[str, list[Token], str]:
    """'[ "a", b ]' -> (prefix '[', tokens, tail ' ]')."""
    lb = body.index("[")
    i, n = lb + 1, len(body)
    tokens: list[Token] = []
    while True:
        start = i
        while i < n and (body[i] in " \t\r\n" or (body[i] == "," and True)):
            i += 1
        if i >= n or body[i] == "]":
            return body[:lb + 1], tokens, body[start:]
        j = i
        if body[i] in "\"'":
            q = body[i]
            j = i + 1
            while j < n and body[j] != q:
                j += 2 if (q == '"' and body[j] == "\\") else 1
                if q == "'" and body.startswith("''", j):
                    j += 2
            j += 1
        else:
            while j < n and body[j] not in ",]\n":
                j += 1
            while j > i and body[j - 1] in " \t":
                j -= 1
        raw = body[i:j]
        tokens.append(Token(body[start:i], raw, yaml_value(raw)))
        i = j


def lex_yaml_block(body: str) -> tuple[list[Token], str]:
    """'\\n  - a\\n  - "b"\\n' -> (tokens, tail '\\n')."""
    tokens: list[Token] = []
    pos = 0
    for m in re.finditer(r"(?m)^([ \t]*-[ \t]+)(.*?)[ \t]*$", body):
        raw = m.group(2)
        if not raw or raw.startswith("#"):
            continue
        tokens.append(Token(body[pos:m.start(2)], raw, yaml_value(raw)))
        pos = m.start(2) + len(raw)
    return tokens, body[pos:]
