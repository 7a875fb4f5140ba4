"""Sweeps: many jobs queued, listed, cancelled, held and released as one.

A sweep's members are ordinary jobs (``jobs.sweep_id``) that the worker runs like any
other; what is here is doing things to all of them at once. A sweep may hold 10,000
members, so every write is a handful of Core statements over all of them (an executemany,
or one UPDATE with a WHERE), never an ORM object per member. Flush, never commit: the
caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from ddpq.core import sweeps as core_sweeps
from ddpq.core.deps import Kind, settle_change
from ddpq.core.scheduler import NO_SWEEP_CAPS, SweepCaps
from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, TERMINAL, WAITING, JobState
from ddpq.store import dependencies, settling, transitions
from ddpq.store import jobs as job_store
from ddpq.store.dependencies import UnknownSweep
from ddpq.store.models import Job, JobDependency, Sweep, SweepDependency, new_row

_jobs = cast(Table, Job.__table__)
_sweeps = cast(Table, Sweep.__table__)
_INSERT_JOB = insert(_jobs)


@dataclass(frozen=True)
class NewMember:
    index: int
    name: str
    command: list[str]
    params: dict[str, str]


@dataclass(frozen=True)
class NewSweep:
    """A sweep to create: what every member shares (``job``: its name and command are the
    template's), the submission as sent, and each member's own part."""

    job: JobSpec
    template: dict[str, Any]
    params: dict[str, list[str]]
    array: str | None
    max_running: int | None
    members: Sequence[NewMember]


def create_sweep(session: Session, spec: NewSweep, now: float) -> Sweep:
    """Insert the sweep and all its members in a few statements, in the caller's
    transaction: members are queued, held (a hold, an unmet dependency) or cancelled
    (a dependency failed) at once, exactly as ``create_job`` would put each of them.

    Returns the sweep row, detached from the session.
    """
    job = spec.job
    on_jobs, on_sweeps, state, reason = _where_members_start(session, job)
    conn = session.connection()
    sweep_row = {
        "name": job.name,
        "owner": job.owner,
        "submitted_at": now,
        "template": spec.template,
        "params": spec.params,
        "array": spec.array,
        "size": len(spec.members),
        "max_running": spec.max_running,
        # The sweep's end is told once, for all its members (store.notifications).
        "notify_url": job.notify_url,
    }
    key = conn.execute(insert(_sweeps), sweep_row).inserted_primary_key
    assert key is not None
    sweep_id = int(key[0])
    # One plain executemany, then the members' ids by the new sweep's id (every member
    # is treated alike below, so which id is whose does not matter). RETURNING in the
    # rows' order is one INSERT per member on SQLite, which promises no order: 10,000
    # members took 10 s under load, and held the write lock throughout.
    conn.execute(_INSERT_JOB, _member_rows(spec, sweep_id, now))
    members = select(_jobs.c.id).where(_jobs.c.sweep_id == sweep_id).order_by(_jobs.c.id)
    ids = [int(i) for i in conn.execute(members).scalars()]
    # Born queued, as every job; then where their dependencies and hold put them.
    transitions.submitted(session, ids, now)
    if state is not JobState.QUEUED:
        changes = [transitions.Change(i, JobState.QUEUED, state, reason) for i in ids]
        transitions.move_many(session, changes, now)
    if on_jobs:
        deps = [{"job_id": i, **d} for i in ids for d in on_jobs]
        conn.execute(insert(cast(Table, JobDependency.__table__)), deps)
    if on_sweeps:
        on = [{"job_id": i, **d} for i in ids for d in on_sweeps]
        conn.execute(insert(cast(Table, SweepDependency.__table__)), on)
    if job.singleton and state is JobState.HELD:
        written = session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id))
        settling.settle_jobs(session, list(written), now)
    return Sweep(id=sweep_id, **sweep_row)


def _where_members_start(
    session: Session, job: JobSpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], JobState, str]:
    """The job and sweep dependency rows of the members (refused if one names what is not
    there), and the state and reason every member starts in: they all wait on the same
    things (a singleton's members are settled each on its own once written)."""
    on_jobs, on_sweeps = dependencies.dependency_rows(job)
    job_store.check_known(session, on_jobs, on_sweeps)
    change = None
    if on_jobs or on_sweeps or job.hold or job.singleton:
        waiting = dependencies.Waiting(
            dependencies.dependency_states(session, [d["depends_on"] for d in on_jobs]),
            dependencies.sweep_standings(session, [d["sweep_id"] for d in on_sweeps]),
            {d["depends_on"]: Kind(d["kind"]) for d in on_jobs},
            {d["sweep_id"]: Kind(d["kind"]) for d in on_sweeps},
        )
        change = settle_change(JobState.QUEUED, "", waiting.place(job.hold))
    state, reason = change or (JobState.QUEUED, "")
    if job.singleton and state is JobState.QUEUED:
        state, reason = JobState.HELD, "singleton"  # each member settled once written
    return on_jobs, on_sweeps, state, reason


def _member_rows(spec: NewSweep, sweep_id: int, now: float) -> list[dict[str, Any]]:
    """Each member's row: the template's spec (its mem_key too: its members are runs of
    the same job), with its own name, command and environment."""
    shared = {
        # Born queued, as every job (store.transitions moves them on).
        **new_row(spec.job, JobState.QUEUED, "", now),
        "sweep_id": sweep_id,
        "notify_url": None,  # a member sends nothing of its own: its sweep tells of it
    }
    return [
        {
            **shared,
            "name": m.name,
            "command": m.command,
            "env": {
                **spec.job.env,
                **core_sweeps.member_env(sweep_id, core_sweeps.Member(m.index, m.params)),
            },
            "sweep_index": m.index,
            "sweep_params": m.params,
        }
        for m in spec.members
    ]


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise UnknownSweep(sweep_id)
    return sweep


def list_sweeps(
    session: Session,
    *,
    owner: str | None = None,
    ids: Iterable[int] | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Sweep], int]:
    """Sweeps oldest first (newest last, like the jobs), with the total before paging;
    ``ids``: only these (``ddpq ls`` folds the members it lists into their sweeps)."""
    query = select(Sweep)
    if owner is not None:
        query = query.where(Sweep.owner == owner)
    if ids is not None:
        query = query.where(Sweep.id.in_(sorted(set(ids))))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Sweep.id).limit(limit).offset(offset)).all()
    return list(rows), total


