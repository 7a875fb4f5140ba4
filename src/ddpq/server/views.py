"""Rows from the store turned into wire schemas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Response
from pydantic import BaseModel

from ddpq.core.dependency_text import text_of
from ddpq.core.deps import Kind
from ddpq.core.finite import showable
from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, JobState
from ddpq.core.untrusted import clean_text
from ddpq.jobdir import JobDir
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
from ddpq.store import host as host_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import memory as memory_store
from ddpq.store import notifications as notification_store
from ddpq.store import sweeps as sweep_store
from ddpq.store.db import Session
from ddpq.store.models import Job, Sweep
from ddpq.store.models.job import DEPENDENCY_FIELDS

T = TypeVar("T")


def answer(model: BaseModel, status: int) -> Response:
    """``model`` as the response body, serialized here, in the route's own thread.

    A plain ``def`` route that returns a model makes FastAPI validate it again in the
    thread pool, a second hop between threads on every call (about half a millisecond
    of a submission's CPU, ``bench/post_cpu.py``). The route still names its
    ``response_model``, which the API's documentation and clients go by."""
    return Response(model.model_dump_json(by_alias=True), status, media_type="application/json")


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
    return None if value is None else ts_req(value)


def ts_req(value: float) -> datetime:
    return datetime.fromtimestamp(showable(value), UTC)


def job_out(
    job: Job,
    leases: tuple[list[int], int | None],
    waits: Mapping[str, Sequence[int]],
    shared_mem: int | None = None,
    peak_mem: int | None = None,
    host: tuple[list[int], int | None] = ([], None),
) -> JobOut:
    """``shared_mem``: what its live shared leases reserve on each GPU; ``peak_mem``: its
    latest attempt's measured peak; ``host``: the CPUs and host memory it holds now;
    ``waits``: what it waits on, by ``JobSpec`` field (``store.dependencies.fields_of_many``)."""
    gpus, port = leases
    return JobOut(
        id=job.id,
        name=servable(job.name),
        owner=servable(job.owner),
        command=servable(list(job.command)),
        launcher=servable(job.launcher),
        gpus=job.gpus,
        gpus_max=job.gpus_max,
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
        after=list(waits.get("after", [])),
        hold=job.user_hold,
        preemptible=job.preemptible,
        preemptions=job.preemptions,
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        partition=servable(job.partition),
        slurm_options=servable(list(job.slurm_options or [])),
        leases=LeaseOut(
            gpus=sorted(gpus), port=port, gpu_mem=shared_mem, cores=host[0], mem=host[1]
        ),
        progress=servable(job.progress),
        job_dir=servable(job.job_dir),
        after_sweeps=list(waits.get("after_sweeps", [])),
        dependency=dependency_text_of(waits, job.singleton),
        sweep_id=job.sweep_id,
        sweep_index=job.sweep_index,
        gpu_mem=job.gpu_mem_bytes,
        gpu_mem_auto=job.gpu_mem_auto,
        gpu_share=job.gpu_share,
        gpu_link=job.gpu_link,
        gpu_type=job.gpu_type,
        peak_mem=peak_mem,
        interactive=job.interactive,
        idle_s=job.idle_s,
        idle_since=ts(job.idle_since),
        attach=attach_socket(job),
        cpus=job.cpus,
        mem=job.ram_bytes,
        # Written by the worker (worker.forecast); meaningful only while the job waits.
        predicted_start=ts(job.predicted_start) if job.state is JobState.QUEUED else None,
    )


def spec_waits(spec: JobSpec) -> dict[str, Sequence[int]]:
    """A spec's dependencies by field, as ``fields_of_many`` reads them back."""
    return {name: sorted(set(getattr(spec, name))) for name in DEPENDENCY_FIELDS.values()}


def dependency_text_of(waits: Mapping[str, Sequence[int]], singleton: bool) -> str:
    """What the job waits on as ``--dependency`` text (empty: nothing)."""
    kinds = {
        Kind(kind): (
            tuple(waits.get(DEPENDENCY_FIELDS[(kind, False)], ())),
            tuple(waits.get(DEPENDENCY_FIELDS[(kind, True)], ())),
        )
        for kind in Kind
    }
    return text_of(kinds, singleton)


def attach_socket(job: Job) -> str | None:
    """Where a running session's terminal is served (its shim makes it once it starts)."""
    if not job.interactive or job.state is not JobState.RUNNING or job.job_dir is None:
        return None
    return servable(str(JobDir(Path(job.job_dir)).tty_socket))


def jobs_out(session: Session, jobs: list[Job]) -> list[JobOut]:
    ids = [j.id for j in jobs]
    live = lease_store.live(session, ids)
    held = lease_store.by_job(live)
    shares = lease_store.shares(live)
    # One query each for the whole page, not one per job.
    waits = dependencies.fields_of_many(session, ids)
    peaks = memory_store.latest_peaks(session, [j.id for j in jobs if j.attempt])
    hosts = host_store.held_by(session, [j.id for j in jobs if j.state in ACTIVE])
    return [
        job_out(
            j,
            held.get(j.id, ([], None)),
            waits.get(j.id, {}),
            shares.get(j.id, (None, None))[0],
            peaks.get(j.id),
            hosts.get(j.id, ([], None)),
        )
        for j in jobs
    ]


def job_detail(session: Session, job: Job) -> JobDetail:
    base = jobs_out(session, [job])[0]
    # Only a job given a URL is ever owed a message (store.notifications.owed).
    sent = []
    if job.notify_url is not None:
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
                gpu_mem=a.gpu_mem_bytes,
                peak_mem=a.peak_mem_bytes,
                cores=a.cores,
                mem=a.ram_bytes,
                peak_ram=a.peak_ram_bytes,
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
