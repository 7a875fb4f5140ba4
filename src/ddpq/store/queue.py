"""The queue as one screen shows it, and what the per-user caps count. Read only.

``ddpq ls`` asks for one screen, not for every job: with 60,000 of someone else's held jobs
in the queue it must cost what it costs on an empty one. Every statement here walks an
index over the jobs that match (``ix_jobs_state_owner_sweep``: state, owner, sweep; its
rows also carry the job id) and reads whole rows only for the jobs shown:

1. ``groups``: the matching jobs counted by (state, owner, sweep) with the lowest id of
   each group, from the index alone;
2. the rows shown: the first ``limit`` of the chosen groups, oldest first, one index range
   per group (``state = ? AND owner = ? AND sweep_id IS ?``, already in id order), asked in
   the order of their lowest id and stopped once no further group can come earlier.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Integer, bindparam, func, select
from sqlalchemy.orm import Session, defer

from ddpq.core.states import JobState
from ddpq.store.models import Job

# What a user's cap on waiting jobs counts (``max_queued_per_user``).
WAITING = (JobState.QUEUED, JobState.HELD)


# Built once: asked at every submission, where building it anew (a subquery's columns,
# its cache key) cost a third of the request's own time (bench/RESULTS.md).
_WAITING_OF = select(func.count()).select_from(
    select(Job.id)
    .where(Job.state.in_(WAITING), Job.owner == bindparam("owner"))
    .limit(bindparam("upto", type_=Integer))
    .subquery()
)


def waiting_of(session: Session, owner: str, upto: int) -> int:
    """How many of ``owner``'s jobs are queued or held, counted up to ``upto`` at most:
    the cap's question costs at most the cap's index entries, however long the queue."""
    found = session.connection().execute(_WAITING_OF, {"owner": owner, "upto": upto})
    return int(found.scalar() or 0)


@dataclass(frozen=True)
class Group:
    """Matching jobs that share a state, an owner and a sweep (None: no sweep)."""

    state: JobState
    owner: str
    sweep_id: int | None
    jobs: int
    first_id: int
    last_id: int


def groups(session: Session, states: Sequence[JobState], owner: str | None) -> list[Group]:
    """The matching jobs counted by state, owner and sweep (the index alone answers)."""
    query = select(
        Job.state, Job.owner, Job.sweep_id, func.count(), func.min(Job.id), func.max(Job.id)
    )
    if states:
        query = query.where(Job.state.in_(list(states)))
    if owner is not None:
        query = query.where(Job.owner == owner)
    query = query.group_by(Job.state, Job.owner, Job.sweep_id)
    return [
        Group(JobState(st), o, sw, int(n), int(first), int(last))
        for st, o, sw, n, first, last in session.execute(query)
    ]


def shown_jobs(
    session: Session, chosen: Iterable[Group], limit: int, *, newest: bool = False
) -> list[Job]:
    """The ``limit`` oldest (or ``newest``) jobs of these groups, oldest first, without
    their environment (listings never show it). Each group is one index range already in
    id order; groups are asked in the order of their oldest (newest) job, and not at all
    once ``limit`` jobs that come before any of a group's are in hand."""
    sign = -1 if newest else 1  # ids in the order rows are taken: ascending, or not

    def first_of(g: Group) -> int:
        return sign * (g.last_id if newest else g.first_id)

    found: list[Job] = []
    for g in sorted(chosen, key=first_of):
        if len(found) >= limit and sign * found[limit - 1].id < first_of(g):
            break
        sweep = Job.sweep_id.is_(None) if g.sweep_id is None else Job.sweep_id == g.sweep_id
        query = (
            select(Job)
            .options(defer(Job.env, raiseload=True))
            .where(Job.state == g.state, Job.owner == g.owner, sweep)
            .order_by(Job.id.desc() if newest else Job.id)
            .limit(limit)
        )
        found = sorted([*found, *session.scalars(query)], key=lambda j: sign * j.id)[:limit]
    return sorted(found, key=lambda j: j.id)
