"""The end of an attempt the executor reports: recorded, its leases freed, the job moved
on as ``core.disposition`` decided (requeued, retried or finished, through
``store.transitions``). Core statements on columns, as the rest of the worker's hot path;
the ends of one pass together (``record_exits_many``), a few statements in all, not
eight per job. Flush, never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from ddpq.core.disposition import Disposition, JobFacts
from ddpq.core.rules import ExitRecord, StopRequest
from ddpq.core.states import JobState
from ddpq.store import leases as lease_store
from ddpq.store import settling, transitions
from ddpq.store.columns import flushed
from ddpq.store.models import Attempt, Job

_jobs = cast(Table, Job.__table__)
_attempts = cast(Table, Attempt.__table__)

FOUND = "started (found after restart)"
# Built once, run as one executemany for all the ends of a pass.
_END_ATTEMPT = (
    update(_attempts)
    .where(
        _attempts.c.job_id == bindparam("b_job"),
        _attempts.c.number == bindparam("b_number"),
        _attempts.c.ended_at.is_(None),
    )
    .values(
        ended_at=bindparam("b_ended_at"),
        exit_code=bindparam("b_exit_code"),
        exit_signal=bindparam("b_signal"),
        state=bindparam("b_state", type_=_attempts.c.state.type),
        reason=bindparam("b_reason"),
        # Where the executor read its cgroup's high-water mark (``ddpq show``'s peak).
        peak_ram_bytes=func.coalesce(bindparam("b_peak"), _attempts.c.peak_ram_bytes),
    )
)


# Built once: read by every pass that records an ended attempt.
_ENDINGS = (
    select(
        Job.id,
        Job.state,
        Job.attempt,
        Job.max_retries,
        Job.port_retries,
        Job.relaunches,
        Job.retries_used,
        Job.stop_request,
        Job.stop_sent_at,
        Job.stop_reason,
        Job.job_dir,
        Job.oom_requeues,
        Attempt.gpu_mem_bytes,
        Attempt.started_at,
    )
    .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
    .where(Job.id.in_(bindparam("ids", expanding=True)))
)


@dataclass(frozen=True)
class Ending:
    """What the store knows of a job whose attempt the executor reports ended."""

    job_id: int
    state: JobState
    attempt: int
    facts: JobFacts
    job_dir: str | None
    attempt_started: float | None = None  # its current attempt's start, as the store has it


def endings(session: Session, job_ids: Iterable[int]) -> dict[int, Ending]:
    ids = list(job_ids)
    if not ids:
        return {}
    found = flushed(session).execute(_ENDINGS, {"ids": ids})
    out = {}
    for row in found:
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
            retries_used=row.retries_used,
        )
        out[row.id] = Ending(row.id, row.state, row.attempt, facts, row.job_dir, row.started_at)
    return out


@dataclass(frozen=True)
class Exit:
    """An ended attempt, and what ``core.disposition`` decided becomes of its job."""

    ending: Ending
    record: ExitRecord
    disposition: Disposition
    progress: dict[str, Any] | None

    @property
    def together(self) -> bool:
        """Whether it can be recorded with the other ends of its pass: not one that adds
        to a count on the job's row (an SQL expression, not a value of its own)."""
        d = self.disposition
        return not (d.port_requeue or d.relaunch or d.preempted or d.oom_requeue)


def record_exit(
    session: Session,
    ending: Ending,
    record: ExitRecord,
    disposition: Disposition,
    progress: dict[str, Any] | None,
    now: float,
) -> None:
    """End the attempt as ``disposition`` says, free its leases, move the job on."""
    job_id = ending.job_id
    if ending.state is JobState.STARTING:
        # It ran and ended while no worker watched (we died right after launching it).
        transitions.move(session, job_id, JobState.STARTING, JobState.RUNNING, FOUND, now)
    ended = Exit(ending, record, disposition, progress)
    session.connection().execute(_END_ATTEMPT, [_attempt_row(ended, now)])
    lease_store.release(session, job_id, now)
    values = _job_values(ended, now)
    if disposition.port_requeue:
        values["port_retries"] = _jobs.c.port_retries + 1
    if disposition.relaunch:
        values["relaunches"] = _jobs.c.relaunches + 1
    if disposition.preempted:
        values["preemptions"] = _jobs.c.preemptions + 1
    if disposition.oom_requeue:
        values["oom_requeues"] = _jobs.c.oom_requeues + 1
    at = _moved_at(ended, now)
    new, why = disposition.job_state, disposition.job_reason
    transitions.move(session, job_id, JobState.RUNNING, new, why, at, **values)
    if disposition.finished:
        settling.settle_dependents(session, job_id, at)


def record_exits_many(session: Session, ends: Sequence[Exit], now: float) -> None:
    """``record_exit`` for each of ``ends`` (all ``together``), in a few statements: the
    same rows and the same events. Under a stream of short jobs this runs in the worker's
    transaction that submissions wait behind, and statement by statement it was most of it
    (bench/RESULTS.md, "the hot path on the slower machine")."""
    if not ends:
        return
    assert all(e.together for e in ends)
    found = [e.ending.job_id for e in ends if e.ending.state is JobState.STARTING]
    transitions.move_many(
        session,
        [transitions.Change(i, JobState.STARTING, JobState.RUNNING, FOUND) for i in found],
        now,
    )
    session.connection().execute(_END_ATTEMPT, [_attempt_row(e, now) for e in ends])
    lease_store.release_many(session, [e.ending.job_id for e in ends], now)
    changes = [
        transitions.Change(
            e.ending.job_id,
            JobState.RUNNING,
            e.disposition.job_state,
            e.disposition.job_reason,
            _job_values(e, now),
            at=_moved_at(e, now),
        )
        for e in ends
    ]
    transitions.move_many(session, changes, now)
    finished = [e for e in ends if e.disposition.finished]
    if settling.held_on(session, [e.ending.job_id for e in finished]):
        for e in finished:  # rare: one by one, each at its own end, as record_exit does
            settling.settle_dependents(session, e.ending.job_id, _moved_at(e, now))


def _attempt_row(e: Exit, now: float) -> dict[str, Any]:
    return {
        "b_job": e.ending.job_id,
        "b_number": e.ending.attempt,
        "b_ended_at": _ended_at(e, now),
        "b_exit_code": e.record.exit_code,
        "b_signal": e.record.signal,
        "b_state": e.disposition.attempt_state,
        "b_reason": e.disposition.attempt_reason,
        "b_peak": e.record.peak_ram_bytes,
    }


def _ended_at(e: Exit, now: float) -> float:
    return e.record.ended_at or now  # when its processes were gone, not when we noticed


def _moved_at(e: Exit, now: float) -> float:
    return _ended_at(e, now) if e.disposition.finished else now


def _job_values(e: Exit, now: float) -> dict[str, Any]:
    """The job row's own new values (not the counts ``record_exit`` adds to)."""
    values: dict[str, Any] = {
        "exit_code": e.record.exit_code,
        "exit_signal": e.record.signal,
        "ended_at": _ended_at(e, now),
    }
    if e.progress is not None:
        values["progress"] = e.progress
    if not e.disposition.finished:
        # Back in the queue: the stop that ended this attempt is done with.
        values.update(stop_request=None, stop_sent_at=None, stop_reason=None)
    if e.disposition.not_before is not None:
        values["not_before"] = e.disposition.not_before
    if e.disposition.retry:  # a value, not an expression: recorded with the pass's others
        values["retries_used"] = e.ending.facts.retries_used + 1
    return values