def counts(session: Session, sweep_ids: Iterable[int]) -> dict[int, dict[JobState, int]]:
    """Members by state for each sweep, in one grouped query."""
    ids = list(sweep_ids)
    out: dict[int, dict[JobState, int]] = {i: {} for i in ids}
    if ids:
        rows = session.execute(
            select(Job.sweep_id, Job.state, func.count())
            .where(Job.sweep_id.in_(ids))
            .group_by(Job.sweep_id, Job.state)
        )
        for sweep_id, state, n in rows:
            if sweep_id is not None:
                out[sweep_id][state] = n
    return out


@dataclass(frozen=True)
class MemberRow:
    """A member as a sweep's view shows it: columns, no ORM object (there may be 10,000)."""

    id: int
    index: int
    name: str
    params: dict[str, str]
    state: JobState
    reason: str
    exit_code: int | None
    exit_signal: int | None
    started_at: float | None
    ended_at: float | None
    progress: dict[str, Any] | None


def members(session: Session, sweep_id: int) -> list[MemberRow]:
    """The sweep's members in index order."""
    rows = session.execute(
        select(
            Job.id,
            Job.sweep_index,
            Job.name,
            Job.sweep_params,
            Job.state,
            Job.reason,
            Job.exit_code,
            Job.exit_signal,
            Job.started_at,
            Job.ended_at,
            Job.progress,
        )
        .where(Job.sweep_id == sweep_id)
        .order_by(Job.sweep_index, Job.id)
    )
    return [
        MemberRow(row.id, row.sweep_index or 0, row.name, dict(row.sweep_params or {}), *row[4:])
        for row in rows
    ]


# ---- doing things to the whole sweep ----------------------------------------------


@dataclass(frozen=True)
class Acted:
    """What a sweep-wide write did: members changed now, and those asked to stop."""

    changed: int
    stopping: int = 0
    untouched: int = 0  # members the action does not apply to (running, ended)


