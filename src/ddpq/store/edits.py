"""A job's fields changed after its submission (``ddpq update``), and the note a restart
leaves. Both are written by ``store.transitions``: the row's new values and the event
that says so in one guarded write. Flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ddpq.core.states import JobState
from ddpq.store import settling, transitions
from ddpq.store.dependencies import waiting_of_many
from ddpq.store.models import Job


def update_job(
    session: Session, job: Job, values: Mapping[str, Any], reason: str, now: float
) -> bool:
    """Set ``values`` on ``job``'s row with an event (its state and the reason it waits
    unchanged); False, with nothing written, if it is not in the state it was read in."""
    return transitions.edit(session, job.id, job.state, reason, now, **values)


def note_restart(session: Session, new: Job, of: int, by: str, now: float) -> None:
    """The new job's history says which job it runs again, and who asked."""
    transitions.note(session, new.id, new.state, f"restart of job {of} by {by}", now)


def settle_renamed(session: Session, job: Job, old_name: str, now: float) -> None:
    """A job's name changed: it, if a singleton, and the waiting singletons after it of its
    owner with its old or new name wait on other jobs now. A later one already queued
    (nothing of the new name was before it) is held again: it must not start before
    this job, the way a singleton is kept from starting is its hold."""
    if job.singleton and job.state in (JobState.QUEUED, JobState.HELD):
        settling.settle_waiting(session, job, waiting_of_many(session, [job.id])[job.id], now)
    later = select(Job).where(
        Job.owner == job.owner,
        Job.name.in_([old_name, job.name]),
        Job.id > job.id,
        Job.state.in_([JobState.QUEUED, JobState.HELD]),
        Job.singleton.is_(True),
    )
    after = list(session.scalars(later.order_by(Job.id)))
    queued = [j for j in after if j.state is JobState.QUEUED]
    waiting = waiting_of_many(session, [j.id for j in queued])
    for j in queued:
        settling.settle_waiting(session, j, waiting[j.id], now)
    settling.settle_jobs(session, [j for j in after if j.state is JobState.HELD], now)
