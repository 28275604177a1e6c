"""What vLLM's `serve` parser accepts, per release: aliases, switches, types, choices, renames.

Data lives in vllm_doctor/data/flags/ (see its README). Every function takes an optional vLLM
version; None means the newest release the data knows (HEAD).
"""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache

from .versions import HEAD, at_least, in_range, parse_version

__all__ = ["canonical", "resolve", "is_known", "suggest", "silently_abbreviates", "replacement",
           "choices", "normalize_choice", "takes_value", "is_multi_value", "negation", "option_strings",
           "known_flags", "env_var_for"]


DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "flags")


@lru_cache(maxsize=None)
def _data(name: str) -> dict:
    # read beside the package: importlib.resources would cost ~10 ms of imports at start-up
    with open(os.path.join(DATA_DIR, name), encoding="utf-8") as f:
        return json.loads(f.read())


def _ranges() -> dict[str, str]:
    return _data("versions.json")["flags"]


def _k() -> dict:
    return _data("knowledge.json")


def _norm_spelling(flag: str) -> str:
    """Drop '=value' and turn --max_model_len into --max-model-len (FlexibleArgumentParser, 0.5.1+)."""
    flag = flag.split("=", 1)[0].strip()
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    return flag


# The per-flag questions below are pure functions of their strings and are asked once per token of a
# command, many times over (every Command.get() walks the arguments): memoized, a command of 10^5 tokens
# costs its tokens once, not once per question. Bounded, so a hostile command cannot grow them without end.
_MEMO = 1 << 16


@lru_cache(maxsize=_MEMO)
def canonical(flag: str) -> str:
    """'-tp' -> '--tensor-parallel-size', '--max_model_len=8' -> '--max-model-len', '-O3' -> '--optimization-level'.

    Unknown flags come back with dashes normalised; abbreviations are NOT expanded (see resolve()).
    """
    flag = _norm_spelling(flag)
    if re.fullmatch(r"-O\d*", flag):
        return "--optimization-level"
    return _k()["aliases"].get(flag, flag)


def option_strings(flag: str) -> list[str]:
    """All spellings of one option, long form first: '--tensor-parallel-size' -> [..., '-tp']."""
    c = canonical(flag)
    return [c] + sorted(a for a, t in _k()["aliases"].items() if t == c)


def _negation_base(flag: str) -> str | None:
    """The flag a generated negation belongs to (--no-X -> --X, --disable-X <-> --enable-X)."""
    r = _ranges()
    if flag.startswith("--no-") and "--" + flag[5:] in r:
        return "--" + flag[5:]
    for a, b in (("--disable-", "--enable-"), ("--enable-", "--disable-")):
        if flag.startswith(a) and b + flag[len(a):] in r:
            return b + flag[len(a):]
    return None


def _range(flag: str) -> str | None:
    rng = _ranges().get(flag)
    if rng is None:
        return None
    base = _negation_base(flag)
    if rng.startswith(">0.10.2") and base and not _ranges()[base].startswith(">0.10.2"):
        # the 0.10.2 list left out generated negations; they existed somewhere after 0.6.6
        rng = ">0.6.6.." + rng.partition("..")[2]
    return rng


@lru_cache(maxsize=64)
def known_flags(version: str | None = None) -> frozenset[str]:
    """Every option string the parser of that release had (uncertain ranges count as present)."""
    return frozenset(f for f in _ranges() if in_range(version, _range(f)))


def _spelled(flag: str, version: str | None) -> str:
    """The flag as that release's parser sees it (underscores rewritten only from 0.5.1)."""
    raw = flag.split("=", 1)[0].strip()
    if raw.startswith("--") and "_" in raw and not at_least(version, "0.5.1"):
        return raw
    return _norm_spelling(raw)


@lru_cache(maxsize=_MEMO)
def resolve(flag: str, version: str | None = None) -> str | None:
    """The option argparse would pick for this token at that release: exact, alias or unique prefix."""
    known = known_flags(version)
    f = _spelled(flag, version)
    if f in known:
        return canonical(f) if canonical(f) in known else f
    if re.fullmatch(r"-O\d*", f) and at_least(version, "0.6.5"):
        return canonical(f)
    if f.startswith("--") and "." in f and at_least(version, "0.11.0"):   # --compilation-config.mode 3
        base = f.split(".", 1)[0]
        return base if base in known else None
    full = silently_abbreviates(f, version)
    return canonical(full) if full and canonical(full) in known else full


