"""Jobs, their state history and attempts. Flush, never commit: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Integer, Table, bindparam, func, insert, select, text, update
from sqlalchemy.orm import Session, defer

from ddpq.core.hostres import NO_DEFAULTS, HostDefaults, cores_wanted, ram_wanted
from ddpq.core.rules import Run, StopRequest
from ddpq.core.scheduler import QueuedJob, needs_port
from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, TERMINAL, JobState
from ddpq.store import settling, transitions
from ddpq.store.columns import flushed
from ddpq.store.dependencies import (
    checked_standings,
    dependency_rows,
    dependency_states,
    fields_of_many,
    waiting_of_many,
)
from ddpq.store.models import (
    PLAN_SHAPE_INDEX,
    UNPLANNED,
    Attempt,
    Job,
    JobDependency,
    JobEvent,
    SweepDependency,
    new_row,
    written,
)


class UnknownJob(LookupError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


_jobs = cast(Table, Job.__table__)
# Built once: a submission's statements are the same each time, only their values change.
_INSERT_JOB = insert(_jobs)
_INSERT_DEPENDENCY = insert(cast(Table, JobDependency.__table__))
_INSERT_SWEEP_DEPENDENCY = insert(cast(Table, SweepDependency.__table__))


def create_job(session: Session, spec: JobSpec, now: float) -> Job:
    """Insert a job: queued, held (dependency, hold) or cancelled (a dependency failed).

    Returns the job as written, detached from the session (a snapshot: change it through
    the store's functions). Core inserts of prepared statements: every submission comes
    through here, and the ORM's unit of work would cost more than the rest of the request.
    """
    on_jobs, on_sweeps = dependency_rows(spec)
    check_known(session, on_jobs, on_sweeps)
    conn = session.connection()
    values = new_row(spec, JobState.QUEUED, "", now)
    key = conn.execute(_INSERT_JOB, values).inserted_primary_key
    assert key is not None
    job_id = int(key[0])
    if on_jobs:
        conn.execute(_INSERT_DEPENDENCY, [{"job_id": job_id, **d} for d in on_jobs])
    if on_sweeps:
        conn.execute(_INSERT_SWEEP_DEPENDENCY, [{"job_id": job_id, **d} for d in on_sweeps])
    transitions.submitted(session, [job_id], now)
    if not (on_jobs or on_sweeps or spec.hold or spec.singleton):
        # Queued as it is: the row just written, without reading it back.
        return written(job_id, values)
    job = get_job(session, job_id)
    settling.settle_waiting(session, job, waiting_of_many(session, [job_id])[job_id], now)
    session.flush()
    session.expunge(job)
    return job


def check_known(
    session: Session, on_jobs: Sequence[Mapping[str, Any]], on_sweeps: Sequence[Mapping[str, Any]]
) -> None:
    """UnknownJob or UnknownSweep for the first job or sweep waited on that is not there."""
    wanted = sorted({d["depends_on"] for d in on_jobs})
    missing = sorted(set(wanted) - set(dependency_states(session, wanted)))
    if missing:
        raise UnknownJob(missing[0])
    checked_standings(session, sorted({d["sweep_id"] for d in on_sweeps}))


def get_job(session: Session, job_id: int, *, env: bool = True) -> Job:
    """``env=False``: without the environment (a CLI job carries its submitter's, up to 256
    KiB), for a read that shows the job: reading ``job.env`` then raises."""
    job = session.get(Job, job_id, options=() if env else _WITHOUT_ENV)
    if job is None:
        raise UnknownJob(job_id)
    return job


_WITHOUT_ENV = (defer(Job.env, raiseload=True),)


def spec_of(session: Session, job: Job) -> JobSpec:
    """What ``job`` was submitted with (its row's spec, and its dependencies)."""
    return job.spec(**fields_of_many(session, [job.id]).get(job.id, {}))


def list_jobs(
    session: Session,
    *,
    states: Sequence[JobState] = (),
    owner: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Job], int]:
    """Jobs oldest first (newest last, like squeue), with the total before paging."""
    # Never the environment: listings do not show it, and every CLI job carries its
    # submitter's (up to 256 KiB), which halved GET /v1/jobs over 600 such jobs.
    query = select(Job).options(defer(Job.env, raiseload=True))
    if states:
        query = query.where(Job.state.in_(list(states)))
    if owner is not None:
        query = query.where(Job.owner == owner)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Job.id).limit(limit).offset(offset)).all()
    return list(rows), total


def jobs_in(session: Session, states: Iterable[JobState]) -> list[Job]:
    query = select(Job).options(defer(Job.env, raiseload=True))  # as list_jobs
    return list(session.scalars(query.where(Job.state.in_(list(states))).order_by(Job.id)))


