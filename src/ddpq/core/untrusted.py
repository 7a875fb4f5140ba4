"""What a job writes into its folder, made safe to store and to serve back (pure).

A job owns its folder and may write anything there: a progress line nested 5,000
levels deep (``json.loads`` then raises ``RecursionError``, not ``ValueError``), a
string holding a lone surrogate (SQLite stores it, but no UTF-8 response can carry
it), ``NaN`` (not JSON), megabytes in one line. Everything read from there passes
through here first: bounded, flattened, encodable.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_LINE = 8 * 1024  # a progress record longer than this is not read at all
MAX_DEPTH = 8  # nesting beyond this is refused before parsing
MAX_KEYS = 64
MAX_KEY_CHARS = 64
MAX_TEXT_CHARS = 256

Scalar = str | int | float | bool | None


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str, limit: int | None = MAX_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters (None: uncut), with what UTF-8 cannot encode
    (lone surrogates) replaced by U+FFFD, so it can be stored and served back to anyone."""
    if limit is not None:
        text = text[:limit]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
    return text


def nesting_depth(text: str) -> int:
    """How deeply ``[`` and ``{`` nest in JSON text (brackets inside strings don't count).

    A linear scan, so a hostile line costs its length, never the parser's recursion.
    """
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _scalar(value: Any) -> Scalar:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        # Beyond 64 bits neither SQLite nor a JavaScript page keeps it exact.
        if -(2**63) <= value < 2**63:
            return value
        return float(value) if abs(value) < 2**1023 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return clean_text(value)
    raise TypeError


def clean_record(value: Any) -> dict[str, Scalar] | None:
    """A flat record of at most ``MAX_KEYS`` scalar fields, or None if ``value`` is no object.

    Nested values are dropped (progress is a line of numbers and short words), strings
    are cut and made encodable, non-finite numbers become null.
    """
    if not isinstance(value, dict):
        return None
    out: dict[str, Scalar] = {}
    for key, item in value.items():
        if len(out) >= MAX_KEYS:
            break
        try:
            out[clean_text(str(key), MAX_KEY_CHARS)] = _scalar(item)
        except TypeError:
            continue  # a list or an object: not part of a progress line
    return out


def parse_progress(line: str) -> dict[str, Scalar] | None:
    """One line of ``metrics.jsonl`` as a clean record; None if it is not one."""
    line = line.strip()
    if not line or len(line) > MAX_LINE or nesting_depth(line) > MAX_DEPTH:
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None  # malformed, or a line being written right now
    return clean_record(value)
