"""Notifications owed and delivered: the notifier's reads and writes. Flush, never commit."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from ddpq.core.notify import Ended
from ddpq.core.states import TERMINAL
from ddpq.store.models import Job, Notification


@dataclass(frozen=True)
class Owed:
    """An ended job whose message is not settled yet, and how its attempts went so far."""

    job: Ended
    url: str
    attempts: int
    last_at: float | None


def owed(session: Session) -> list[Owed]:
    """Every ended job with a URL whose message is neither delivered nor given up."""
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
    job_id: int,
    attempt: int,
    at: float,
    status: int | None,
    error: str,
    settled: bool,
) -> None:
    """One attempt's outcome; ``settled`` (delivered, or the last one allowed) ends it."""
    session.execute(
        insert(Notification).values(
            job_id=job_id, attempt=attempt, at=at, status=status, error=error
        )
    )
    if settled:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.notify_done_at.is_(None))
            .values(notify_done_at=at)
            .execution_options(synchronize_session=False)
        )


@dataclass(frozen=True)
class Attempt:
    attempt: int
    at: float
    status: int | None
    error: str


def attempts_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Attempt]]:
    rows = session.execute(
        select(Notification)
        .where(Notification.job_id.in_(list(job_ids)))
        .order_by(Notification.job_id, Notification.attempt)
    ).scalars()
    out: dict[int, list[Attempt]] = {}
    for n in rows:
        out.setdefault(n.job_id, []).append(Attempt(n.attempt, n.at, n.status, n.error))
    return out
