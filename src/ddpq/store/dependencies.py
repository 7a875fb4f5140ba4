"""What waiting jobs wait for: the jobs and sweeps they depend on, read in few queries.

Reads only; settling a waiting job (``store.jobs``) decides with these and ``core.deps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import case, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from ddpq.core.deps import SweepStanding
from ddpq.core.states import TERMINAL, JobState
from ddpq.store.models import Job, JobDependency, Sweep, SweepDependency


class UnknownSweep(LookupError):
    def __init__(self, sweep_id: int) -> None:
        super().__init__(f"no sweep {sweep_id}")
        self.sweep_id = sweep_id


def dependency_states(session: Session, ids: Iterable[int]) -> dict[int, JobState]:
    wanted = set(ids)
    if not wanted:
        return {}
    rows = session.execute(select(Job.id, Job.state).where(Job.id.in_(wanted)))
    return {job_id: state for job_id, state in rows}


def dependencies_of(session: Session, job_id: int) -> list[int]:
    rows = session.scalars(select(JobDependency.depends_on).where(JobDependency.job_id == job_id))
    return sorted(rows)


def dependencies_of_many(session: Session, job_ids: Iterable[int]) -> dict[int, list[int]]:
    """The jobs each of ``job_ids`` waits for, in one query (a listing's worth at once)."""
    return _grouped(session, JobDependency.job_id, JobDependency.depends_on, job_ids)


def sweep_dependencies_of_many(session: Session, job_ids: Iterable[int]) -> dict[int, list[int]]:
    """The sweeps each of ``job_ids`` waits for (``after_sweeps``), in one query."""
    return _grouped(session, SweepDependency.job_id, SweepDependency.sweep_id, job_ids)


def _grouped(
    session: Session,
    key: InstrumentedAttribute[int],
    value: InstrumentedAttribute[int],
    job_ids: Iterable[int],
) -> dict[int, list[int]]:
    ids = list(job_ids)
    out: dict[int, list[int]] = {}
    if ids:
        for job_id, other in session.execute(
            select(key, value).where(key.in_(ids)).order_by(value)
        ):
            out.setdefault(job_id, []).append(other)
    return out


_UNSUCCESSFUL = [s for s in TERMINAL if s is not JobState.SUCCEEDED]


def sweep_standings(session: Session, sweep_ids: Iterable[int]) -> dict[int, SweepStanding]:
    """How far each sweep is: members, how many succeeded, the first that did not.

    One grouped query on the members' index (and one more only when a member failed).
    """
    wanted = set(sweep_ids)
    if not wanted:
        return {}
    rows = session.execute(
        select(
            Job.sweep_id,
            func.count(),
            func.sum(case((Job.state == JobState.SUCCEEDED, 1), else_=0)),
            func.min(case((Job.state.in_(_UNSUCCESSFUL), Job.id))),
        )
        .where(Job.sweep_id.in_(wanted))
        .group_by(Job.sweep_id)
    ).all()
    failed = dependency_states(session, [row[3] for row in rows if row[3] is not None])
    out = {}
    for sweep_id, members, succeeded, first_failed in rows:
        member = (first_failed, failed[first_failed]) if first_failed is not None else None
        out[sweep_id] = SweepStanding(members, int(succeeded or 0), member)
    return out


def checked_standings(session: Session, sweep_ids: Sequence[int]) -> dict[int, SweepStanding]:
    """``sweep_standings`` of sweeps a submission names; UnknownSweep if one is not there."""
    if not sweep_ids:
        return {}
    found = set(session.scalars(select(Sweep.id).where(Sweep.id.in_(list(sweep_ids)))))
    missing = [i for i in sweep_ids if i not in found]
    if missing:
        raise UnknownSweep(missing[0])
    standings = sweep_standings(session, sweep_ids)
    # A sweep has members from the transaction that made it; this guards a bare row.
    return {i: standings.get(i, SweepStanding(0, 0)) for i in sweep_ids}
