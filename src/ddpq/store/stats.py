"""Aggregates for the metrics endpoint. Read-only: nothing here flushes or commits.

Histograms are counted inside SQLite (one aggregate query each) so a scrape moves a handful of
numbers out of the database, not one row per job ever run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, SQLColumnExpression, and_, case, func, select, text
from sqlalchemy.orm import Session

from ddpq.core.states import TERMINAL, JobState
from ddpq.store import leases as lease_store
from ddpq.store.models import Attempt, DeviceSnapshot, Job, Lease


@dataclass(frozen=True)
class Distribution:
    """Cumulative counts of observations ``<= bound`` for each bound, plus count and sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    total: float


def jobs_by_state(session: Session) -> dict[JobState, int]:
    """Every state, including the ones no job is in (0), so a dashboard never sees a gap."""
    counts = dict.fromkeys(JobState, 0)
    for state, n in session.execute(select(Job.state, func.count()).group_by(Job.state)):
        counts[state] = n
    return counts


def gpus_by_status(session: Session) -> dict[str, int]:
    """The worker's device snapshot classified like ``GET /v1/devices``: leased wins over
    external (ddpq's own job is running there), shared (by memory) too, and the rest is
    free."""

    def held(kind: str) -> Any:
        return select(Lease.resource).where(Lease.kind == kind, Lease.released_at.is_(None))

    status = case(
        (DeviceSnapshot.index.in_(held(lease_store.GPU)), "leased"),
        (DeviceSnapshot.index.in_(held(lease_store.GPU_SHARE)), "shared"),
        (DeviceSnapshot.external.is_(True), "external"),
        else_="free",
    )
    counts = {"leased": 0, "shared": 0, "free": 0, "external": 0}
    for name, n in session.execute(select(status, func.count()).group_by(status)):
        counts[name] = n
    return counts


# How the attempt of a job whose shim vanished ends (``executors.base.LOST``): "lost: ...",
# or after a cancel or a time limit "...; lost: ...".
LOST_PREFIX = "lost:"

# For each GPU that processes ddpq did not start are using: the reason of the latest
# attempt that held it. Attempts are scanned newest first (by rowid), so this stops at
# the first one that used the GPU, not at the beginning of history.
_LOST_HOLDERS = text(
    """
    SELECT count(*) FROM devices d
    WHERE d.external AND (
        SELECT a.reason LIKE :lost OR a.reason LIKE :after_stop
        FROM attempts a
        WHERE a.ended_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM json_each(a.gpus) g WHERE g.value = d."index")
        ORDER BY a.id DESC LIMIT 1
    )
    """
)


def gpus_held_by_lost_jobs(session: Session) -> int:
    """GPUs that outside processes use and whose last ddpq job was lost (its shim vanished):
    most likely what the job left that even a kill could not end (a process stuck in the
    driver). Such a GPU is not handed out again (``--external-gpus avoid``) until someone
    looks."""
    params = {"lost": LOST_PREFIX + "%", "after_stop": f"%; {LOST_PREFIX}%"}
    return int(session.scalar(_LOST_HOLDERS, params) or 0)


def ports_leased(session: Session) -> int:
    query = select(func.count()).where(Lease.kind == lease_store.PORT, Lease.released_at.is_(None))
    return session.scalar(query) or 0


def oldest_queued_submit(session: Session) -> float | None:
    """When the longest-waiting queued job was submitted (None: nothing is queued)."""
    query = select(func.min(Job.submitted_at)).where(Job.state == JobState.QUEUED)
    return session.scalar(query)


def _distribution(
    session: Session, value: SQLColumnExpression[Any], base: Select[Any], bounds: Sequence[float]
) -> Distribution:
    columns = [func.count(), func.coalesce(func.sum(value), 0.0)]
    columns += [func.coalesce(func.sum(case((value <= b, 1), else_=0)), 0) for b in bounds]
    row = session.execute(base.with_only_columns(*columns)).one()
    return Distribution(
        bounds=tuple(bounds),
        cumulative=tuple(int(x) for x in row[2:]),
        count=int(row[0]),
        total=float(row[1]),
    )


