"""What waiting jobs wait for: the jobs and sweeps they depend on (each with its kind),
and a singleton's earlier jobs of its name, read in few queries.

Reads only; settling a waiting job (``store.settling``) decides with these and ``core.deps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, case, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased

from ddpq.core.deps import Kind, SweepStanding, waiting_place
from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, TERMINAL, WAITING, JobState
from ddpq.store.columns import flushed
from ddpq.store.models import Job, JobDependency, Sweep, SweepDependency
from ddpq.store.models.job import DEPENDENCY_FIELDS


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


# Built once, the ids bound at each read (for every page of a listing and every job's detail):
# each (the job, what it waits on, how), and whether that is a sweep.
_DEPENDENCY_READS = tuple(
    (
        select(key, value, kind).where(key.in_(bindparam("ids", expanding=True))).order_by(value),
        sweep,
    )
    for key, value, kind, sweep in (
        (JobDependency.job_id, JobDependency.depends_on, JobDependency.kind, False),
        (SweepDependency.job_id, SweepDependency.sweep_id, SweepDependency.kind, True),
    )
)


def fields_of_many(session: Session, job_ids: Iterable[int]) -> dict[int, dict[str, list[int]]]:
    """Each job's dependencies by ``JobSpec`` field (``after``, ``after_any_sweeps``, ...)."""
    ids = list(job_ids)
    out: dict[int, dict[str, list[int]]] = {}
    if not ids:
        return out
    for statement, sweep in _DEPENDENCY_READS:
        for job_id, other, k in flushed(session).execute(statement, {"ids": ids}):
            name = DEPENDENCY_FIELDS[(k, sweep)]
            out.setdefault(job_id, {}).setdefault(name, []).append(other)
    return out


@dataclass(frozen=True)
class Waiting:
    """All a waiting job waits on, as ``core.deps.waiting_place`` takes it."""

    deps: dict[int, JobState] = field(default_factory=dict)
    sweeps: dict[int, SweepStanding] = field(default_factory=dict)
    kinds: dict[int, Kind] = field(default_factory=dict)
    sweep_kinds: dict[int, Kind] = field(default_factory=dict)
    earlier: list[int] = field(default_factory=list)  # a singleton's unended earlier jobs

    def place(self, user_hold: bool) -> tuple[JobState, str]:
        return waiting_place(
            self.deps, self.sweeps, user_hold, self.kinds, self.sweep_kinds, self.earlier
        )


def dependency_rows(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``job_dependencies`` and ``sweep_dependencies`` rows of ``spec`` (without the
    job's id), each job or sweep once."""
    on_jobs: dict[int, str] = {}
    on_sweeps: dict[int, str] = {}
    for (kind, sweep), name in DEPENDENCY_FIELDS.items():
        for d in getattr(spec, name):
            (on_sweeps if sweep else on_jobs).setdefault(d, kind)
    return (
        [{"depends_on": d, "kind": k} for d, k in sorted(on_jobs.items())],
        [{"sweep_id": d, "kind": k} for d, k in sorted(on_sweeps.items())],
    )


_EARLIER = aliased(Job)
# Named, not "not terminal": each is a seek on (owner, name, state), never a walk over all
# the ended jobs of a name (a user's thousands of runs of "train").
_UNENDED = sorted(WAITING | ACTIVE)


def earlier_of_many(session: Session, job_ids: Iterable[int]) -> dict[int, list[int]]:
    """For the singletons among ``job_ids``: the earlier jobs of the same owner and name
    that have not ended (on the owner-and-name index)."""
    ids = list(job_ids)
    out: dict[int, list[int]] = {}
    if not ids:
        return out
    query = (
        select(Job.id, _EARLIER.id)
        .join(
            _EARLIER,
            (_EARLIER.owner == Job.owner) & (_EARLIER.name == Job.name) & (_EARLIER.id < Job.id),
        )
        .where(Job.id.in_(ids), Job.singleton.is_(True), _EARLIER.state.in_(_UNENDED))
    )
    # Sorted here: an ORDER BY made SQLite walk the owner's jobs by id instead (measured
    # 53 ms an end with 20,000 of them, against 0.1 ms on the index).
    rows: list[tuple[int, int]] = [(a, b) for a, b in session.execute(query)]
    for job_id, other in sorted(rows):
        out.setdefault(job_id, []).append(other)
    return out


def waiting_of_many(session: Session, job_ids: Iterable[int]) -> dict[int, Waiting]:
    """What each of ``job_ids`` waits on, in a few queries for all of them."""
    ids = list(job_ids)
    fields = fields_of_many(session, ids)
    on_jobs = {
        d
        for f in fields.values()
        for k in ("after", "after_any", "after_notok")
        for d in f.get(k, [])
    }
    on_sweeps = {
        d
        for f in fields.values()
        for k in ("after_sweeps", "after_any_sweeps", "after_notok_sweeps")
        for d in f.get(k, [])
    }
    states = dependency_states(session, on_jobs)
    standings = sweep_standings(session, on_sweeps)
    earlier = earlier_of_many(session, ids)
    out = {}
    for job_id in ids:
        kinds: dict[int, Kind] = {}
        sweep_kinds: dict[int, Kind] = {}
        for (kind, sweep), name in DEPENDENCY_FIELDS.items():
            into = sweep_kinds if sweep else kinds
            for d in fields.get(job_id, {}).get(name, []):
                into[d] = Kind(kind)
        out[job_id] = Waiting(
            {d: states[d] for d in kinds if d in states},
            {s: standings[s] for s in sweep_kinds if s in standings},
            kinds,
            sweep_kinds,
            earlier.get(job_id, []),
        )
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
            func.sum(case((Job.state.in_(list(TERMINAL)), 1), else_=0)),
        )
        .where(Job.sweep_id.in_(wanted))
        .group_by(Job.sweep_id)
    ).all()
    failed = dependency_states(session, [row[3] for row in rows if row[3] is not None])
    out = {}
    for sweep_id, members, succeeded, first_failed, ended in rows:
        member = (first_failed, failed[first_failed]) if first_failed is not None else None
        out[sweep_id] = SweepStanding(members, int(succeeded or 0), member, int(ended or 0))
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
