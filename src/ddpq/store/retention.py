"""Retention's reads and writes: which jobs are finished and since when, deleting finished
jobs' rows, and the counters of what was removed. Flush, never commit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from ddpq.core.states import TERMINAL, JobState
from ddpq.store.models import Job, RetentionPass, RetentionTotal

# The kinds of removal counted (``retention_totals.what``).
CHECKPOINTS, LOGS, ROWS = "checkpoints", "logs", "rows"
KINDS = (CHECKPOINTS, LOGS, ROWS)
# SQLite binds at most 32766 parameters a statement; far fewer keep each one short.
_CHUNK = 500


@dataclass(frozen=True)
class JobRow:
    job_id: int
    state: JobState
    finished_at: float | None  # None unless the job is finished
    owner: str = ""


def _finished_at() -> ColumnElement[Any]:
    # A job cancelled while queued has an end too; the submission stands in if it has none.
    return func.coalesce(Job.ended_at, Job.submitted_at)


def jobs_by_id(session: Session, ids: Iterable[int]) -> dict[int, JobRow]:
    """Each of these jobs that has a row: its state, when it finished if it did, whose."""
    wanted = sorted(set(ids))
    out: dict[int, JobRow] = {}
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        rows = session.execute(
            select(Job.id, Job.state, _finished_at(), Job.owner).where(Job.id.in_(chunk))
        )
        for job_id, state, finished, owner in rows:
            out[job_id] = JobRow(job_id, state, finished if state in TERMINAL else None, owner)
    return out


def finished_before(session: Session, cutoff: float, limit: int) -> list[JobRow]:
    """Finished jobs that ended at ``cutoff`` or before, oldest first, at most ``limit``."""
    finished = _finished_at()
    rows = session.execute(
        select(Job.id, Job.state, finished, Job.owner)
        .where(Job.state.in_(list(TERMINAL)), finished <= cutoff)
        .order_by(finished, Job.id)
        .limit(limit)
    )
    return [JobRow(job_id, state, at, owner) for job_id, state, at, owner in rows]


def newest_job_id(session: Session) -> int | None:
    return session.scalar(select(func.max(Job.id)))


def delete_finished(session: Session, ids: Iterable[int]) -> int:
    """Delete these jobs' rows (their events, attempts, leases and dependencies go with
    them: ON DELETE CASCADE), but only those that are finished, whatever the caller
    believed. Returns how many went."""
    wanted = sorted(set(ids))
    gone = 0
    for start in range(0, len(wanted), _CHUNK):
        result = session.execute(
            delete(Job).where(
                Job.id.in_(wanted[start : start + _CHUNK]), Job.state.in_(list(TERMINAL))
            )
        )
        gone += result.rowcount  # type: ignore[attr-defined]
    return gone


def add_removed(session: Session, counts: Mapping[str, tuple[int, int]]) -> None:
    """Add ``{kind: (jobs, bytes)}`` to the counters."""
    for kind, (jobs, size) in counts.items():
        if kind not in KINDS:
            raise ValueError(f"unknown kind of removal {kind!r}")
        if not (jobs or size):
            continue
        statement = insert(RetentionTotal).values(what=kind, jobs=jobs, bytes=size)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[RetentionTotal.what],
                set_={
                    "jobs": RetentionTotal.jobs + jobs,
                    "bytes": RetentionTotal.bytes + size,
                },
            )
        )


def removed_totals(session: Session) -> dict[str, tuple[int, int]]:
    """Every kind, 0 where nothing was ever removed: ``{kind: (jobs, bytes)}``."""
    totals = dict.fromkeys(KINDS, (0, 0))
    for kind, jobs, size in session.execute(
        select(RetentionTotal.what, RetentionTotal.jobs, RetentionTotal.bytes)
    ):
        totals[kind] = (jobs, size)
    return totals


def record_pass(session: Session, at: float, folder_bytes: int) -> None:
    statement = insert(RetentionPass).values(id=1, at=at, folder_bytes=folder_bytes)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[RetentionPass.id], set_={"at": at, "folder_bytes": folder_bytes}
        )
    )


def last_pass(session: Session) -> tuple[float, int] | None:
    """When the janitor last looked, and what all job folders held then (None: never)."""
    row = session.execute(select(RetentionPass.at, RetentionPass.folder_bytes)).first()
    return None if row is None else (row[0], row[1])