def is_known(flag: str, version: str | None = None) -> bool:
    """Would vLLM's parser at that release recognise this option string (prefix abbreviations included)?"""
    return resolve(flag, version) is not None


@lru_cache(maxsize=64)
def _sorted_long_flags(version: str | None) -> tuple[str, ...]:
    return tuple(sorted(f for f in known_flags(version) if f.startswith("--")))


def _prefix_matches(flag: str, version: str | None) -> list[str]:
    """The known long options `flag` is a prefix of, sorted (a binary search, not a scan of them all)."""
    if not flag.startswith("--") or len(flag) < 3:
        return []
    from bisect import bisect_left

    longs = _sorted_long_flags(version)
    out = []
    for f in longs[bisect_left(longs, flag):]:
        if not f.startswith(flag):
            break
        out.append(f)
    return out


def silently_abbreviates(flag: str, version: str | None = None) -> str | None:
    """The longer option argparse silently took this unknown flag for (allow_abbrev), else None.

    '--max-seq-len' on 0.4.3..0.10.2 -> '--max-seq-len-to-capture'.
    """
    f = _spelled(flag, version)
    if f in known_flags(version):
        return None
    m = _prefix_matches(f, version)
    return m[0] if len(m) == 1 else None


def ambiguous_matches(flag: str, version: str | None = None) -> list[str]:
    """Options an ambiguous abbreviation could mean (argparse refuses it), [] if not ambiguous."""
    f = _spelled(flag, version)
    m = [] if f in known_flags(version) else _prefix_matches(f, version)
    return m if len(m) > 1 else []


def suggest(flag: str, version: str | None = None) -> list[str]:
    """Did-you-mean candidates for an unknown flag, best first (curated map, then close spellings)."""
    f = _norm_spelling(flag)
    known = known_flags(version)
    out: list[str] = []
    cur = _k()["did_you_mean"].get(f)
    if cur and cur in known:
        out.append(cur)
    new, _ = replacement(f, version)
    if new and new in known:
        out.append(new)
    longs = sorted(x for x in known if x.startswith("--") and not x.startswith("--no-"))
    import difflib

    out += difflib.get_close_matches(f, longs, n=3, cutoff=0.75)
    # '--gpu-memory-util' is a prefix of the real flag; so is any other truncated spelling
    out += [m for m in _prefix_matches(f, version) if not m.startswith("--no-")][:3]
    seen: list[str] = []
    for s in out:
        s = canonical(s) if canonical(s) in known else s
        if s != f and s not in seen:
            seen.append(s)
    return seen[:4]


def replacement(flag: str, version: str | None = None) -> tuple[str | None, str]:
    """(new flag or None, note) for a removed or renamed flag; (None, '') when nothing is known."""
    f = canonical(flag)
    rep = _k()["replacements"].get(f)
    if rep:
        new, value, note = rep
        return new, note
    rng = _range(f)
    if rng and not in_range(version, rng):
        lo, _, hi = rng.partition("..")
        if hi != "HEAD" and parse_version(version or HEAD) > parse_version(hi.lstrip(">")):
            return None, f"removed after {hi.lstrip('>')} (no replacement recorded)"
        return None, f"not yet present in {version}; first seen {lo.lstrip('>') or 'early releases'}"
    return None, ""


def replacement_value(flag: str) -> str | None:
    """The fixed value the replacement flag takes ('--worker-use-ray' -> 'ray'), if any."""
    rep = _k()["replacements"].get(canonical(flag))
    return rep[1] if rep else None


def choices(flag: str, version: str | None = None) -> list[str] | None:
    """The parser's choices list for this flag at that release, None if free-form or unknown."""
    for rng, vals in _k()["choices"].get(canonical(flag), []):
        if in_range(version, rng):
            return list(vals)
    return None


