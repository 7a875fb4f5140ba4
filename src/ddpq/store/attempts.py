"""The worker's writes over an attempt's life: leased, running, stopped. How it ended is
recorded by ``store.endings``; every state change is written by ``store.transitions``.

The API's writes are in ``store.jobs``. These run for every job on the worker's hot path,
so they are Core statements on columns, not ORM objects: a stream of short jobs is decided
by how few statements each one costs. Flush, never commit: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from ddpq.core.disposition import lease_text
from ddpq.core.rules import StopRequest
from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, JobState
from ddpq.core.units import size_for_people
from ddpq.store import leases as lease_store
from ddpq.store import progress as progress_store
from ddpq.store import transitions
from ddpq.store.batches import batches
from ddpq.store.gpu_time import gpu_seconds
from ddpq.store.models import (
    SPEC_COLUMNS,
    Attempt,
    Job,
    JobDependency,
    SweepDependency,
    spec_of,
)
from ddpq.store.models.job import DEPENDENCY_FIELDS
from ddpq.store.transitions import Change

_jobs = cast(Table, Job.__table__)
_attempts = cast(Table, Attempt.__table__)
_OPEN_ATTEMPTS = insert(_attempts)  # built once: every pass that starts jobs opens attempts
_deps = cast(Table, JobDependency.__table__)
_sweep_deps = cast(Table, SweepDependency.__table__)


# ---- leased: queued -> starting ---------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A planned start: the job, its GPUs and port, where its folder is."""

    job_id: int
    gpus: tuple[int, ...]
    port: int | None
    job_dir: str
    sched_latency_s: float
    mem_bytes: int | None = None  # sharing: what it reserves on each GPU
    share_cap: int | None = None
    slots: tuple[int, ...] = ()  # the CPU core slots it leases (core.hostres)
    cores: tuple[int, ...] = ()  # the host's CPUs those slots are (its cpuset)
    ram_bytes: int | None = None  # the host memory it holds and is limited to

    @property
    def lease(self) -> tuple[tuple[int, ...], int | None, str]:
        return self.gpus, self.port, self.job_dir


@dataclass(frozen=True)
class Leased:
    """A job that has just been leased its resources: what it asked for, and what it got."""

    job_id: int
    attempt: int
    spec: JobSpec  # read back from its row (``models.spec_of``)
    gpus: tuple[int, ...]
    port: int | None
    job_dir: str
    reserved_mem_bytes: int | None = None  # sharing: what it reserved on each GPU
    cores: tuple[int, ...] = ()  # the host's CPUs it is confined to (): not confined
    ram_bytes: int | None = None  # the host memory it may use (None: no limit)


# Built once, for the worker's hot path: the leased jobs' rows (their specs, and which
# attempt this is) and what they waited for (their specs' dependency fields, by kind).
_IDS: BindParameter[int] = bindparam("ids", expanding=True)
_LEASED_ROWS = select(
    _jobs.c.id, _jobs.c.attempt, *(_jobs.c[column] for column in SPEC_COLUMNS.values())
).where(_jobs.c.id.in_(_IDS), _jobs.c.state == JobState.QUEUED)
_WAITED_FOR = union_all(
    select(
        _deps.c.job_id,
        _deps.c.depends_on.label("waits_on"),
        _deps.c.kind,
        literal(False).label("sweep"),
    ).where(_deps.c.job_id.in_(_IDS)),
    select(_sweep_deps.c.job_id, _sweep_deps.c.sweep_id, _sweep_deps.c.kind, literal(True)).where(
        _sweep_deps.c.job_id.in_(_IDS)
    ),
).order_by("waits_on")


# What a job's row forgets of its previous attempt when it is leased the next one.
_FRESH_ATTEMPT: dict[str, Any] = dict.fromkeys(
    (
        "ended_at",
        "exit_code",
        "exit_signal",
        "stop_request",
        "stop_sent_at",
        "not_before",
        "idle_since",
        "idle_warned_at",
        "resize_to",  # an elastic job's resize is done once it is leased its new size
    )
)


def _leased_why(p: Placed) -> str:
    why = f"leased {lease_text(p.gpus, p.port)}"
    if p.mem_bytes is not None:
        why += f", sharing them: {size_for_people(p.mem_bytes)} reserved on each"
    if p.slots:
        why += f", {len(p.slots)} CPU core{'' if len(p.slots) == 1 else 's'}"
    if p.ram_bytes is not None:
        why += f", {size_for_people(p.ram_bytes)} of memory"
    return why


