"""An argparse stand-in: would `vllm serve` of a given release accept this argv?

Used as the oracle that corrected commands parse. It mirrors the checks argparse makes before vLLM
code runs: unknown/ambiguous options, missing values, switches given a value, int/float types,
choices, and extra positionals. Messages follow the real formats (vllm-flags-history.md).
"""
from __future__ import annotations

import re

from . import flags as F
from .versions import at_least

_NUM = re.compile(r"-\d+(\.\d+)?$|-\.\d+$")
_HUMAN = re.compile(r"(\d+(\.\d+)?)([kKmMgGtT])?$")


def _is_option(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _NUM.match(tok) and " " not in tok


def _type_error(flag: str, value: str, version: str | None) -> str | None:
    t = F.value_type(flag)
    names = "/".join(F.option_strings(flag))
    if t == "human_int":
        since = F.human_int_since(flag)
        if at_least(version, since):
            if value in ("auto", "-1") and F.canonical(flag) == "--max-model-len":
                return None
            if _HUMAN.match(value):
                return None
            return f"argument {names}: Invalid value '{value}'"
        t = "int"
    if t == "int":
        try:
            int(value)
        except ValueError:
            return f"argument {names}: invalid int value: '{value}'"
    if t == "float":
        try:
            float(value)
        except ValueError:
            return f"argument {names}: invalid float value: '{value}'"
    return None


def accepts(argv: list[str], version: str | None = None) -> tuple[bool, str]:
    """(True, '') if the parser would take argv; else (False, the error line argparse prints).

    argv are the serve arguments (a leading 'vllm serve' or 'python -m ...api_server' is skipped).
    """
    argv = list(argv)
    legacy = not at_least(version, "0.5.2")   # no `vllm serve`: python -m ...api_server --model M
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]
    elif len(argv) >= 3 and argv[1] == "-m":
        argv = argv[3:]
    top = "api_server.py" if legacy else "vllm"
    sub = "api_server.py" if legacy else "vllm serve"
    extras: list[str] = []
    positionals = 0
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok == "--":
            extras += argv[i:]
            break
        if not _is_option(tok):
            positionals += 1
            if legacy or positionals > 1:
                extras.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        if re.fullmatch(r"-O\d+", name) and at_least(version, "0.6.5"):
            name, eq, inline = "-O", "=", name[2:]
        amb = F.ambiguous_matches(name, version)
        if amb:
            return False, f"{sub}: error: ambiguous option: {name} could match {', '.join(amb)}"
        flag = F.resolve(name, version)
        if flag is None:
            extras.append(tok)
            while i < len(argv) and not _is_option(argv[i]):   # its value(s) are echoed too
                extras.append(argv[i])
                i += 1
            continue
        names = "/".join(F.option_strings(flag))
        if not F.takes_value(flag):
            if eq:
                return False, f"{sub}: error: argument {names}: ignored explicit argument '{inline}'"
            continue
        if eq:
            values = [inline]
        else:
            values = []
            while i < len(argv) and not _is_option(argv[i]):
                values.append(argv[i])
                i += 1
                if not F.is_multi_value(flag):
                    break
            if not values:
                need = "at least one argument" if F.is_multi_value(flag) else "one argument"
                return False, f"{sub}: error: argument {names}: expected {need}"
        if "." in name and name.startswith("--"):
            continue   # dotted JSON sub-key: value checked by vLLM later
        for v in values:
            err = _type_error(flag, v, version)
            if err:
                return False, f"{sub}: error: {err}"
            ch = F.choices(flag, version)
            if ch is not None and v not in ch:
                shown = sorted(ch) if at_least(version, "0.10.0") else ch
                listed = ", ".join(f"'{c}'" for c in shown)
                return False, f"{sub}: error: argument {names}: invalid choice: '{v}' (choose from {listed})"
    if extras:
        return False, f"{top}: error: unrecognized arguments: {' '.join(extras)}"
    return True, ""
