"""A number someone else wrote (a job's records, a client's JSON), as a finite float.

Pure and standard library only: the client's hot path imports it (``client.format``), as
do the daemon's readers of what jobs write (``ddpq.jobdir``).
"""

from __future__ import annotations

import math


def finite_float(value: object) -> float | None:
    """``value`` as a finite float; None for anything else: NaN, infinities, ``true``, or
    an integer too big for a float (JSON's have no bound, and ``float`` raises on one of
    400 digits: that must break neither a listing nor the worker)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# The moments a datetime holds in every time zone: years 1 to 9999, a day in from each end.
# A time outside them cannot be shown (``datetime.fromtimestamp`` raises), so it is refused
# where it comes in, and shown at the nearest end where it is already stored.
FIRST_MOMENT = -62135510400.0  # 0001-01-02T00:00Z
LAST_MOMENT = 253402128000.0  # 9999-12-30T00:00Z


def showable(moment: float) -> float:
    """``moment`` (UNIX seconds) brought within FIRST_MOMENT..LAST_MOMENT."""
    return min(max(moment, FIRST_MOMENT), LAST_MOMENT)