def lease_and_start(session: Session, placed: Sequence[Placed], now: float) -> list[Leased]:
    """Lease each job its GPUs and port, open its next attempt, move it to ``starting``.

    The partial unique index on live leases refuses a double lease whatever the planner
    said (IntegrityError: the caller's transaction is rolled back whole).
    """
    if not placed:
        return []
    by_id = {p.job_id: p for p in placed}
    conn = session.connection()
    rows = conn.execute(_LEASED_ROWS, {"ids": list(by_id)}).all()
    lease_store.acquire_many(
        session,
        [
            lease_store.Wanted(p.job_id, p.gpus, p.port, p.mem_bytes, p.share_cap, p.slots)
            for p in placed
        ],
        now,
    )
    waited: dict[int, dict[str, list[int]]] = {row.id: {} for row in rows}
    if waited:
        for job_id, on, kind, sweep in conn.execute(_WAITED_FOR, {"ids": list(waited)}):
            field = DEPENDENCY_FIELDS[(kind, bool(sweep))]
            waited[job_id].setdefault(field, []).append(on)
    out = [
        Leased(
            row.id,
            row.attempt + 1,
            spec_of(row, **waited[row.id]),
            by_id[row.id].gpus,
            by_id[row.id].port,
            by_id[row.id].job_dir,
            by_id[row.id].mem_bytes,
            by_id[row.id].cores,
            by_id[row.id].ram_bytes,
        )
        for row in rows
    ]
    _write_starts(session, [(job, by_id[job.job_id]) for job in out], now)
    return out


def _write_starts(session: Session, started: Sequence[tuple[Leased, Placed]], now: float) -> None:
    """The rows of ``lease_and_start``: each job starting (``store.transitions``), its
    attempt."""
    if not started:
        return
    moves, attempt_rows = [], []
    for job, p in started:
        own = {"attempt": job.attempt, "job_dir": p.job_dir, "sched_latency_s": p.sched_latency_s}
        moves.append(Change(job.job_id, JobState.QUEUED, JobState.STARTING, _leased_why(p), own))
        attempt_rows.append(
            {
                "job_id": job.job_id,
                "number": job.attempt,
                "gpus": list(p.gpus),
                "port": p.port,
                "started_at": now,
                "reason": "",
                "gpu_mem_bytes": p.mem_bytes,
                "cores": list(p.cores) or None,
                "ram_bytes": p.ram_bytes,
            }
        )
    transitions.move_many(session, moves, now, **_FRESH_ATTEMPT, started_at=now)
    session.connection().execute(_OPEN_ATTEMPTS, attempt_rows)


# ---- running: the executor took it ------------------------------------------------


def mark_running(
    session: Session, job_id: int, executor: str, handle: str, reason: str, now: float
) -> bool:
    """starting -> running, with the executor's handle on the attempt; False if the job
    was not starting (cancelled meanwhile, say: then nothing is written)."""
    if not transitions.move(session, job_id, JobState.STARTING, JobState.RUNNING, reason, now):
        return False
    set_handle(session, job_id, executor, handle)
    return True


def mark_running_many(
    session: Session, started: Sequence[tuple[int, str]], executor: str, reason: str, now: float
) -> None:
    """``mark_running`` for a whole pass's launches, in three statements: ``started`` holds
    (job id, handle) pairs of jobs this worker has just moved to starting."""
    if not started:
        return
    ids = [job_id for job_id, _ in started]
    changes = [Change(i, JobState.STARTING, JobState.RUNNING, reason) for i in ids]
    moved = transitions.move_many(session, changes, now)
    if len(moved) != len(ids):  # nothing else moves a starting job: a bug, say so
        raise RuntimeError(f"of jobs {ids}, only {moved} were still starting")
    rows = [{"b_id": i, "h": h, "b_executor": executor} for i, h in started]
    session.connection().execute(_SET_HANDLES, rows)


# Built once: every pass that starts jobs writes their handles.
_SET_HANDLES = (
    update(_attempts)
    .where(
        _attempts.c.job_id == bindparam("b_id"),
        _attempts.c.number
        == select(_jobs.c.attempt).where(_jobs.c.id == bindparam("b_id")).scalar_subquery(),
    )
    .values(executor=bindparam("b_executor"), handle=bindparam("h"))
)


