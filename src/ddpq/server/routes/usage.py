"""GPU time used, jobs ended and waits, per user, day or month: ``GET /v1/usage``.

Every authenticated user may read everyone's usage, as everyone may read the queue: it is
what fair share orders the queue by, so each user can see why their job waits.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from ddpq.core import usage as core
from ddpq.schemas import UsageReport, UsageRow
from ddpq.server import views
from ddpq.server.deps import Auth, DatabaseDep, SettingsDep
from ddpq.server.errors import ApiError
from ddpq.store import usage as usage_store

router = APIRouter(prefix="/v1/usage", tags=["usage"])

Since = Annotated[
    str,
    Query(
        max_length=32,
        description="how far back: a duration (30d, 12h, 1d12h), at most 3650d",
    ),
]
By = Annotated[core.By, Query(description="group by user, or by UTC day or month")]


@router.get("", response_model=UsageReport)
def usage(
    _who: Auth,
    settings: SettingsDep,
    db: DatabaseDep,
    since: Since = core.DEFAULT_SINCE,
    by: By = core.By.USER,
) -> UsageReport:
    """GPU-hours of jobs and of outside use, jobs ended by final state, waits p50/p90."""
    try:
        window = core.parse_since(since)
    except ValueError as exc:
        raise ApiError(422, "invalid", f"since: {exc}") from None
    now = time.time()
    with db.read() as s:
        r = usage_store.report(s, now - window, now, by, names_are_users=not settings.auth)
    return UsageReport(
        since=views.ts_req(r.since),
        until=views.ts_req(r.until),
        by=r.by.value,
        # What fair share does with it: under Slurm there is no outside use to count.
        outside_use="count" if settings.counts_outside_use else "show",
        rows=[_row(row) for row in r.rows],
        total=_row(r.total),
    )


def _row(row: core.Row) -> UsageRow:
    return UsageRow(
        key=views.servable(row.key),
        kind=row.kind,  # type: ignore[arg-type]
        gpu_hours_jobs=row.gpu_hours_jobs,
        gpu_hours_outside=row.gpu_hours_outside,
        jobs=row.jobs,
        jobs_started=row.jobs_started,
        wait_p50_s=row.wait_p50_s,
        wait_p90_s=row.wait_p90_s,
        mem_reserved_gib_h=row.mem_reserved_gib_h,
        mem_used_gib_h=row.mem_used_gib_h,
        mem_used_peak_gib=row.mem_used_peak_gib,
        core_hours=row.core_hours,
    )
