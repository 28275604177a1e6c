"""Rebuild a launch command from what vLLM logged: `non-default args: {…}` or `args: Namespace(…)`."""
from __future__ import annotations

import ast
import re
import json

from . import flags as F
from .versions import HEAD, at_least
from .lexer import quote_shell


def _defaults() -> dict:
    return F._data("namespace_defaults.json")


def _split_top(s: str) -> list[str]:
    """Split 'a=1, b=[1, 2], c="x,y"' at commas outside brackets and quotes."""
    out, depth, quote, cur = [], 0, None, []
    i = 0
    while i < len(s):
        c = s[i]
        cur.append(c)
        if quote:
            if c == "\\" and i + 1 < len(s):
                cur.append(s[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            cur.pop()
            out.append("".join(cur).strip())
            cur = []
        i += 1
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


# an Enum member's repr, `<ConfigFormat.AUTO: 'auto'>`: the command line spells it by its value
ENUM_REPR = re.compile(r"<[A-Za-z_][\w.]{0,100}: (.{1,200})>")


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        enum = ENUM_REPR.fullmatch(text)
        if enum:
            return _literal(enum.group(1))
        return text   # e.g. <function serve at 0x7f…> or CompilationConfig(...): keep the repr


KEY = re.compile(r"[A-Za-z_]\w*$")


def is_cut(text: str) -> bool:
    """A printed dict/Namespace that the log (or a paste) cut before its closing bracket."""
    text = text.strip()
    return (text.startswith("{") and not text.endswith("}")) or (text.startswith("Namespace(") and not text.endswith(")"))


def parse_args_repr(text: str) -> dict:
    """`{'model': 'x', 'tensor_parallel_size': 3}` or `Namespace(model='x', …)` -> dict (never raises).

    A repr cut before its end keeps only the pairs that are whole: the last one (perhaps cut mid-token) is
    dropped, and so is any whose key is no name or whose value is no complete literal, so that no fact and
    no flag of a rebuilt command comes from half a value."""
    text = text.strip()
    cut = is_cut(text)
    if text.startswith("{"):
        val = _literal(text)
        if isinstance(val, dict):
            return val
        text = text[1:] if cut else text[1:-1]
        pairs = [p.split(":", 1) for p in _split_top(text) if ":" in p]
        if cut:
            pairs = [(k, v) for k, v in pairs[:-1] if _whole(v)]
        return {str(_literal(k.strip())): _literal(v.strip()) for k, v in pairs}
    if text.startswith("Namespace("):
        text = text[len("Namespace("):] if cut else text[len("Namespace("):-1]
    out = {}
    parts = _split_top(text)
    for part in parts[:-1] if cut else parts:
        key, eq, val = part.partition("=")
        if eq and (not cut or (KEY.match(key.strip()) and _whole(val))):
            out[key.strip()] = _literal(val.strip())
    return out


def _whole(value: str) -> bool:
    try:
        ast.literal_eval(value.strip())
        return True
    except (ValueError, SyntaxError):
        return False


def _is_default(key: str, value) -> bool:
    known = _defaults()["defaults"]
    if key in known:
        return any(value == d and type(value) is type(d) or (value == d and isinstance(d, float))
                   for d in known[key])
    return value in (None, False, "", [], {})


def args_to_argv(args: dict, version: str | None = None, namespace: bool = False) -> tuple[list[str], list[str]]:
    """Serve argv (launcher included) and notes, from a logged args dict."""
    notes: list[str] = []
    meta = set(_defaults()["meta"])
    model = args.get("model_tag") or args.get("model")
    legacy = not at_least(version, "0.5.2")
    argv = (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)] if legacy
            else ["vllm", "serve", str(model)]) if model else (["vllm", "serve"] if not legacy else
                                                              ["python", "-m", "vllm.entrypoints.openai.api_server"])
    for key, value in args.items():
        if key in meta or key == "model" or value is None:
            continue
        if namespace and _is_default(key, value):
            continue
        flag = "--" + key.replace("_", "-")
        if not F.is_known(flag, version):
            notes.append(f"{flag} is not a known option of vLLM {version or HEAD}; kept as logged")
        if value is True:
            argv.append(flag)
        elif value is False:
            neg = F.negation(flag, version)
            if neg:
                argv.append(neg)
            else:
                notes.append(f"{key}=False has no command-line spelling; left out")
        elif isinstance(value, (list, tuple)) and F.is_multi_value(flag):
            argv += [flag, *map(str, value)]
        elif isinstance(value, (dict, list, tuple)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv, notes


def argv_to_text(argv: list[str]) -> str:
    return " ".join(quote_shell(a) for a in argv)
