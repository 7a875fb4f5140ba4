"""What jobs' processes were measured to hold on their GPUs: each attempt's peak, and the
history an ``auto`` reservation is learned from. Flush, never commit.

``attempts.peak_mem_bytes`` is the most the attempt's processes held on any one of its GPUs
at one NVML sample (bytes; NULL: never sampled); ``attempts.gpu_mem_bytes`` what it
reserved on each GPU (NULL: its GPUs were whole). Both are per GPU, like a reservation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from sqlalchemy import Table, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from ddpq.core.states import JobState
from ddpq.store.columns import flushed
from ddpq.store.models import Attempt, Job

_attempts = cast(Table, Attempt.__table__)
_jobs = cast(Table, Job.__table__)
# How far back the history of one job is read for ``auto``: enough failed attempts to
# reach the last success, not a year of them.
HISTORY = 50


def mem_key(name: str | None, command: Sequence[str]) -> str:
    """Which jobs count as the same job for ``--gpu-mem auto``: the same name, where the
    submitter gave one; else the same command (a name derived from the program, such as
    "python", says little)."""
    if name:
        return f"name:{name}"[:80]
    digest = hashlib.sha256(json.dumps(list(command)).encode()).hexdigest()
    return f"cmd:{digest[:64]}"


def record_peaks(session: Session, peaks: Mapping[int, int]) -> None:
    """Raise the running attempts' peaks to these samples (job id -> bytes) where higher."""
    if not peaks:
        return
    current = select(_jobs.c.attempt).where(_jobs.c.id == bindparam("j")).scalar_subquery()
    session.connection().execute(
        update(_attempts)
        .where(
            _attempts.c.job_id == bindparam("j"),
            _attempts.c.number == current,
            _attempts.c.ended_at.is_(None),
        )
        .values(
            peak_mem_bytes=func.max(func.coalesce(_attempts.c.peak_mem_bytes, 0), bindparam("p"))
        ),
        [{"j": job_id, "p": peak} for job_id, peak in peaks.items()],
    )


def measured_for(session: Session, job_ids: Iterable[int]) -> dict[int, list[int] | None]:
    """For each job, the peaks ``core.sharing.auto_reservation`` learns from: those of the
    last successful attempt of the same job (same owner and ``mem_key``) and of every
    attempt of it that ended since; None where no attempt of it succeeded (recently)."""
    ids = list(job_ids)
    if not ids:
        return {}
    keys = {
        job_id: (owner, mem)
        for job_id, owner, mem in session.execute(
            select(Job.id, Job.owner, Job.mem_key).where(Job.id.in_(ids))
        )
    }
    history: dict[tuple[str, str | None], list[int] | None] = {}
    for key in set(keys.values()):
        owner, mem = key
        if mem is None:
            history[key] = None
            continue
        rows = session.execute(
            select(Attempt.state, Attempt.peak_mem_bytes)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.owner == owner, Job.mem_key == mem, Attempt.ended_at.is_not(None))
            .order_by(Attempt.ended_at.desc(), Attempt.id.desc())
            .limit(HISTORY)
        )
        seen: list[int] = []
        found = None
        for state, peak in rows:
            if peak is not None:
                seen.append(int(peak))
            if state is JobState.SUCCEEDED:
                found = seen
                break
        history[key] = found or None
    return {job_id: history[key] for job_id, key in keys.items()}


def latest_peaks(session: Session, job_ids: Iterable[int]) -> dict[int, int]:
    """Each job's latest attempt's peak (for listings: one query for a page of jobs)."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows = flushed(session).execute(_LATEST_PEAKS, {"ids": ids})
    return {job_id: int(peak) for job_id, peak in rows if peak is not None}


# Built once, the ids bound at each read (every page of a listing, every job's detail).
_LATEST_PEAKS = (
    select(Attempt.job_id, Attempt.peak_mem_bytes)
    .join(Job, and_(Job.id == Attempt.job_id, Job.attempt == Attempt.number))
    .where(
        Attempt.job_id.in_(bindparam("ids", expanding=True)), Attempt.peak_mem_bytes.is_not(None)
    )
)