def job_durations(session: Session, bounds: Sequence[float]) -> Distribution:
    """Run time of finished jobs (their last attempt: ``ended_at - started_at``).

    Jobs cancelled before they ever started have no run time and are left out. A finished job
    never changes again, so the counts only grow, as a Prometheus histogram's must.
    """
    value = Job.ended_at - Job.started_at
    base = select(Job.id).where(
        Job.state.in_(list(TERMINAL)),
        Job.started_at.is_not(None),
        Job.ended_at.is_not(None),
    )
    return _distribution(session, value, base, bounds)


def queue_waits(session: Session, bounds: Sequence[float]) -> Distribution:
    """Submission to first start, per job that has started at least once.

    Taken from attempt 1 rather than ``jobs.started_at``: that column is the latest attempt's
    start, so for a retried job it would add the failed attempts' run time to the "wait", and
    the observation would move between buckets (counts going down) on every retry.
    """
    value = Attempt.started_at - Job.submitted_at
    base = select(Job.id).join(Attempt, Attempt.job_id == Job.id).where(Attempt.number == 1)
    return _distribution(session, value, base, bounds)


def scheduling_latencies(session: Session, bounds: Sequence[float]) -> Distribution:
    """The worker's own measure (``jobs.sched_latency_s``): from the moment it could have
    placed a job (woken, or the job's submission if later) to the committed placement.
    The worker overwrites it on each attempt, so it is the latest placement's latency."""
    value = Job.sched_latency_s
    base = select(Job.id).where(Job.sched_latency_s.is_not(None))
    return _distribution(session, value, base, bounds)


def gpu_memory_by_gpu(session: Session) -> dict[int, tuple[int, int, int]]:
    """Per GPU of the device snapshot: (jobs sharing it, bytes they reserve there, the sum
    of the measured peaks of the jobs holding it, whole or shared)."""
    live_gpu = and_(Lease.released_at.is_(None), Lease.kind.in_(lease_store.GPU_KINDS))
    shared = {
        gpu: (n, int(reserved or 0))
        for gpu, n, reserved in session.execute(
            select(Lease.resource, func.count(), func.sum(Lease.mem_bytes))
            .where(live_gpu, Lease.kind == lease_store.GPU_SHARE)
            .group_by(Lease.resource)
        )
    }
    peaks = {
        gpu: total
        for gpu, total in session.execute(
            select(Lease.resource, func.sum(Attempt.peak_mem_bytes))
            .join(Job, Job.id == Lease.job_id)
            .join(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
            .where(live_gpu, Attempt.peak_mem_bytes.is_not(None))
            .group_by(Lease.resource)
        )
    }
    out = {}
    for (index,) in session.execute(select(DeviceSnapshot.index)):
        n, reserved = shared.get(index, (0, 0))
        out[index] = (n, reserved, int(peaks.get(index) or 0))
    return out


def attempt_peaks(session: Session, bounds: Sequence[float]) -> Distribution:
    """Ended attempts' measured peak GPU memory (bytes, on any one of their GPUs)."""
    value = Attempt.peak_mem_bytes
    base = select(Attempt.id).where(Attempt.ended_at.is_not(None), value.is_not(None))
    return _distribution(session, value, base, bounds)


def reservation_use(session: Session, bounds: Sequence[float]) -> Distribution:
    """Ended attempts that shared GPUs: their measured peak over what they reserved (over 1:
    they used more than they asked for; well under: they reserved memory nobody used)."""
    value = Attempt.peak_mem_bytes * 1.0 / Attempt.gpu_mem_bytes
    base = select(Attempt.id).where(
        Attempt.ended_at.is_not(None),
        Attempt.peak_mem_bytes.is_not(None),
        Attempt.gpu_mem_bytes.is_not(None),
    )
    return _distribution(session, value, base, bounds)
