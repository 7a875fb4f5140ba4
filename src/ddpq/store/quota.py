"""Running jobs' folders, as the disk watch measures them, and the stop of one over the
per-job limit (``stop_request = "quota"``), which the worker's stop phase then sends like
any other. Flush, never commit: the caller owns the transaction.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from ddpq.core.rules import StopRequest
from ddpq.core.states import JobState
from ddpq.store.idle import request_stop
from ddpq.store.models import Job

_jobs = cast(Table, Job.__table__)


def running_folders(session: Session) -> dict[int, tuple[str, int]]:
    """Each running job that is not being stopped already: its folder and its attempt
    (which names its cgroup)."""
    rows = session.execute(
        select(Job.id, Job.job_dir, Job.attempt).where(
            Job.state == JobState.RUNNING, Job.stop_request.is_(None), Job.job_dir.is_not(None)
        )
    )
    return {job_id: (job_dir, attempt) for job_id, job_dir, attempt in rows if job_dir is not None}


def request_quota_stop(session: Session, job_id: int, reason: str, now: float) -> bool:
    """Ask for a running job to be stopped for what its folder holds; False if it is not
    running or is being stopped already (a cancel came first)."""
    return request_stop(session, job_id, StopRequest.QUOTA, reason, now)
