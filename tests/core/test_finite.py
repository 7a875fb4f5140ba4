"""Numbers and moments someone else wrote, made safe to use and to show (core.finite)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from ddpq.core.finite import FIRST_MOMENT, LAST_MOMENT, finite_float, showable
from ddpq.server.views import ts_req


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, True, "1", None, [1]])
def test_what_is_no_finite_number_is_none(value: object) -> None:
    assert finite_float(value) is None


@pytest.mark.parametrize(
    ("moment", "shown_as"),
    [
        (-1e300, FIRST_MOMENT),
        (FIRST_MOMENT - 1, FIRST_MOMENT),
        (0.0, 0.0),
        (1.8e9, 1.8e9),
        (LAST_MOMENT + 1, LAST_MOMENT),
        (1e300, LAST_MOMENT),
    ],
)
def test_any_stored_moment_can_be_shown_within_the_years_1_to_9999(
    moment: float, shown_as: float
) -> None:
    assert showable(moment) == shown_as
    shown = ts_req(moment)  # a reservation stored before its times were checked: no 500
    assert shown == datetime.fromtimestamp(shown_as, UTC)
    assert datetime.fromtimestamp(showable(moment)).year in range(1, 10000)  # local time too
