"""The end of an attempt the executor reports: recorded, its leases freed, the job moved
on as ``core.disposition`` decided (requeued, retried or finished, through
``store.transitions``). Core statements on columns, as the rest of the worker's hot path.
Flush, never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, and_, select, update
from sqlalchemy.orm import Session

from ddpq.core.disposition import Disposition, JobFacts
from ddpq.core.rules import ExitRecord, StopRequest
from ddpq.core.states import JobState
from ddpq.store import leases as lease_store
from ddpq.store import settling, transitions
from ddpq.store.models import Attempt, Job

_jobs = cast(Table, Job.__table__)
_attempts = cast(Table, Attempt.__table__)


@dataclass(frozen=True)
class Ending:
    """What the store knows of a job whose attempt the executor reports ended."""

    job_id: int
    state: JobState
    attempt: int
    facts: JobFacts
    job_dir: str | None


def endings(session: Session, job_ids: Iterable[int]) -> dict[int, Ending]:
    ids = list(job_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(
            Job.id,
            Job.state,
            Job.attempt,
            Job.max_retries,
            Job.port_retries,
            Job.relaunches,
            Job.stop_request,
            Job.stop_sent_at,
            Job.stop_reason,
            Job.job_dir,
            Job.oom_requeues,
            Attempt.gpu_mem_bytes,
        )
        .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
        .where(Job.id.in_(ids))
    )
    out = {}
    for row in rows:
        stop = StopRequest(row.stop_request) if row.stop_request else None
        facts = JobFacts(
            row.attempt,
            row.max_retries,
            row.port_retries,
            stop,
            row.relaunches,
            row.stop_sent_at,
            row.stop_reason,
            shared_mem_bytes=row.gpu_mem_bytes,
            oom_requeues=row.oom_requeues,
        )
        out[row.id] = Ending(row.id, row.state, row.attempt, facts, row.job_dir)
    return out


def record_exit(
    session: Session,
    ending: Ending,
    record: ExitRecord,
    disposition: Disposition,
    progress: dict[str, Any] | None,
    now: float,
) -> None:
    """End the attempt as ``disposition`` says, free its leases, move the job on."""
    conn = session.connection()
    job_id = ending.job_id
    if ending.state is JobState.STARTING:
        # It ran and ended while no worker watched (we died right after launching it).
        found = "started (found after restart)"
        transitions.move(session, job_id, JobState.STARTING, JobState.RUNNING, found, now)
    ended_at = record.ended_at or now  # when its processes were gone, not when we noticed
    conn.execute(
        update(_attempts)
        .where(
            _attempts.c.job_id == job_id,
            _attempts.c.number == ending.attempt,
            _attempts.c.ended_at.is_(None),
        )
        .values(
            ended_at=ended_at,
            exit_code=record.exit_code,
            exit_signal=record.signal,
            state=disposition.attempt_state,
            reason=disposition.attempt_reason,
            # Where the executor read its cgroup's high-water mark (``ddpq show``'s peak).
            **({} if record.peak_ram_bytes is None else {"peak_ram_bytes": record.peak_ram_bytes}),
        )
    )
    lease_store.release(session, job_id, now)
    values: dict[str, Any] = {
        "exit_code": record.exit_code,
        "exit_signal": record.signal,
        "ended_at": ended_at,
    }
    if progress is not None:
        values["progress"] = progress
    if disposition.port_requeue:
        values["port_retries"] = _jobs.c.port_retries + 1
    if disposition.relaunch:
        values["relaunches"] = _jobs.c.relaunches + 1
    if disposition.preempted:
        values["preemptions"] = _jobs.c.preemptions + 1
    if disposition.oom_requeue:
        values["oom_requeues"] = _jobs.c.oom_requeues + 1
    if not disposition.finished:
        # Back in the queue: the stop that ended this attempt is done with.
        values.update(stop_request=None, stop_sent_at=None, stop_reason=None)
    if disposition.not_before is not None:
        values["not_before"] = disposition.not_before
    at = ended_at if disposition.finished else now
    new, why = disposition.job_state, disposition.job_reason
    transitions.move(session, job_id, JobState.RUNNING, new, why, at, **values)
    if disposition.finished:
        settling.settle_dependents(session, job_id, at)
