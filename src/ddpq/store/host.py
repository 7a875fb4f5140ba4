"""What running jobs hold of the host's memory (``core.hostres``): the sum of their
current attempts' ``ram_bytes``. Their CPU core slots are leases (``store.leases``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.orm import Session

from ddpq.core.states import ACTIVE
from ddpq.store.columns import flushed
from ddpq.store.models import Attempt, Job, Lease


def ram_held(session: Session) -> int:
    """Bytes of host memory the jobs that hold leases hold now."""
    return int(flushed(session).execute(_RAM_HELD).scalar() or 0)


_RAM_HELD = (  # built once: read at every pass
    select(func.sum(Attempt.ram_bytes))
    .join(Job, and_(Job.id == Attempt.job_id, Job.attempt == Attempt.number))
    .where(Job.state.in_(list(ACTIVE)))
)


def slots_held(session: Session) -> int:
    """CPU core slots leased now."""
    return int(
        session.scalar(select(func.count()).where(Lease.kind == "cpu", Lease.released_at.is_(None)))
        or 0
    )


# Built once, the ids bound at each read (every page of a listing, every job's detail).
_HELD = (
    select(Attempt.job_id, Attempt.cores, Attempt.ram_bytes)
    .join(Job, and_(Job.id == Attempt.job_id, Job.attempt == Attempt.number))
    .where(Job.id.in_(bindparam("ids", expanding=True)), Job.state.in_(list(ACTIVE)))
)


def held_by(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[list[int], int | None]]:
    """job id -> (the CPUs its current attempt is confined to, the memory it holds), for
    those of ``job_ids`` that hold leases now."""
    if not job_ids:
        return {}
    rows = flushed(session).execute(_HELD, {"ids": list(job_ids)})
    return {job_id: (list(cores or []), ram) for job_id, cores, ram in rows}