# What the planner reads of a queued job.
_PLANNED = (
    Job.id,
    Job.owner,
    Job.gpus,
    Job.priority,
    Job.submitted_at,
    Job.time_limit_s,
    Job.not_before,
    Job.launcher,
    Job.reason,
    Job.sweep_id,
    Job.gpu_mem_bytes,
    Job.gpu_share,
    Job.oom_requeues,
    Job.gpu_link,
    Job.gpu_type,
    Job.cpus,
    Job.ram_bytes,
    Job.gpu_mem_auto,
    Job.gpus_max,
    Job.resize_to,
)
# Everything the gates and placers read of a job but its id and submission time (and
# ``attempt``: a job that ran before has its own back-off and attained service): two jobs
# alike in all of these that never ran are ranked by (submitted_at, id) by fifo,
# fairshare and las, and a pass that cannot start the earlier cannot start the later (a
# pass only takes resources). ``mem_key``: what an ``auto`` job learns from. In the order
# of the index ``ix_jobs_plan_shape``, which serves the window without a sort.
_SHAPE = tuple(getattr(Job, name) for name in PLAN_SHAPE_INDEX[1:-2])
_RANKED_BY = (Job.submitted_at, Job.id)
# Both built once: read at every pass, in the transaction submissions wait behind.
_WHOLE_QUEUE = select(*_PLANNED).where(Job.state == JobState.QUEUED)
# Ids and ranks from the index alone; the rows of those kept only.
_RANK = func.row_number().over(partition_by=_SHAPE, order_by=_RANKED_BY).label("rank")
_RANKED = select(Job.id, Job.attempt, _RANK).where(Job.state == JobState.QUEUED).subquery()
_WINDOWED_QUEUE = (
    select(*_PLANNED)
    .join(_RANKED, _RANKED.c.id == Job.id)
    .where((_RANKED.c.rank <= bindparam("window", type_=Integer)) | (_RANKED.c.attempt > 0))
)


def queued_for_planning(
    session: Session, host: HostDefaults = NO_DEFAULTS, window: int | None = None
) -> list[tuple[QueuedJob, str]]:
    """The queue as the planner's plain records, with each job's current reason (a job
    whose reservation is ``auto`` is whole-GPU here: ``auto_memory_jobs``), its cores and
    host memory as asked, or the admin's defaults (``host``, ``core.hostres``).

    Columns only, no ORM objects: read on every scheduling pass, so it stays cheap when
    hundreds of jobs wait. A job requeued after running out of memory sharing asks for
    whole GPUs from then on.

    ``window``: of the jobs that never ran, only the first ``window`` of each shape
    (``_SHAPE``, by submission); every job that ran before (a retry, a requeue: its own
    back-off and attained service) is read. A flood of 10,000 alike jobs is then read as
    ``window`` rows, ranked by SQLite without the interpreter lock.
    """
    if window is None:
        found = flushed(session).execute(_WHOLE_QUEUE)
    else:
        found = flushed(session).execute(_WINDOWED_QUEUE, {"window": window})
    return [
        (
            QueuedJob(
                *row[:7],
                needs_port=needs_port(row.gpus, row.launcher),
                sweep_id=row.sweep_id,
                mem_bytes=None if row.oom_requeues else row.gpu_mem_bytes,
                share_cap=None if row.oom_requeues else row.gpu_share,
                gpu_link=row.gpu_link,
                gpu_type=row.gpu_type,
                cpus=cores_wanted(row.gpus, row.cpus, host, _shares(row)),
                ram_bytes=ram_wanted(row.gpus, row.ram_bytes, host),
                gpus_max=row.gpus_max,
                resize_to=row.resize_to,
            ),
            row.reason,
        )
        for row in found
    ]


def say_unplanned(session: Session, why: str) -> None:
    """Give ``why`` to the queued jobs no pass has given a reason yet: those beyond the
    planning window (``queued_for_planning``), after the pass wrote every other's. Over
    the partial index ``ix_jobs_unplanned``: only those rows, never the whole queue."""
    # Named: without statistics SQLite would rather walk ``ix_jobs_state``, the queue.
    sql = f"UPDATE jobs INDEXED BY ix_jobs_unplanned SET reason = :why WHERE {UNPLANNED}"
    session.connection().execute(text(sql), {"why": why})


def _shares(row: Any) -> bool:
    """Whether a queued row shares its GPUs by memory (asked for, and not sent to whole
    GPUs after running out of memory)."""
    return not row.oom_requeues and (row.gpu_mem_bytes is not None or bool(row.gpu_mem_auto))


def auto_memory_jobs(session: Session, among: Iterable[int] | None = None) -> list[int]:
    """Queued jobs whose reservation is learned (``--gpu-mem auto``), and not requeued on
    whole GPUs after running out of memory; ``among``: of these ids only (the pass's
    window: looked up by id, not by a walk over the queue)."""
    if among is None:
        return list(flushed(session).execute(_AUTO).scalars())
    return list(flushed(session).execute(_AUTO_AMONG, {"ids": list(among)}).scalars())


