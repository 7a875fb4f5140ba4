"""Waiting jobs put where their dependencies and holds say they belong, and the end of a
job told to the jobs that wait on it. Every move is written by ``store.transitions``.
Flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import BindParameter, bindparam, select, union
from sqlalchemy.orm import Session, aliased

from ddpq.core.deps import SweepStanding, settle_change, waiting_place
from ddpq.core.states import TERMINAL, JobState
from ddpq.store import transitions
from ddpq.store.dependencies import (
    dependencies_of_many,
    dependency_states,
    sweep_dependencies_of_many,
    sweep_standings,
)
from ddpq.store.models import Job, JobDependency, SweepDependency


def settle_waiting(
    session: Session,
    job: Job,
    dep_states: Mapping[int, JobState],
    standings: Mapping[int, SweepStanding],
    now: float,
) -> None:
    """Put a waiting job where its dependencies and hold say it belongs."""
    place = waiting_place(dep_states, standings, job.user_hold)
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
    """Settle held jobs, all at once: their dependencies read in four queries, their
    changes written together, and the dependents of those cancelled settled next, level
    by level (a sweep's thousand members doomed by one failed job cost a few statements,
    not a cascade per member)."""
    ids = [j.id for j in jobs]
    deps = dependencies_of_many(session, ids)
    states = dependency_states(session, {d for ds in deps.values() for d in ds})
    sweeps = sweep_dependencies_of_many(session, ids)
    standings = sweep_standings(session, {s for ss in sweeps.values() for s in ss})
    changes: list[transitions.Change] = []
    for job in jobs:
        if job.state is not JobState.HELD:
            continue
        place = waiting_place(
            {d: states[d] for d in deps.get(job.id, [])},
            {s: standings[s] for s in sweeps.get(job.id, []) if s in standings},
            job.user_hold,
        )
        change = settle_change(job.state, job.reason, place)
        if change is not None:  # held -> held: a new reason, not a transition
            changes.append(transitions.Change(job.id, job.state, *change))
    moved = set(transitions.move_many(session, changes, now))
    ended = [c.job_id for c in changes if c.job_id in moved and c.new in TERMINAL]
    settle_dependents_many(session, ended, now)


def settle_dependents(session: Session, job_id: int, now: float) -> None:
    """A job has ended for good: release, or cancel, the held jobs that wait on it, or on
    the sweep it belongs to."""
    settle_dependents_many(session, [job_id], now)


# Built once: a new alias per call missed SQLAlchemy's statement cache and rebuilt its 50
# column proxies, and loading two ORM queries' rows per ended job was most of the cost of
# recording an end. Only the ids are read; the jobs are loaded only when there are any.
_MEMBER = aliased(Job)
_ENDED: BindParameter[int] = bindparam("ended", expanding=True)
_HELD_ON_THEM = union(
    select(JobDependency.job_id)
    .join(Job, Job.id == JobDependency.job_id)
    .where(JobDependency.depends_on.in_(_ENDED), Job.state == JobState.HELD),
    select(SweepDependency.job_id)
    .join(Job, Job.id == SweepDependency.job_id)
    .join(_MEMBER, _MEMBER.sweep_id == SweepDependency.sweep_id)
    .where(_MEMBER.id.in_(_ENDED), Job.state == JobState.HELD),
)


def settle_dependents_many(session: Session, job_ids: Sequence[int], now: float) -> None:
    """``settle_dependents`` for several ended jobs at once (a sweep's, say)."""
    if not job_ids:
        return
    session.flush()  # a job held by this session's own pending changes is seen
    held = list(session.connection().execute(_HELD_ON_THEM, {"ended": list(job_ids)}).scalars())
    if held:
        waiting = session.scalars(select(Job).where(Job.id.in_(held)).order_by(Job.id))
        settle_jobs(session, list(waiting), now)
