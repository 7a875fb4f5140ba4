"""GPU and port leases. The partial unique index on live rows is the real guard."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.orm import Session

from ddpq.store.models import Lease

GPU = "gpu"
PORT = "port"


@dataclass(frozen=True)
class LiveLease:
    job_id: int
    kind: str
    resource: int
    acquired_at: float


def acquire(
    session: Session, job_id: int, gpus: Sequence[int], port: int | None, now: float
) -> None:
    acquire_many(session, [(job_id, gpus, port)], now)


def acquire_many(
    session: Session, wanted: Sequence[tuple[int, Sequence[int], int | None]], now: float
) -> None:
    """Insert the leases of several jobs: ``(job_id, GPUs, port)`` each, in one statement.

    An IntegrityError here means a double lease (the partial unique index): the caller's
    transaction must be rolled back.
    """
    rows = [
        {"job_id": job_id, "kind": GPU, "resource": gpu, "acquired_at": now}
        for job_id, gpus, _ in wanted
        for gpu in gpus
    ]
    rows += [
        {"job_id": job_id, "kind": PORT, "resource": port, "acquired_at": now}
        for job_id, _, port in wanted
        if port is not None
    ]
    if rows:
        session.connection().execute(insert(cast(Table, Lease.__table__)), rows)


def release(session: Session, job_id: int, now: float) -> None:
    session.execute(
        update(Lease)
        .where(Lease.job_id == job_id, Lease.released_at.is_(None))
        .values(released_at=now)
        .execution_options(synchronize_session=False)
    )


def live(session: Session, job_ids: Iterable[int] | None = None) -> list[LiveLease]:
    """Unreleased leases (of ``job_ids``, if given), as columns: read on every pass."""
    table = cast(Table, Lease.__table__).c
    query = select(table.job_id, table.kind, table.resource, table.acquired_at).where(
        table.released_at.is_(None)
    )
    if job_ids is not None:
        query = query.where(table.job_id.in_(list(job_ids)))
    rows = session.connection().execute(query.order_by(table.job_id, table.kind, table.resource))
    return [LiveLease(*row) for row in rows]


def by_job(leases: Iterable[LiveLease]) -> dict[int, tuple[list[int], int | None]]:
    """job id -> (GPU indices, port)."""
    out: dict[int, tuple[list[int], int | None]] = {}
    for lease in leases:
        gpus, port = out.get(lease.job_id, ([], None))
        if lease.kind == GPU:
            gpus.append(lease.resource)
        else:
            port = lease.resource
        out[lease.job_id] = (gpus, port)
    return out


def last_port(session: Session) -> int | None:
    """The most recently leased port, so allocation can rotate instead of reusing at once."""
    return session.scalar(
        select(Lease.resource).where(Lease.kind == PORT).order_by(Lease.id.desc()).limit(1)
    )