_AUTO = select(Job.id).where(  # both built once: asked at every pass
    Job.state == JobState.QUEUED, Job.gpu_mem_auto.is_(True), Job.oom_requeues == 0
)
_AUTO_AMONG = _AUTO.where(Job.id.in_(bindparam("ids", expanding=True)))


def set_waiting_reasons(
    session: Session, reasons: Mapping[int, str], current: Mapping[int, str]
) -> None:
    """Update the reason of queued jobs whose reason changed (not recorded as events)."""
    changed = [{"job_id": i, "why": why} for i, why in reasons.items() if current.get(i) != why]
    if changed:  # a plain executemany on the table, not the ORM's bulk update by key
        session.connection().execute(_SET_REASON, changed)


_SET_REASON = (  # built once: every pass
    update(_jobs)
    .where(_jobs.c.id == bindparam("job_id"), _jobs.c.state == JobState.QUEUED)
    .values(reason=bindparam("why"))
)


# Built once, the job bound at each read: a job's detail reads both, and clients poll it.
_EVENTS_OF = select(JobEvent).where(JobEvent.job_id == bindparam("job")).order_by(JobEvent.id)
_ATTEMPTS_OF = select(Attempt).where(Attempt.job_id == bindparam("job")).order_by(Attempt.number)


def events_of(session: Session, job_id: int) -> list[JobEvent]:
    return list(session.scalars(_EVENTS_OF, {"job": job_id}))


def attempts_of(session: Session, job_id: int) -> list[Attempt]:
    return list(session.scalars(_ATTEMPTS_OF, {"job": job_id}))


def end_attempt(
    session: Session,
    job: Job,
    *,
    exit_code: int | None,
    exit_signal: int | None,
    state: JobState,
    reason: str,
    now: float,
) -> None:
    session.execute(
        update(Attempt)
        .where(Attempt.job_id == job.id, Attempt.number == job.attempt, Attempt.ended_at.is_(None))
        .values(
            ended_at=now,
            exit_code=exit_code,
            exit_signal=exit_signal,
            state=state,
            reason=reason,
        )
    )
    job.exit_code = exit_code
    job.exit_signal = exit_signal


class NotPreemptible(ValueError):
    pass


def request_preempt(session: Session, job: Job, by: str, now: float) -> None:
    """An admin asks a running, preemptible job to checkpoint and go back to the queue."""
    if job.state is not JobState.RUNNING:
        raise NotPreemptible(f"job {job.id} is {job.state.value}; only a running job is preempted")
    if not job.preemptible:
        raise NotPreemptible(f"job {job.id} was not submitted --preemptible")
    if job.stop_request is not None:
        raise NotPreemptible(f"job {job.id} is being stopped already ({job.stop_request})")
    job.stop_request = StopRequest.PREEMPT.value
    job.stop_reason = f"preempted by {by}"
    # The request is in the history at once, with who asked; the requeue follows it.
    transitions.note(session, job.id, job.state, f"preemption asked for by {by}", now)


def request_stop(session: Session, job: Job, why: str) -> bool:
    """Ask the worker to stop a running job; False if a stop was already asked for."""
    if job.stop_request is not None:
        return False
    job.stop_request = why
    return True


def cancel(session: Session, job: Job, now: float) -> None:
    """Cancel: a waiting job ends at once; an active one is stopped by the worker."""
    state = job.state
    if state in TERMINAL:
        return
    if state in ACTIVE:
        if job.stop_request == StopRequest.PREEMPT.value:
            # Being preempted, it would go back to the queue and run again: a cancel is the
            # owner's last word, so it replaces the preemption, its SIGTERM sent now.
            job.stop_request, job.stop_reason, job.stop_sent_at = "cancel", None, None
            return
        request_stop(session, job, "cancel")
        return
    settling.finish(session, job, JobState.CANCELLED, "cancelled before it started", now)


def set_hold(session: Session, job: Job, hold: bool, now: float) -> None:
    state = job.state
    if state not in (JobState.QUEUED, JobState.HELD):
        raise ValueError(
            f"job {job.id} is {state.value}; only a waiting job can be held or released"
        )
    job.user_hold = hold
    settling.settle_waiting(session, job, waiting_of_many(session, [job.id])[job.id], now)
    transitions.trim_history(session, job.id)  # hold, release, hold...: a bounded history


def recent_runs(session: Session, since: float) -> list[Run]:
    rows = session.execute(
        select(Job.owner, Attempt.gpus, Attempt.started_at, Attempt.ended_at, Attempt.cores)
        .join(Job, Job.id == Attempt.job_id)
        .where((Attempt.ended_at.is_(None)) | (Attempt.ended_at >= since))
    )
    return [
        Run(owner, len(gpus), start, end, len(cores or ()))
        for owner, gpus, start, end, cores in rows
    ]


def set_progress(session: Session, job: Job, progress: dict[str, Any]) -> None:
    job.progress = progress


def count_by_state(session: Session) -> dict[JobState, int]:
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state))
    return {state: n for state, n in rows}
