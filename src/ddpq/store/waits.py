"""Started jobs that wait in a cluster's own queue (the Slurm executor): their reason while
they wait, and the moment they really start. Flush, never commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from sqlalchemy import Table, and_, bindparam, update
from sqlalchemy.orm import Session

from ddpq.core.states import JobState
from ddpq.store.models import Attempt, Job

_jobs = cast(Table, Job.__table__)
_attempts = cast(Table, Attempt.__table__)
RUNNING_REASON = "running"


def record_waits(
    session: Session, waiting: Mapping[int, str], began: Sequence[int], now: float
) -> None:
    """``waiting``: job -> why it still waits (its reason). ``began``: jobs that stopped
    waiting, whose start is now: a time limit counts from when the job really runs, not
    from when it was handed to the cluster. Only running jobs are touched (one that ended
    meanwhile keeps its own reason)."""
    conn = session.connection()
    live = and_(_jobs.c.id == bindparam("b_job"), _jobs.c.state == JobState.RUNNING)
    if waiting:
        rows = [{"b_job": i, "why": why} for i, why in waiting.items()]
        conn.execute(update(_jobs).where(live).values(reason=bindparam("why")), rows)
    if began:
        rows = [{"b_job": i} for i in began]
        conn.execute(update(_jobs).where(live).values(reason=RUNNING_REASON, started_at=now), rows)
        current = and_(
            _attempts.c.job_id == bindparam("b_job"),
            _attempts.c.number
            == _jobs.select()
            .with_only_columns(_jobs.c.attempt)
            .where(_jobs.c.id == bindparam("b_job"))
            .scalar_subquery(),
            _attempts.c.ended_at.is_(None),
        )
        conn.execute(update(_attempts).where(current).values(started_at=now), rows)
