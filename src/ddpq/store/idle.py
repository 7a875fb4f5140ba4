"""Idle GPUs of running jobs: what the worker watches, what it writes, what the API shows.

The worker looks at the GPUs of every running job (``worker.idle``) and keeps, in the job's
row, since when they are idle and when an interactive session was warned; a session idle
through its limit and the grace is asked to stop (``stop_request = "idle"``), which the
worker's stop phase then sends like any other. Flush, never commit: the caller owns the
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from ddpq.core.interactive import Watched
from ddpq.core.rules import StopRequest
from ddpq.core.states import JobState
from ddpq.store import leases as lease_store
from ddpq.store import transitions
from ddpq.store.models import Job, Lease

_jobs = cast(Table, Job.__table__)


@dataclass(frozen=True)
class OnGpus:
    """A running job that holds GPUs, as the idle rule needs it."""

    watch: Watched
    gpus: tuple[int, ...]


def _gpus_of(session: Session, job_ids: list[int]) -> dict[int, list[int]]:
    if not job_ids:
        return {}
    rows = session.execute(
        select(Lease.job_id, Lease.resource).where(
            Lease.job_id.in_(job_ids), Lease.kind == lease_store.GPU, Lease.released_at.is_(None)
        )
    )
    gpus: dict[int, list[int]] = {}
    for job_id, gpu in rows:
        gpus.setdefault(job_id, []).append(gpu)
    return gpus


def on_gpus(session: Session) -> list[OnGpus]:
    """Running jobs with GPU leases and no stop on its way (one being stopped is left alone)."""
    rows = session.execute(
        select(Job.id, Job.interactive, Job.idle_s, Job.idle_since, Job.idle_warned_at).where(
            Job.state == JobState.RUNNING, Job.stop_request.is_(None)
        )
    ).all()
    gpus = _gpus_of(session, [row.id for row in rows])
    return [
        OnGpus(Watched(row.id, bool(row.interactive), *row[2:]), tuple(sorted(gpus[row.id])))
        for row in rows
        if gpus.get(row.id)
    ]


def record_idle(session: Session, changes: Mapping[int, tuple[float | None, float | None]]) -> None:
    """Since when each job's GPUs are idle and when it was warned (None: in use / not)."""
    if not changes:
        return
    session.connection().execute(
        update(_jobs)
        .where(_jobs.c.id == bindparam("job_id"), _jobs.c.state == JobState.RUNNING)
        .values(idle_since=bindparam("since"), idle_warned_at=bindparam("warned")),
        [{"job_id": i, "since": since, "warned": warned} for i, (since, warned) in changes.items()],
    )


def note(session: Session, job_id: int, reason: str, now: float) -> None:
    """A line in a running job's history that changes no state (warned, in use again)."""
    transitions.note(session, job_id, JobState.RUNNING, reason, now)


def request_idle_stop(session: Session, job_id: int, reason: str, now: float) -> bool:
    """Ask for a running session to be stopped as idle; False if it is not running or is
    being stopped already (a cancel came first)."""
    return request_stop(session, job_id, StopRequest.IDLE, reason, now, sessions_only=True)


def request_stop(
    session: Session,
    job_id: int,
    request: StopRequest,
    reason: str,
    now: float,
    *,
    sessions_only: bool = False,
) -> bool:
    """Ask for a running job's stop on the daemon's own account (idle, over its folder
    limit), which the worker's stop phase then sends like a cancel; False if it is not
    running or is being stopped already (a cancel came first)."""
    conditions = [
        _jobs.c.id == job_id,
        _jobs.c.state == JobState.RUNNING,
        _jobs.c.stop_request.is_(None),
    ]
    if sessions_only:
        conditions.append(_jobs.c.interactive.is_(True))
    result = session.connection().execute(
        update(_jobs).where(*conditions).values(stop_request=request.value, stop_reason=reason)
    )
    if result.rowcount != 1:
        return False
    note(session, job_id, f"{reason}; stopping it", now)
    return True


@dataclass(frozen=True)
class IdleJob:
    """A running job whose GPUs are unused now, for the views (``ddpq gpus``, /metrics)."""

    job_id: int
    interactive: bool
    idle_since: float
    gpus: int  # how many it holds


def idle_now(session: Session) -> dict[int, IdleJob]:
    rows = session.execute(
        select(Job.id, Job.interactive, Job.idle_since).where(
            Job.state == JobState.RUNNING, Job.idle_since.is_not(None)
        )
    ).all()
    gpus = _gpus_of(session, [row.id for row in rows])
    return {
        row.id: IdleJob(row.id, bool(row.interactive), row.idle_since, len(gpus.get(row.id, [])))
        for row in rows
    }


def reclaimed(session: Session) -> int:
    """Sessions ever ended because their GPUs stayed idle (a counter, as rows are kept)."""
    query = select(func.count()).where(
        Job.stop_request == StopRequest.IDLE.value, Job.state == JobState.TIMED_OUT
    )
    return int(session.scalar(query) or 0)
