"""What the estimates are made from (``core.scheduler.policy_progress``, ``forecast``):
the newest few progress records of each job, the GPU-time finished jobs took, and the
predicted starts the worker writes back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, desc, func, insert, select, update
from sqlalchemy.orm import Session

from ddpq.core.scheduler.forecast import done_of
from ddpq.core.scheduler.policy_progress import RATE_WINDOW, Record
from ddpq.core.states import ACTIVE, JobState
from ddpq.store.batches import batches
from ddpq.store.gpu_time import gpu_seconds
from ddpq.store.models import Attempt, Job, ProgressSample

# Records kept per job (the newest): one more than the pairs a rate is measured over.
KEPT = RATE_WINDOW + 1
# Finished jobs read for the history (the newest): ``History`` keeps 500 per class.
HISTORY_JOBS = 2000
_jobs = cast(Table, Job.__table__)


def record_samples(session: Session, progress: Mapping[int, Mapping[str, Any]], now: float) -> None:
    """Keep the new records of running jobs that say how far they are (``forecast.done_of``)
    with the attempt they are of, and forget all but each job's newest ``KEPT``."""
    said = {i: d for i, p in progress.items() if (d := done_of(p)) is not None}
    if not said:
        return
    attempts = session.execute(
        select(Job.id, Job.attempt).where(Job.id.in_(list(said)), Job.state.in_(list(ACTIVE)))
    ).all()
    if not attempts:
        return
    session.execute(
        insert(ProgressSample),
        [
            {"job_id": i, "attempt": n, "at": now, "done": said[i][0], "total": said[i][1]}
            for i, n in attempts
        ],
    )
    # All but each job's newest KEPT, in one statement however many jobs reported.
    ids = [job_id for job_id, _ in attempts]
    rank = (
        func.row_number()
        .over(partition_by=ProgressSample.job_id, order_by=desc(ProgressSample.id))
        .label("rank")
    )
    ranked = select(ProgressSample.id, rank).where(ProgressSample.job_id.in_(ids)).subquery()
    old = select(ranked.c.id).where(ranked.c.rank > KEPT)
    session.execute(delete(ProgressSample).where(ProgressSample.id.in_(old)))


def records_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Record]]:
    """The kept records of the queued and running jobs among ``job_ids``, oldest first."""
    ids = set(job_ids)
    if not ids:
        return {}
    live = [JobState.QUEUED, *ACTIVE]
    rows = session.execute(
        select(
            ProgressSample.job_id,
            ProgressSample.attempt,
            ProgressSample.at,
            ProgressSample.done,
            ProgressSample.total,
        )
        .join(Job, Job.id == ProgressSample.job_id)
        .where(Job.state.in_(live))
        .order_by(ProgressSample.job_id, ProgressSample.id)
    )
    out: dict[int, list[Record]] = {}
    for job_id, attempt, at, done, total in rows:
        if job_id in ids:
            out.setdefault(job_id, []).append(Record(at, done, total, attempt))
    return out


def finished(session: Session, limit: int = HISTORY_JOBS) -> list[tuple[str, str, float]]:
    """(owner, workload, GPU-seconds) of the newest jobs that succeeded, oldest first;
    the workload is what ``auto`` memory calls the same job (``jobs.mem_key``: its name
    when given, else its command's hash)."""
    recent = (
        select(Job.id, Job.owner, Job.mem_key, Job.ended_at)
        .where(Job.state == JobState.SUCCEEDED)
        .order_by(desc(Job.ended_at))
        .limit(limit)
        .subquery()
    )
    held = gpu_seconds(Attempt.started_at)  # the job succeeded: every attempt ended
    rows = session.execute(
        select(recent.c.owner, recent.c.mem_key, func.sum(held))
        .join(Attempt, Attempt.job_id == recent.c.id)
        .group_by(recent.c.id)
        .order_by(recent.c.ended_at)
    )
    return [(owner, key or "", float(gpu_s or 0.0)) for owner, key, gpu_s in rows]


def set_predicted(session: Session, starts: Mapping[int, float | None]) -> None:
    """Write queued jobs' predicted starts (None: unknown); one executemany."""
    if starts:
        session.connection().execute(
            update(_jobs)
            .where(_jobs.c.id == bindparam("job_id"))
            .values(predicted_start=bindparam("start")),
            [{"job_id": i, "start": t} for i, t in starts.items()],
        )


def workloads(session: Session, job_ids: Iterable[int]) -> dict[int, str]:
    """The workload (``finished``'s class) of each of ``job_ids``, by id."""
    out: dict[int, str] = {}
    for batch in batches(job_ids):
        rows = session.execute(select(Job.id, Job.mem_key).where(Job.id.in_(batch)))
        out.update({job_id: key or "" for job_id, key in rows})
    return out
