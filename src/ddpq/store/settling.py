"""Waiting jobs put where their dependencies and holds say they belong, and the end of a
job told to the jobs that wait on it. Every move is written by ``store.transitions``.
Flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import BindParameter, bindparam, select, union
from sqlalchemy.orm import Session, aliased

from ddpq.core.deps import settle_change
from ddpq.core.states import TERMINAL, JobState
from ddpq.store import transitions
from ddpq.store.columns import flushed
from ddpq.store.dependencies import Waiting, waiting_of_many
from ddpq.store.models import Job, JobDependency, SweepDependency


def settle_waiting(session: Session, job: Job, waiting: Waiting, now: float) -> None:
    """Put a waiting job where its dependencies and hold say it belongs."""
    place = waiting.place(job.user_hold)
    change = settle_change(job.state, job.reason, place)
    if change is None:
        return
    state, reason = change
    if state is JobState.CANCELLED:
        finish(session, job, state, reason, now)
    else:
        transitions.move_job(session, job, state, reason, now)


def finish(session: Session, job: Job, state: JobState, reason: str, now: float) -> bool:
    """End a job for good, and settle every job that waits on it; False (nothing written)
    if the job was not in the state it was read in any more."""
    assert state in TERMINAL
    if not transitions.move_job(session, job, state, reason, now):
        return False
    settle_dependents(session, job.id, now)
    return True


def settle_jobs(session: Session, jobs: Sequence[Job], now: float) -> None:
    """Settle held jobs, all at once: their dependencies read in a few queries, their
    changes written together, and the dependents of those cancelled settled next, level
    by level (a sweep's thousand members doomed by one failed job cost a few statements,
    not a cascade per member)."""
    waiting = waiting_of_many(session, [j.id for j in jobs if j.state is JobState.HELD])
    changes: list[transitions.Change] = []
    for job in jobs:
        if job.state is not JobState.HELD:
            continue
        place = waiting[job.id].place(job.user_hold)
        change = settle_change(job.state, job.reason, place)
        if change is not None:  # held -> held: a new reason, not a transition
            changes.append(transitions.Change(job.id, job.state, *change))
    moved = set(transitions.move_many(session, changes, now))
    ended = [c.job_id for c in changes if c.job_id in moved and c.new in TERMINAL]
    settle_dependents_many(session, ended, now)


def settle_dependents(session: Session, job_id: int, now: float) -> None:
    """A job has ended for good: release, or cancel, the held jobs that wait on it, or on
    the sweep it belongs to, and the singletons of its owner and name after it."""
    settle_dependents_many(session, [job_id], now)


# Built once: a new alias per call missed SQLAlchemy's statement cache and rebuilt its 50
# column proxies, and loading two ORM queries' rows per ended job was most of the cost of
# recording an end. Only the ids are read; the jobs are loaded only when there are any.
_MEMBER = aliased(Job)
_LATER = aliased(Job)
_ENDED: BindParameter[int] = bindparam("ended", expanding=True)
_HELD_ON_THEM = union(
    select(JobDependency.job_id)
    .join(Job, Job.id == JobDependency.job_id)
    .where(JobDependency.depends_on.in_(_ENDED), Job.state == JobState.HELD),
    select(SweepDependency.job_id)
    .join(Job, Job.id == SweepDependency.job_id)
    .join(_MEMBER, _MEMBER.sweep_id == SweepDependency.sweep_id)
    .where(_MEMBER.id.in_(_ENDED), Job.state == JobState.HELD),
    select(_LATER.id)
    .join(Job, (Job.owner == _LATER.owner) & (Job.name == _LATER.name) & (Job.id < _LATER.id))
    .where(Job.id.in_(_ENDED), _LATER.state == JobState.HELD, _LATER.singleton.is_(True)),
)


def held_on(session: Session, job_ids: Sequence[int]) -> list[int]:
    """The held jobs that wait on any of ``job_ids`` (ended), on their sweeps, or behind
    them as singletons: one statement, built once."""
    if not job_ids:
        return []
    # A job held by this session's own pending changes is seen (flushed writes them).
    return list(flushed(session).execute(_HELD_ON_THEM, {"ended": list(job_ids)}).scalars())


def settle_dependents_many(session: Session, job_ids: Sequence[int], now: float) -> None:
    """``settle_dependents`` for several ended jobs at once (a sweep's, say)."""
    held = held_on(session, job_ids)
    if held:
        waiting = session.scalars(select(Job).where(Job.id.in_(held)).order_by(Job.id))
        settle_jobs(session, list(waiting), now)
