"""What running jobs hold of the host's memory (``core.hostres``): the sum of their
current attempts' ``ram_bytes``. Their CPU core slots are leases (``store.leases``)."""

from __future__ import annotations

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from ddpq.core.states import ACTIVE
from ddpq.store.models import Attempt, Job


def ram_held(session: Session) -> int:
    """Bytes of host memory the jobs that hold leases hold now."""
    total = session.scalar(
        select(func.sum(Attempt.ram_bytes))
        .join(Job, and_(Job.id == Attempt.job_id, Job.attempt == Attempt.number))
        .where(Job.state.in_(list(ACTIVE)))
    )
    return int(total or 0)
