"""What `ddpq history` and ``Client.history`` share: a bound as people write it, the query
``GET /v1/history`` takes, and its pages walked for the newest N rows. No Typer here: the
command line turns a ``ValueError`` into bad usage (exit 2), the Python client raises it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ddpq.client.api import JsonApi
from ddpq.client.format import sanitize
from ddpq.core.states import TERMINAL

PAGE = 1000  # the most the daemon gives in one page
FINISHED = sorted(s.value for s in TERMINAL)
Bound = str | float | datetime


def moment(option: str, value: Bound, now: float) -> float:
    """A bound as UNIX time: a datetime (naive: local), UNIX seconds, a duration back from
    now (2d, 12h30m), or a date and time (2026-12-01, '2026-12-01 09:00', local unless it
    names its offset). ``ValueError`` names ``option``."""
    from ddpq.core.units import parse_duration, parse_when

    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{option}: {value!r} is not a time")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{option}: {type(value).__name__} is not a time")
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        return parse_when(value, now)
    except (ValueError, OverflowError, OSError):
        raise ValueError(
            f"{option}: {sanitize(repr(value))} is neither a duration (2d, 12h) nor a date"
        ) from None


def finished_states(given: Sequence[str], option: str = "--state") -> list[str]:
    """States as given (each may be comma-separated); one that is no finished state is a
    ``ValueError``."""
    wanted = [p.strip().lower() for item in given for p in item.split(",") if p.strip()]
    for item in wanted:
        if item not in FINISHED:
            raise ValueError(
                f"{option}: {sanitize(item)!r} is not a finished state ({', '.join(FINISHED)})"
            )
    return wanted


def query(
    since: Bound | None,
    until: Bound | None,
    user: str | None,
    everyone: bool,
    states: list[str],
    name: str | None,
    now: float,
    options: tuple[str, str] = ("--since", "--until"),
) -> dict[str, Any]:
    """``GET /v1/history``'s parameters: the caller's own jobs unless ``user`` or
    ``everyone``. ``ValueError`` for a bound that is no time, or a window that is empty."""
    start = None if since is None else moment(options[0], since, now)
    end = None if until is None else moment(options[1], until, now)
    if start is not None and end is not None and start >= end:
        raise ValueError(f"{options[0]}: not before {options[1]}")
    if user is not None and everyone:
        raise ValueError("a user and everyone: choose one")

    def iso(t: float | None) -> str | None:
        return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()

    return {
        "since": iso(start),
        "until": iso(end),
        "user": user,
        "mine": None if user is not None or everyone else "true",
        "state": states or None,
        "name": name,
    }


def newest(api: JsonApi, params: dict[str, Any], limit: int) -> tuple[list[Any], bool]:
    """The newest ``limit`` rows (0: every one), newest first, a page at a time, and
    whether older ones are left."""
    rows: list[Any] = []
    after: str | None = None
    while True:
        want = PAGE if limit == 0 else min(PAGE, limit - len(rows))
        page = api.history({**params, "limit": want, "after": after})
        rows += page["items"]
        after = page["next"]
        if after is None or not page["items"]:
            return rows, False
        if limit and len(rows) >= limit:
            return rows[:limit], True  # never more than asked, whatever answered
