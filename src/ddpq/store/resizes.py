"""Elastic jobs' resizes (``core.scheduler.elastic``): asking a running one to checkpoint
and come back on another size, and the line its history keeps once it has."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from ddpq.core.states import JobState
from ddpq.store import transitions
from ddpq.store.attempts import request_preemptions
from ddpq.store.models import Attempt, Job

_jobs = cast(Table, Job.__table__)
_attempts = cast(Table, Attempt.__table__)


def request_resizes(session: Session, wanted: Mapping[int, tuple[int, str]]) -> list[int]:
    """Ask running jobs to checkpoint and go, to come back at once on a new size: job id
    -> (its next attempt's GPUs, why). Its preemption signal does it (the job is requeued
    as preempted, ``resize_to`` placing it first). Jobs already being stopped are left
    alone; the ones asked are returned."""
    why = {job_id: reason for job_id, (_, reason) in wanted.items()}
    sizes = {job_id: size for job_id, (size, _) in wanted.items()}
    return request_preemptions(session, why, resize_to=sizes)


def any_elastic_running(session: Session) -> bool:
    """Whether an elastic job runs (over ``ix_jobs_state``: the running jobs only)."""
    query = select(_jobs.c.id).where(
        _jobs.c.state == JobState.RUNNING, _jobs.c.gpus_max.is_not(None)
    )
    return session.execute(query.limit(1)).first() is not None


def note_resized(session: Session, started: Mapping[int, int], now: float) -> None:
    """Say in the history of each job in ``started`` (job id -> its new attempt's GPUs,
    leased now after a resize) whether it grew or shrank, against its attempt before."""
    if not started:
        return
    rows = session.execute(
        select(_attempts.c.job_id, _attempts.c.number, _attempts.c.gpus)
        .where(_attempts.c.job_id.in_(list(started)))
        .order_by(_attempts.c.job_id, _attempts.c.number)
    )
    sizes: dict[int, list[int]] = {}
    for job_id, _, gpus in rows:
        sizes.setdefault(job_id, []).append(len(gpus or []))
    for job_id, size in started.items():
        before = sizes.get(job_id, [])[-2:-1]  # the attempt before the one just leased
        if not before or before[0] == size:
            continue
        how = "grown" if size > before[0] else "shrunk"
        transitions.note(session, job_id, JobState.STARTING, f"{how} to {size} GPUs", now)
