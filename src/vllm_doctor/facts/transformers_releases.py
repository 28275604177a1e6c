"""Which transformers release first knows a model type, and which transformers each vLLM release accepts
(data/models/transformers_releases.json, built by tools/build_model_types.py from the releases' own
configuration_auto.py and vLLM's wheel metadata). Offline; a type or release outside the table is None."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from vllm_doctor.command.versions import parse_version

TABLE = Path(__file__).resolve().parent.parent / "data" / "models" / "transformers_releases.json"


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def first_release(model_type: str | None) -> str | None:
    """The first transformers release (of those read) whose AutoConfig maps `model_type`; None when none does."""
    return _table()["model_types"].get((model_type or "").strip().lower()) if model_type else None


def oldest_read() -> str:
    return _table()["oldest_read"]


def newest_read() -> str:
    return _table()["newest_read"]


def vllm_requires(vllm_version: str | None) -> tuple[str, str] | None:
    """(release, its transformers specifier) of the newest vLLM release read that is not newer than
    `vllm_version`; None for an unknown version or one older than every release read."""
    v = parse_version(vllm_version)
    if v is None:
        return None
    known = [(parse_version(r), r, spec) for r, spec in _table()["vllm_requires"].items()]
    older = [k for k in known if k[0] is not None and k[0][:3] <= v[:3]]
    if not older:
        return None
    _, release, spec = max(older)
    return release, spec


def allows(spec: str, version: str) -> bool | None:
    """Whether a requirement specifier (`<5,>=4.56.0`) admits `version`; None where it cannot be read."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:           # packaging comes with transformers; without it the pin is not judged
        return None
    try:
        return SpecifierSet(spec).contains(version, prereleases=False)
    except (InvalidSpecifier, InvalidVersion):
        return None


def allows_any_from(spec: str, version: str) -> bool | None:
    """Whether a pin admits some transformers release (of those read) at or after `version`: `<5` admits none
    from 5.1.0; `!=5.1.*,>=4.56` admits 5.5.1, which knows every type 5.1.0 knew."""
    floor = parse_version(version)
    later = [r for r in _table()["releases_read"] if floor is None or (parse_version(r) or ()) >= floor]
    answers = [allows(spec, r) for r in later]
    return None if None in answers else any(answers)


def first_vllm_allowing(version: str, after: str | None = None) -> str | None:
    """The first vLLM release (of those read, newer than `after`) whose pin admits a transformers release at or
    after `version`."""
    floor = parse_version(after) if after else None
    for release, spec in _table()["vllm_requires"].items():       # ordered oldest first
        r = parse_version(release)
        if r is not None and (floor is None or r[:3] > floor[:3]) and allows_any_from(spec, version):
            return release
    return None
