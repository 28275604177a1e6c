"""Numbers from logs, flags, commands, config.json and snapshots: `"1,234"`, `"0.9"`, `4096`, `None`, `True`
→ int/float or None.

The one parser of every number the doctor reads from outside text, so that what is not a number is None
(the field stays unknown), never an exception:

* a bool is never a number (a switch is not a size);
* NaN and ±infinity are not numbers (no count, size, length or time is one);
* a digit string longer than MAX_DIGITS is not a number: no count or byte size a log, config or snapshot
  holds has that many digits, and int() of one past 4300 digits raises (sys.get_int_max_str_digits);
  nor is any magnitude of 10**MAX_DIGITS or more (`1e300` MiB), so that products of a few numbers never
  overflow a float to infinity.

Also here: json_loads / json_safe (config.json and snapshots in, strict JSON out) and the argparse types of
the numeric options (`seconds`, `finite_float`), which give argparse's usage error (exit 2) instead of
accepting `nan`, `inf` or a negative time. (Counts such as `plan --gpus` are range-checked by their command,
whose error is one line.)
"""
from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

# 10**18 bytes is an exabyte, and 2**63 has 19 digits: a longer integer is no real count, size or id.
MAX_DIGITS = 18
INT_LIMIT = 10 ** MAX_DIGITS
# a float as logs and configs spell one (`0.9`, `23.65`, `1e-05`); longer text is not a measurement
MAX_FLOAT_CHARS = 64
MAX_SECONDS = 1e8             # ~3 years: any longer wait is a typo (and overflows some timeouts)

_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:(?P<whole>[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _clean(text: str) -> str:
    return text.strip().replace(",", "").replace("_", "")


def parse_int(text: Any, *, max_digits: int = MAX_DIGITS) -> int | None:
    """`"4096"`, `" 1,024 "`, `"-3"` → int; anything else (a float text, words, more than `max_digits`
    digits) → None."""
    if type(text) is str and len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)            # the usual case (a pid, a rank, a capture), as fast as int()
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("ascii", errors="replace")
    if not isinstance(text, str):
        return None
    # the length test comes first: a long digit string is never even cleaned, let alone converted
    if len(text) > 4 * max_digits + 8:
        return None
    s = _clean(text)
    if not _INT_TEXT.fullmatch(s) or len(s.lstrip("+-")) > max_digits:
        return None
    return int(s)


def parse_float(text: Any) -> float | None:
    """`"0.9"`, `"1,234.5"`, `"1e-05"` → a float; `nan`, `inf`, `1e999` (any magnitude from 10**MAX_DIGITS),
    words → None."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("ascii", errors="replace")
    if not isinstance(text, str) or len(text) > 2 * MAX_FLOAT_CHARS:
        return None
    s = _clean(text)
    m = _FLOAT_TEXT.fullmatch(s) if len(s) <= MAX_FLOAT_CHARS else None
    # a digit run longer than an int may have is no number written as a float either
    if m is None or len(m["whole"] or "") > MAX_DIGITS:
        return None
    value = float(s)
    return value if -INT_LIMIT < value < INT_LIMIT else None     # NaN and ±inf fail the test too


def as_float(value: Any) -> float | None:
    """A number of any kind (int, float, numeric text) as a float of magnitude < 10**MAX_DIGITS; None for
    anything else."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if -INT_LIMIT < value < INT_LIMIT else None   # NaN fails the test too
    if not isinstance(value, (str, bytes, bytearray)):
        value = str(value)
    return parse_float(value)


def as_int(value: Any) -> int | None:
    """A number of any kind as an int (a float is truncated); None for NaN, ±inf, text that is no number,
    and magnitudes of more than MAX_DIGITS digits."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -INT_LIMIT < value < INT_LIMIT else None
    if isinstance(value, (str, bytes, bytearray)):
        number = parse_int(value)
        if number is not None:
            return number
    number = as_float(value)
    return None if number is None else int(number)


def as_typed(captures: dict[str, str]) -> dict[str, Any]:
    """Regex captures as the numbers they spell ("1,024" -> 1024, "0.9" -> 0.9); other text stays text
    (so does a digit string too long to be a number, and `nan`/`inf`)."""
    out: dict[str, Any] = {}
    for key, value in captures.items():
        number: Any = parse_int(value)
        if number is None:
            number = parse_float(value)
        out[key] = value if number is None else number
    return out


# --------------------------------------------------------------------------- JSON in and out

def _json_constant(name: str) -> None:
    return None                 # NaN, Infinity, -Infinity: not numbers


def json_loads(text: str | bytes) -> Any:
    """json.loads for a file from outside (config.json, a snapshot, a safetensors header): NaN/Infinity,
    floats that overflow and integers of more than MAX_DIGITS digits read as null. Raises ValueError for
    text that is no JSON, nesting too deep included."""
    try:
        return json.loads(text, parse_constant=_json_constant, parse_int=parse_int, parse_float=parse_float)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float (anywhere in dicts, lists, tuples) replaced by None, ready for
    json.dumps(..., allow_nan=False): a report or snapshot is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- argparse types

def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 to MAX_SECONDS (`nan`, `inf`, `-1` are refused)."""
    value = parse_float(text)
    if value is None or not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds (0 to {MAX_SECONDS:g})")
    return value


def finite_float(text: str) -> float:
    """An argparse type: any number as_float reads (`nan`, `inf`, `1e308` are refused)."""
    value = parse_float(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number below {INT_LIMIT:.0e}")
    return value


def stamp_seconds(stamp: str | None) -> float | None:
    """A log header's second ("MM-DD hh:mm:ss", sources/lines.Line.stamp) as seconds into its year, for the time
    between two lines of one log (the year is not in the header: a log across New Year reads wrong); None when
    it is no such stamp."""
    from datetime import datetime

    try:
        moment = datetime.strptime(f"2001-{stamp}", "%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return None
    return (moment - datetime(2001, 1, 1)).total_seconds()
