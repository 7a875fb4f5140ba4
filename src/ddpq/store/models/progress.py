"""The newest progress records of each job (migration 0023p), kept few per job by
``store.progress``: a job's own rate is measured over them (``srpt-progress`` and the
predicted starts, ``core.scheduler.policy_progress``)."""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer
from sqlalchemy.orm import Mapped, mapped_column

from ddpq.store.models.base import Base


class ProgressSample(Base):
    __tablename__ = "progress_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)  # the daemon's clock when it was read
    done: Mapped[float] = mapped_column(Float)  # of ``total``: steps, or a fraction of 1
    total: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_progress_samples_job", "job_id", "id"),)
