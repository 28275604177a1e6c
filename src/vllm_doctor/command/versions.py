"""vLLM version strings as comparable tuples, and the "LO..HI" ranges used by the flag data."""
from __future__ import annotations

import re
from functools import lru_cache

HEAD = "0.34.0"   # newest release the flag data describes; later versions are treated as HEAD


def parse_version(s: str | None) -> tuple | None:
    """'0.10.2' -> (0, 10, 2, 0); '0.4.0.post1' -> (0, 4, 0, 1); '0.11.1rc2'/'0.11.1.dev5+g1' -> (0, 11, 1, -1).

    The fourth field orders pre-releases before, and post-releases after, the release itself.
    """
    return None if s is None else _parse(str(s))


@lru_cache(maxsize=1024)
def _parse(s: str) -> tuple | None:
    """Cached: one known_flags() asks for ~2,000 parses of a few hundred distinct strings."""
    s = s.strip().lstrip("vV")
    if s.upper() == "HEAD":
        return _parse(HEAD)
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", s)
    if not m:
        return None
    rest = m.group(4)
    post = re.match(r"\.?post(\d+)", rest)
    extra = int(post.group(1)) if post else (-1 if re.match(r"\.?(rc|dev|a|b)", rest) else 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), extra)


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 like cmp(a, b)."""
    ta, tb = parse_version(a), parse_version(b)
    return (ta > tb) - (ta < tb)


def at_least(version: str | None, floor: str) -> bool:
    """True when version >= floor; an unknown version counts as HEAD (newest behaviour)."""
    tv = parse_version(version) or parse_version(HEAD)
    return tv >= parse_version(floor)


def in_range(version: str | None, rng: str) -> bool:
    """Whether version lies in 'LO..HI' ('' = no lower bound, '>X' = after X, HI may be HEAD).

    None means HEAD. Versions newer than HEAD are judged as HEAD.
    """
    tv = parse_version(version) or parse_version(HEAD)
    tv = min(tv, parse_version(HEAD)) if tv[:3] > parse_version(HEAD)[:3] else tv
    lo, _, hi = rng.partition("..")
    if lo.startswith(">"):
        if tv[:3] <= parse_version(lo[1:])[:3]:
            return False
    elif lo and tv[:3] < parse_version(lo)[:3]:
        return False
    if not hi or hi == "HEAD" or hi.startswith(">"):
        return True
    th = parse_version(hi)
    # patch releases after 0.11.2 were not sampled: a flag last seen in 0.17.0 is assumed in 0.17.x
    same_minor = tv[:2] == th[:2] and th[:3] > (0, 11, 2)
    return tv[:3] <= th[:3] or same_minor
