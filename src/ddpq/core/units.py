"""Durations and sizes as people write them ("1h30m", "64M"), and back. Standard library only:
the CLI, the daemon's settings and the server all read them."""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# ASCII digits only: float() and \d would also take "nan", "inf", "1e400", "1_000" and
# other scripts' digits, none of which anyone means as a duration or a size.
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PLAIN = re.compile(_NUMBER)
_DURATION = re.compile(rf"({_NUMBER})([smhd])")
_EXAMPLES = "examples: 90s, 30m, 2h, 1h30m, 1d"


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """'90', '90s', '30m', '2h', '1h30m', '1d' -> seconds: finite and more than 0 (or 0
    itself, with ``allow_zero``: a grace period may be none at all).

    Raises ``ValueError`` with a message for people (empty, malformed, negative, zero, or
    too large to be a number of seconds at all).
    """
    least = "0 or more" if allow_zero else "more than 0"
    cleaned = text.strip().lower()
    if not cleaned:
        raise ValueError(f"a duration cannot be empty ({_EXAMPLES})")
    if _PLAIN.fullmatch(cleaned):
        seconds = float(cleaned)
    else:
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(cleaned):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(cleaned):
            if cleaned.startswith("-"):
                raise ValueError(f"{text!r}: a duration must be {least}")
            raise ValueError(f"{text!r} is not a duration ({_EXAMPLES})")
    if not math.isfinite(seconds):  # hundreds of digits overflow to inf
        raise ValueError(f"{text!r} is too long a duration")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"{text!r}: a duration must be {least}")
    return seconds


def human_duration(seconds: float) -> str:
    if not math.isfinite(seconds):  # a job's own ETA may be anything; round() would raise
        return "?"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, s = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d{h:02d}h"


# Binary units, as `ls -h`, Docker and systemd read "64M": K is 1024 bytes.
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# A number, then optionally a unit with an optional "B"/"iB" ("64M", "64MB", "64MiB"), or
# a bare "B" ("4096B"). A fraction only with a unit: "1.5G", not "1.5" bytes.
_SIZE = re.compile(r"(?:([0-9]+)|([0-9]*\.[0-9]+|[0-9]+\.)(?=[kmgt]))(?:([kmgt])(?:i?b)?|b)?")
_SIZE_EXAMPLES = "examples: 65536, 512K, 64M, 1G"
# A byte count any program may hold in a signed 64-bit number.
_MAX_SIZE = (1 << 63) - 1


def parse_size(text: str) -> int:
    """'65536', '4096B', '512K', '64M', '64MiB', '1.5G' -> bytes (0 or more, K = 1024).

    Raises ``ValueError`` with a message for people.
    """
    cleaned = text.strip().lower()
    m = _SIZE.fullmatch(cleaned)
    if not cleaned or m is None:
        if cleaned.startswith("-"):
            raise ValueError(f"{text!r}: a size must not be negative")
        raise ValueError(f"{text!r} is not a size ({_SIZE_EXAMPLES})")
    whole, fraction, unit = m.groups()
    scale = _SIZE_UNITS[unit or ""]
    # Decimal: exact, and no float overflow on a fraction of hundreds of digits.
    if whole is not None:
        size = int(whole) * scale
    else:
        from decimal import Decimal  # only for a fraction: ~2 ms to import

        size = int(Decimal(fraction) * scale)
    if size > _MAX_SIZE:
        raise ValueError(f"{text!r} is too large a size")
    return size


def human_size(size: int) -> str:
    """Bytes in the largest unit that divides them exactly: 67108864 -> '64M', 1000 -> '1000'."""
    for unit in "TGMK":
        scale = _SIZE_UNITS[unit.lower()]
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def size_for_people(size: int) -> str:
    """GPU memory as people read it: exact where it is ("5G", "512M"), else to a tenth of a
    GiB ("4.1G") or whole MiB ("300M")."""
    if size >= 1 << 30 and size % (1 << 30) == 0:
        return f"{size >> 30}G"
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f}G"
    if size >= 1 << 20:
        return f"{round(size / (1 << 20))}M"
    return human_size(size)


_WHEN_EXAMPLES = "examples: now, +2h, 2026-12-03 09:00, 2026-12-03T09:00+01:00"


def parse_when(text: str, now: float, *, after: float | None = None) -> float:
    """A moment as people write it -> UNIX time: "now", "+DURATION" (after ``after``, or
    ``now``), or an ISO 8601 date and time (local time unless it names its offset).

    Raises ``ValueError`` with a message for people.
    """
    from datetime import datetime

    cleaned = text.strip()
    if not cleaned:
        raise ValueError(f"a time cannot be empty ({_WHEN_EXAMPLES})")
    if cleaned.lower() == "now":
        return now
    if cleaned.startswith("+"):
        return (now if after is None else after) + parse_duration(cleaned[1:])
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise ValueError(f"{text!r} is not a time ({_WHEN_EXAMPLES})") from None
    # A naive time is the local one, as `date` prints it.
    return moment.timestamp() if moment.tzinfo else moment.astimezone().timestamp()
