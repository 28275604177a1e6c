"""Numbers from logs, flags and facts: `"1,234"`, `"0.9"`, `4096`, `None`, `True` → int/float or None.

One place for the coercion every remedy needs; a bool is never a number here (a switch is not a size).
"""
from __future__ import annotations

from typing import Any


def as_float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).replace(",", "").strip())
    except ValueError:
        return None


def as_int(value: Any) -> int | None:
    number = as_float(value)
    return None if number is None or number != number else int(number)


def as_typed(captures: dict[str, str]) -> dict[str, Any]:
    """Regex captures as the numbers they spell ("1,024" -> 1024, "0.9" -> 0.9); other text stays text."""
    out: dict[str, Any] = {}
    for key, value in captures.items():
        text = value.replace(",", "")
        try:
            out[key] = int(text)
        except ValueError:
            try:
                out[key] = float(text)
            except ValueError:
                out[key] = value
    return out