def normalize_choice(flag: str, value: str) -> str | None:
    """The accepted spelling of a value ('torch.float16' -> 'float16'), None if no safe mapping."""
    c = canonical(flag)
    v = str(value).strip().strip("'\"")
    valid = choices(c) or _k()["known_values"].get(c) or []
    aliases = _k()["value_aliases"].get(c, {})
    low = v.lower()
    if c == "--dtype" and low in aliases:   # 'half'/'float' are valid but mean float16/float32
        return aliases[low]
    if v in valid:
        return v
    if low in aliases:
        return aliases[low]
    for cand in valid:
        if cand.lower() == low or cand.lower().replace("_", "-") == low.replace("_", "-"):
            return cand
    return None


def _switches() -> frozenset[str]:
    r = _ranges()
    out = set(_k()["switches"])
    for f in r:
        base = _negation_base(f)
        if base:
            out.update((f, base))
    for short, long_ in _k()["aliases"].items():
        if long_ in out:
            out.add(short)
    return frozenset(out)


_SWITCHES: frozenset[str] | None = None


@lru_cache(maxsize=_MEMO)
def takes_value(flag: str) -> bool:
    """False for boolean switches (--enforce-eager, --no-trust-remote-code, -ep); True otherwise.

    Unknown flags answer True; callers splitting argv should also look at the next token.
    """
    global _SWITCHES
    if _SWITCHES is None:
        _SWITCHES = _switches()
    f = _norm_spelling(flag)
    return not (f in _SWITCHES or canonical(f) in _SWITCHES)


@lru_cache(maxsize=_MEMO)
def is_multi_value(flag: str) -> bool:
    """nargs='+' options that swallow every following non-option token."""
    return canonical(flag) in _k()["multi_value"]


@lru_cache(maxsize=_MEMO)
def negation(flag: str, version: str | None = None) -> str | None:
    """The switch that turns this boolean off: --no-X, or the --enable-/--disable- partner."""
    c = canonical(flag)
    known = known_flags(version)
    if "--no-" + c[2:] in known:
        return "--no-" + c[2:]
    for a, b in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
        if c.startswith(a) and b + c[len(a):] in known:
            return b + c[len(a):]
    return None


def value_type(flag: str) -> str | None:
    """'int', 'float', 'human_int' or None (string/other) for type checking."""
    c = canonical(flag)
    k = _k()
    if c in k["human_int"]:
        return "human_int"
    if c in k["int"]:
        return "int"
    if c in k["float"]:
        return "float"
    return None


def human_int_since(flag: str) -> str | None:
    return _k()["human_int"].get(canonical(flag))


__all__ += ["ambiguous_matches", "replacement_value", "value_type"]


def env_var_for(flag: str, version: str | None = None) -> str | None:
    """The vLLM environment variable a flag that is none names (`--cpu-kvcache-space` -> VLLM_CPU_KVCACHE_SPACE),
    when vllm/envs.py of that release registers it (data/flags/env_vars.json); None otherwise."""
    name = "VLLM_" + _norm_spelling(flag).lstrip("-").replace("-", "_").upper()
    if name.startswith("VLLM_VLLM_"):           # `--vllm-host-ip`: the variable's own name as a flag
        name = name[len("VLLM_"):]
    span = _data("env_vars.json")["variables"].get(name)
    return name if span is not None and (version is None or in_range(version, span)) else None


def env_var_since(name: str) -> str | None:
    """The first vLLM release whose vllm/envs.py registers `name` (data/flags/env_vars.json), else None."""
    span = _data("env_vars.json")["variables"].get(name)
    return span.split("..", 1)[0] if span else None


__all__ += ["env_var_since"]


def first_release(flag: str) -> str | None:
    """The first release whose parser has this option (the data's lower bound), None when unknown or early."""
    rng = _range(canonical(flag))
    lo = (rng or "").partition("..")[0].lstrip(">")
    return lo or None


__all__ += ["first_release"]


def newest_release_with(flags) -> str | None:
    """The newest release whose parser had every one of these options: the lowest last release of their ranges,
    None when all of them still exist. Only the upper ends count: the data's lower ends are `vllm serve`'s (0.4.0+),
    and the api_server module had many of those options before."""
    his = [hi.lstrip(">") for flag in flags for hi in [(_range(canonical(flag)) or "").partition("..")[2]]
           if hi and hi != "HEAD"]
    return min(his, key=parse_version) if his else None


__all__ += ["newest_release_with"]