def set_handle(session: Session, job_id: int, executor: str, handle: str) -> None:
    """Record how the executor finds the job's current attempt again (after a restart)."""
    current = select(_jobs.c.attempt).where(_jobs.c.id == job_id).scalar_subquery()
    session.connection().execute(
        update(_attempts)
        .where(_attempts.c.job_id == job_id, _attempts.c.number == current)
        .values(executor=executor, handle=handle)
    )


@dataclass(frozen=True)
class ActiveAttempt:
    """A job that holds leases, with what the executor stored for its attempt."""

    job_id: int
    state: JobState
    attempt: int
    job_dir: str | None
    executor: str | None
    handle: str | None


def active_attempts(session: Session) -> list[ActiveAttempt]:
    rows = session.execute(
        select(Job.id, Job.state, Job.attempt, Job.job_dir, Attempt.executor, Attempt.handle)
        .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.number == Job.attempt))
        .where(Job.state.in_(list(ACTIVE)))
        .order_by(Job.id)
    )
    return [ActiveAttempt(*row) for row in rows]


# ---- stops and progress -------------------------------------------------------------


def mark_stop_sent(session: Session, job_id: int, why: StopRequest, now: float) -> bool:
    """Note that the worker is stopping a running job (keeping a stop already asked for);
    False if it is not running any more or a stop was sent already."""
    result = session.connection().execute(
        update(_jobs)
        .where(
            _jobs.c.id == job_id,
            _jobs.c.state == JobState.RUNNING,
            _jobs.c.stop_sent_at.is_(None),
        )
        .values(stop_request=func.coalesce(_jobs.c.stop_request, why.value), stop_sent_at=now)
    )
    return bool(result.rowcount == 1)


def request_preemptions(
    session: Session, wanted: Mapping[int, str], resize_to: Mapping[int, int] | None = None
) -> list[int]:
    """Ask running jobs to checkpoint and go (the policy's choice): job id -> who it makes
    room for; an elastic job's size when it comes back, for those in ``resize_to``
    (``store.resizes``). Jobs already being stopped are left alone; the ones asked are
    returned."""
    asked = []
    conn = session.connection()
    for job_id, why in wanted.items():
        # None for a plain preemption: what a running job's resize_to is anyway (cleared
        # when it was leased).
        size = (resize_to or {}).get(job_id)
        result = conn.execute(
            update(_jobs)
            .where(
                _jobs.c.id == job_id,
                _jobs.c.state == JobState.RUNNING,
                _jobs.c.preemptible.is_(True),
                _jobs.c.stop_request.is_(None),
            )
            .values(stop_request=StopRequest.PREEMPT.value, stop_reason=why, resize_to=size)
        )
        if result.rowcount == 1:
            asked.append(job_id)
    return asked


def attained(session: Session, job_ids: Iterable[int], now: float) -> dict[int, float]:
    """GPU-seconds each job has held over all its attempts (a running one's up to ``now``):
    the service the LAS policy ranks by."""
    held = gpu_seconds(now)
    out: dict[int, float] = {}
    for batch in batches(job_ids):
        rows = session.execute(
            select(Attempt.job_id, func.sum(held))
            .where(Attempt.job_id.in_(batch))
            .group_by(Attempt.job_id)
        )
        out.update({job_id: float(total or 0.0) for job_id, total in rows})
    return out


def request_stop_all(session: Session, why: StopRequest) -> None:
    """Ask for every active job to be stopped (``ddpq serve --stop-jobs`` on shutdown)."""
    session.connection().execute(
        update(_jobs)
        .where(_jobs.c.state.in_(list(ACTIVE)), _jobs.c.stop_request.is_(None))
        .values(stop_request=why.value)
    )


def record_progress(
    session: Session, progress: Mapping[int, dict[str, Any]], now: float | None = None
) -> None:
    """The newest progress of running jobs (no event: it changes every few seconds); with
    ``now``, also kept as a sample their rate is measured from (``store.progress``)."""
    if progress and now is not None:
        progress_store.record_samples(session, progress, now)
    if progress:
        # Not state IN (...): an expanding IN cannot be part of an executemany, and this
        # is one for all the jobs whose progress changed (an OR of the states can).
        active = or_(*(_jobs.c.state == state for state in sorted(ACTIVE)))
        session.connection().execute(
            update(_jobs)
            .where(_jobs.c.id == bindparam("job_id"), active)
            .values(progress=bindparam("p")),
            [{"job_id": i, "p": p} for i, p in progress.items()],
        )
