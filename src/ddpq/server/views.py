"""Rows from the store turned into wire schemas."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from ddpq.core.states import JobState
from ddpq.core.untrusted import clean_text
from ddpq.schemas import (
    AttemptOut,
    EventOut,
    JobDetail,
    JobOut,
    LeaseOut,
    NotificationOut,
    SweepDetail,
    SweepMember,
    SweepOut,
)
from ddpq.store import dependencies
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import notifications as notification_store
from ddpq.store import sweeps as sweep_store
from ddpq.store.db import Session
from ddpq.store.models import Job, Sweep

T = TypeVar("T")


def servable(value: T) -> T:
    """``value`` with every string made encodable as UTF-8 (lone surrogates become U+FFFD).

    The API refuses such strings at the door, but rows stored before it did (or written by
    a job into its progress) must not make a whole listing fail to encode for every user.
    """
    if isinstance(value, str):
        return clean_text(value, None)  # type: ignore[return-value]
    if isinstance(value, list):
        return [servable(x) for x in value]  # type: ignore[return-value]
    if isinstance(value, dict):
        out: dict[Any, Any] = {servable(k): servable(x) for k, x in value.items()}
        return out  # type: ignore[return-value]
    return value


def ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def ts_req(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def job_out(
    job: Job,
    leases: tuple[list[int], int | None],
    after: list[int],
    after_sweeps: list[int] | None = None,
) -> JobOut:
    gpus, port = leases
    return JobOut(
        id=job.id,
        name=servable(job.name),
        owner=servable(job.owner),
        command=servable(list(job.command)),
        launcher=servable(job.launcher),
        gpus=job.gpus,
        priority=job.priority,
        state=job.state,
        reason=servable(job.reason),
        submitted_at=ts_req(job.submitted_at),
        started_at=ts(job.started_at),
        ended_at=ts(job.ended_at),
        exit_code=job.exit_code,
        exit_signal=job.exit_signal,
        time_limit_s=job.time_limit_s,
        retries=job.max_retries,
        attempt=job.attempt,
        after=after,
        hold=job.user_hold,
        preemptible=job.preemptible,
        preemptions=job.preemptions,
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        partition=servable(job.partition),
        slurm_options=servable(list(job.slurm_options or [])),
        leases=LeaseOut(gpus=sorted(gpus), port=port),
        progress=servable(job.progress),
        job_dir=servable(job.job_dir),
        after_sweeps=after_sweeps or [],
        sweep_id=job.sweep_id,
        sweep_index=job.sweep_index,
    )


def jobs_out(session: Session, jobs: list[Job]) -> list[JobOut]:
    ids = [j.id for j in jobs]
    held = lease_store.by_job(lease_store.live(session, ids))
    # One query each for the whole page, not one per job.
    after = dependencies.dependencies_of_many(session, ids)
    after_sweeps = dependencies.sweep_dependencies_of_many(session, ids)
    return [
        job_out(j, held.get(j.id, ([], None)), after.get(j.id, []), after_sweeps.get(j.id, []))
        for j in jobs
    ]


def job_detail(session: Session, job: Job) -> JobDetail:
    base = jobs_out(session, [job])[0]
    sent = notification_store.attempts_of(session, [job.id]).get(job.id, [])
    return JobDetail(
        **base.model_dump(),
        notify=job.notify_url is not None,
        notifications=notifications_out(sent),
        events=[
            EventOut(
                at=ts_req(e.at),
                from_state=e.from_state,
                to_state=e.to_state,
                reason=servable(e.reason),
            )
            for e in job_store.events_of(session, job.id)
        ],
        attempts=[
            AttemptOut(
                number=a.number,
                gpus=list(a.gpus),
                port=a.port,
                started_at=ts_req(a.started_at),
                ended_at=ts(a.ended_at),
                exit_code=a.exit_code,
                exit_signal=a.exit_signal,
                state=a.state,
                reason=servable(a.reason),
                executor=a.executor,
                handle=a.handle,
            )
            for a in job_store.attempts_of(session, job.id)
        ],
    )


def notifications_out(sent: list[notification_store.Attempt]) -> list[NotificationOut]:
    return [
        NotificationOut(
            attempt=n.attempt, at=ts_req(n.at), status=n.status, error=servable(n.error)
        )
        for n in sent
    ]


def sweep_out(sweep: Sweep, counts: dict[JobState, int]) -> SweepOut:
    return SweepOut(
        id=sweep.id,
        name=servable(sweep.name),
        owner=servable(sweep.owner),
        submitted_at=ts_req(sweep.submitted_at),
        size=sweep.size,
        params=servable(dict(sweep.params)),
        array=servable(sweep.array),
        max_running=sweep.max_running,
        counts=counts,
        done=sweep_store.is_done(counts),
    )


def sweep_detail(
    sweep: Sweep,
    counts: dict[JobState, int],
    members: list[sweep_store.MemberRow],
    sort: str | None,
    sent: list[notification_store.Attempt],
) -> SweepDetail:
    t = sweep.template
    command = list(t.get("command") or [])
    if t.get("workload"):
        command = [str(t["workload"]), *t.get("args", [])]
    return SweepDetail(
        **sweep_out(sweep, counts).model_dump(),
        command=servable(command),
        gpus=int(t.get("gpus", 0)),
        sort=sort,
        members=[
            SweepMember(
                id=m.id,
                index=m.index,
                name=servable(m.name),
                params=servable(m.params),
                state=m.state,
                reason=servable(m.reason),
                exit_code=m.exit_code,
                exit_signal=m.exit_signal,
                started_at=ts(m.started_at),
                ended_at=ts(m.ended_at),
                metrics=servable(m.progress),
            )
            for m in members
        ],
        notify=sweep.notify_url is not None,
        notifications=notifications_out(sent),
    )