def cancel_sweep(session: Session, sweep_id: int, now: float) -> Acted:
    """Cancel every member: waiting ones end at once, active ones are stopped by the worker
    (SIGTERM, SIGKILL after the grace period); ended ones stay as they are."""
    conn = session.connection()
    stopping = conn.execute(
        update(_jobs)
        .where(
            _jobs.c.sweep_id == sweep_id,
            _jobs.c.state.in_(list(ACTIVE)),
            _jobs.c.stop_request.is_(None),
        )
        .values(stop_request="cancel")
    ).rowcount
    waiting = conn.execute(
        select(_jobs.c.id, _jobs.c.state).where(
            _jobs.c.sweep_id == sweep_id, _jobs.c.state.in_(list(WAITING))
        )
    ).all()
    why = "cancelled before it started (its sweep was cancelled)"
    changes = [transitions.Change(row.id, row.state, JobState.CANCELLED, why) for row in waiting]
    cancelled = transitions.move_many(session, changes, now)
    settling.settle_dependents_many(session, cancelled, now)
    return Acted(changed=len(cancelled), stopping=stopping)


def set_sweep_hold(session: Session, sweep_id: int, hold: bool, now: float) -> Acted:
    """Hold (or release) every waiting member; active and ended ones are not affected.

    Each member goes where ``core.deps`` says a waiting job with that hold belongs, as
    ``store.jobs.set_hold`` would put it, in a few statements for all of them.
    """
    conn = session.connection()
    rows = conn.execute(
        select(_jobs.c.id, _jobs.c.state, _jobs.c.reason).where(
            _jobs.c.sweep_id == sweep_id, _jobs.c.state.in_(list(WAITING))
        )
    ).all()
    others = conn.execute(
        select(func.count()).where(
            _jobs.c.sweep_id == sweep_id, _jobs.c.state.not_in(list(WAITING))
        )
    ).scalar_one()
    if not rows:
        return Acted(changed=0, untouched=others)
    ids = [row.id for row in rows]
    conn.execute(
        update(_jobs).where(_jobs.c.id == bindparam("b_id")).values(user_hold=hold),
        [{"b_id": i} for i in ids],
    )
    waiting = dependencies.waiting_of_many(session, ids)
    moves, doomed = [], []
    for row in rows:
        place = waiting[row.id].place(hold)
        change = settle_change(row.state, row.reason, place)
        if change is None:
            continue
        state, why = change
        if state is JobState.CANCELLED:
            doomed.append((row.id, why))  # a dependency failed meanwhile: rare, one by one
            continue
        moves.append(transitions.Change(row.id, row.state, state, why))
    moved = transitions.move_many(session, moves, now)
    transitions.trim_histories(session, moved)  # hold, release, hold...: bounded histories
    for job_id, why in doomed:
        settling.finish(session, job_store.get_job(session, job_id), JobState.CANCELLED, why, now)
    return Acted(changed=len(moved) + len(doomed), untouched=others)


def is_done(counts_by_state: dict[JobState, int]) -> bool:
    return all(state in TERMINAL for state, n in counts_by_state.items() if n)


# ---- the planner's view ------------------------------------------------------------


def caps(session: Session, sweep_ids: Iterable[int]) -> SweepCaps:
    """The caps of those of ``sweep_ids`` that have one, and how many of each one's
    members hold leases now: what ``core.scheduler`` needs to honour ``%K``."""
    wanted = set(sweep_ids)
    if not wanted:
        return NO_SWEEP_CAPS
    rows = session.execute(
        select(Sweep.id, Sweep.max_running).where(
            Sweep.id.in_(wanted), Sweep.max_running.is_not(None)
        )
    )
    capped = {sweep_id: int(k) for sweep_id, k in rows if k is not None}
    if not capped:
        return NO_SWEEP_CAPS
    running = session.execute(
        select(Job.sweep_id, func.count())
        .where(Job.sweep_id.in_(list(capped)), Job.state.in_(list(ACTIVE)))
        .group_by(Job.sweep_id)
    )
    return SweepCaps(cap=capped, running={i: n for i, n in running if i is not None})
