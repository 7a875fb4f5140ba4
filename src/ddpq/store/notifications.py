"""Notifications owed and delivered: the notifier's reads and writes. Flush, never commit.

Two kinds are owed: an ended job's (a plain job: a sweep's members carry no URL), and a
sweep's, once every one of its members has ended. Each attempt is a ``notifications`` row
of the one or the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Select, bindparam, func, insert, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from ddpq.core.notify import Ended, MemberEnded, SweepEnded
from ddpq.core.states import TERMINAL
from ddpq.store.columns import flushed
from ddpq.store.models import Job, Notification, Sweep


@dataclass(frozen=True)
class Owed:
    """An ended job whose message is not settled yet, and how its attempts went so far."""

    job: Ended
    url: str
    attempts: int
    last_at: float | None


def owed(session: Session) -> list[Owed]:
    """Every ended job with a URL whose message is neither delivered nor given up (a
    sweep's member has none: its sweep's one message tells of it)."""
    tries = (
        select(
            Notification.job_id,
            func.count().label("n"),
            func.max(Notification.at).label("last"),
        )
        .group_by(Notification.job_id)
        .subquery()
    )
    rows = session.execute(
        select(
            Job.id,
            Job.name,
            Job.owner,
            Job.state,
            Job.exit_code,
            Job.reason,
            Job.progress,
            Job.notify_url,
            tries.c.n,
            tries.c.last,
        )
        .outerjoin(tries, tries.c.job_id == Job.id)
        .where(
            Job.notify_url.is_not(None),
            Job.notify_done_at.is_(None),
            Job.sweep_id.is_(None),
            Job.state.in_(list(TERMINAL)),
        )
        .order_by(Job.id)
    )
    return [
        Owed(
            Ended(r.id, r.name, r.owner, r.state, r.exit_code, r.reason, r.progress),
            r.notify_url,
            r.n or 0,
            r.last,
        )
        for r in rows
    ]


def record_attempt(
    session: Session,
    kind: Literal["job", "sweep"],
    owner_id: int,
    attempt: int,
    at: float,
    status: int | None,
    error: str,
    settled: bool,
) -> None:
    """One attempt's outcome for a job's message or a sweep's; ``settled`` (delivered, or
    the last one allowed) ends it."""
    table, of = (Job, {"job_id": owner_id}) if kind == "job" else (Sweep, {"sweep_id": owner_id})
    session.execute(
        insert(Notification).values(**of, attempt=attempt, at=at, status=status, error=error)
    )
    if settled:
        session.execute(
            update(table)
            .where(table.id == owner_id, table.notify_done_at.is_(None))
            .values(notify_done_at=at)
            .execution_options(synchronize_session=False)
        )


# ---- a sweep's one message -------------------------------------------------------------


@dataclass(frozen=True)
class OwedSweep:
    """A sweep all of whose members have ended and whose message is not settled yet.

    No members here: the notifier asks every second, and reads them (``sweep_ended``)
    only when an attempt is due.
    """

    sweep_id: int
    owner: str
    url: str
    attempts: int
    last_at: float | None


def owed_sweeps(session: Session) -> list[OwedSweep]:
    """Every sweep with a URL, its message neither delivered nor given up, and no member
    that has not ended (a sweep cancelled as a whole is one of them once its last running
    member has stopped)."""
    tries = (
        select(
            Notification.sweep_id,
            func.count().label("n"),
            func.max(Notification.at).label("last"),
        )
        .where(Notification.sweep_id.is_not(None))
        .group_by(Notification.sweep_id)
        .subquery()
    )
    unfinished = select(Job.id).where(Job.sweep_id == Sweep.id, Job.state.not_in(list(TERMINAL)))
    rows = session.execute(
        select(Sweep.id, Sweep.owner, Sweep.notify_url, tries.c.n, tries.c.last)
        .outerjoin(tries, tries.c.sweep_id == Sweep.id)
        .where(
            Sweep.notify_url.is_not(None),
            Sweep.notify_done_at.is_(None),
            ~unfinished.exists(),
        )
        .order_by(Sweep.id)
    )
    return [OwedSweep(r.id, r.owner, r.notify_url, r.n or 0, r.last) for r in rows]


def sweep_ended(session: Session, sweep_id: int) -> SweepEnded:
    """What the sweep's message tells: the sweep, and each member's final state and
    newest progress (cleaned when it was read from the job's folder)."""
    sweep = session.execute(
        select(Sweep.id, Sweep.name, Sweep.owner, Sweep.size).where(Sweep.id == sweep_id)
    ).one()
    members = session.execute(
        select(Job.id, Job.sweep_index, Job.sweep_params, Job.state, Job.progress)
        .where(Job.sweep_id == sweep_id)
        .order_by(Job.sweep_index, Job.id)
    )
    return SweepEnded(
        sweep.id,
        sweep.name,
        sweep.owner,
        sweep.size,
        [
            MemberEnded(m.id, m.sweep_index or 0, dict(m.sweep_params or {}), m.state, m.progress)
            for m in members
        ],
    )


@dataclass(frozen=True)
class Attempt:
    attempt: int
    at: float
    status: int | None
    error: str


def attempts_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Attempt]]:
    """Each job's attempts, in order."""
    return _attempts(session, _ATTEMPTS_OF_JOBS, job_ids)


def sweep_attempts_of(session: Session, sweep_ids: Iterable[int]) -> dict[int, list[Attempt]]:
    """Each sweep's attempts (of its one message), in order."""
    return _attempts(session, _ATTEMPTS_OF_SWEEPS, sweep_ids)


def _attempts_of(
    whose: InstrumentedAttribute[int | None],
) -> Select[int | None, int, float, int | None, str]:
    """The attempts of the jobs or sweeps whose ids are bound as ``ids``, built once each."""
    n = Notification
    return (
        select(whose, n.attempt, n.at, n.status, n.error)
        .where(whose.in_(bindparam("ids", expanding=True)))
        .order_by(whose, n.attempt)
    )


_ATTEMPTS_OF_JOBS = _attempts_of(Notification.job_id)
_ATTEMPTS_OF_SWEEPS = _attempts_of(Notification.sweep_id)


def _attempts(
    session: Session, statement: Select[int | None, int, float, int | None, str], ids: Iterable[int]
) -> dict[int, list[Attempt]]:
    rows = flushed(session).execute(statement, {"ids": list(ids)})
    out: dict[int, list[Attempt]] = {}
    for key, attempt, at, status, error in rows:
        if key is not None:  # never: the WHERE asked for these ids
            out.setdefault(key, []).append(Attempt(attempt, at, status, error))
    return out
