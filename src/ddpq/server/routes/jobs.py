"""Jobs: submit, list, show, a job's environment, who listens on its port, and the three
writes on one job (cancel, hold, release)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Query, Response

from ddpq import wake
from ddpq.config import Settings
from ddpq.core import jobenv
from ddpq.core.interactive import idle_limit
from ddpq.core.sharing import AUTO
from ddpq.core.spec import JobSpec
from ddpq.core.states import TERMINAL, JobState
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import (
    CancelResult,
    JobDetail,
    JobEnvOut,
    JobList,
    JobOut,
    JobSubmit,
    PortUseOut,
    derive_name,
)
from ddpq.server import portuse, queue_caps, views
from ddpq.server.deps import (
    Auth,
    Caller,
    DatabaseDep,
    NotifyLookupsDep,
    SettingsDep,
    may_touch,
    proven_account,
)
from ddpq.server.errors import CONFLICT, NO_ROOM, QUEUE_CAP, WRITE_ERRORS, ApiError
from ddpq.server.host_limits import refuse_beyond_host
from ddpq.server.notify_lookups import NotifyLookups
from ddpq.server.params import JobId, Offset
from ddpq.server.submission_checks import (
    check_cwd,
    check_gpus,
    check_hardware,
    check_notify,
    check_priority,
    cluster_options,
    refuse_if_disk_short,
    refuse_unmapped,
    workload_command,
)
from ddpq.server.workload_data import check_workload_data
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import memory as memory_store
from ddpq.store import users as user_store
from ddpq.store.db import Database

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


# A submission's status, declared for the API's documentation and answered (views.answer).
SUBMITTED = 201


@router.post(
    "",
    status_code=SUBMITTED,
    response_model=JobOut,
    responses={**WRITE_ERRORS, **NO_ROOM, **QUEUE_CAP},
)
def submit(
    body: JobSubmit,
    who: Auth,
    settings: SettingsDep,
    db: DatabaseDep,
    lookups: NotifyLookupsDep,
) -> Response:
    spec = job_spec(body, who, settings, db, lookups)
    refuse_if_disk_short(db)
    with db.write() as s:
        check_gpus(s, body.gpus_max or body.gpus, body.gpu_mem_bytes, settings)  # an elastic's most
        check_hardware(s, body.gpus, body.gpu_type, body.gpu_link)  # its least, of the kind
        queue_caps.refuse_if_over(s, settings, spec.owner, 1)
        job = job_store.create_job(s, spec, time.time())
        # In the transaction, serialized too: an answer that cannot be made undoes the job,
        # so a client's retry of a failed submission never queues it twice. A new job holds
        # no lease, and its dependencies are the ones just given.
        out = views.job_out(job, ([], None), views.spec_waits(spec))
        answer = views.answer(out, SUBMITTED)
    wake.nudge(settings.wake_socket)
    return answer


def job_spec(
    body: JobSubmit,
    who: Caller,
    settings: Settings,
    db: Database,
    lookups: NotifyLookups,
    command: list[str] | None = None,
) -> JobSpec:
    """The job a submission asks for, checked: its owner, priority, command and folder,
    and that this daemon's executor can run it (``executors.capabilities``).

    ``command``: given by a sweep, which builds (and checks) each member's own; otherwise
    the body's command, or its workload's resolved with the workload's own parser.
    """
    # On the socket, and with --auth, the caller is who they proved to be: a body's
    # "owner" is believed only from TCP callers without --auth (who could name anyone).
    owner = who.name if settings.auth or who.via == "socket" else (body.owner or who.name)
    run_as = proven_account(who, settings)
    check_priority(body.priority, who)
    swept = command is not None
    if command is None:
        command = body.command
        if body.workload is not None:
            command = workload_command(body.workload, body.args)
    spec = submitted_spec(body, settings, owner, run_as, command)
    why = capabilities(settings.executor).refuses(spec)
    if why is not None:
        raise ApiError(422, "invalid", why)
    spec = replace(spec, slurm_options=cluster_options(spec, settings))
    refuse_beyond_host(spec, settings)
    refuse_unmapped(settings, db, owner, run_as)
    if body.cwd is not None:
        check_cwd(settings, db, body.cwd, owner, run_as)
    if not swept:  # a workload's data, where it will look (a sweep's members: its route)
        check_workload_data(settings, db, body, spec.cwd, owner, run_as)
    if body.notify is not None:
        check_notify(body.notify, settings, lookups, who.name)
    return spec


def submitted_spec(
    body: JobSubmit, settings: Settings, owner: str, run_as: str | None, command: list[str]
) -> JobSpec:
    """The spec of ``body`` with the daemon's defaults filled in; its #SBATCH options still
    as the body gave them (``cluster_options``). 422 for an idle limit out of bounds."""
    idle_s = None
    if body.interactive:
        try:
            idle_s = idle_limit(body.idle_s, settings.idle_default_s, settings.idle_max_s)
        except ValueError as exc:
            raise ApiError(422, "invalid", f"idle_s: {exc}") from None
    return JobSpec(
        name=body.name or derive_name(body.workload or command[0]),
        owner=owner,
        command=command,
        cwd=body.cwd or str(settings.home),
        gpus=body.gpus,
        gpus_max=body.gpus_max,
        launcher="torchrun" if body.torchrun or body.workload is not None else "plain",
        # The exported environment and `env` in one mapping, marked (jobs.env, a JSON
        # column): the executor's job contract reads it back with jobenv.unpack.
        env=jobenv.pack(body.exported_env, body.env),
        priority=body.priority,
        time_limit_s=body.time_limit_s,
        max_retries=body.retries,
        hold=body.hold,
        **body.waits(),  # after, after_sweeps, the other kinds, singleton
        notify_url=body.notify or settings.notify_url,
        preemptible=body.preemptible,
        preempt_signal=body.preempt_signal,
        gpu_mem_bytes=body.gpu_mem_bytes,
        gpu_mem_auto=body.gpu_mem == AUTO,
        gpu_share=body.gpu_share,
        mem_key=memory_store.mem_key(body.name, command),
        interactive=body.interactive,
        idle_s=idle_s,
        run_as=run_as,
        nodes=body.nodes,
        gpus_per_node=body.gpus_per_node,
        partition=body.partition,
        slurm_options=tuple(body.slurm_options),
        gpu_link=body.gpu_link,
        gpu_type=body.gpu_type,
        cpus=body.cpus,
        ram_bytes=body.ram_bytes,
    )


@router.get("", response_model=JobList)
def list_jobs(
    _who: Auth,
    db: DatabaseDep,
    state: Annotated[list[JobState] | None, Query()] = None,
    user: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> Response:
    # Answered as a submission is (views.answer): what a client polls, a page at a time.
    with db.read() as s:
        rows, total = job_store.list_jobs(
            s, states=state or [], owner=user, limit=limit, offset=offset
        )
        page = JobList(items=views.jobs_out(s, rows), total=total, offset=offset, limit=limit)
    return views.answer(page, 200)


@router.get("/{job_id}", response_model=JobDetail)
def show(job_id: JobId, _who: Auth, db: DatabaseDep) -> Response:
    with db.read() as s:
        detail = views.job_detail(s, job_store.get_job(s, job_id, env=False))
    return views.answer(detail, 200)


@router.get("/{job_id}/env", response_model=JobEnvOut)
def job_env(job_id: JobId, who: Auth, db: DatabaseDep) -> JobEnvOut:
    """The variables the job was submitted with. They may hold secrets (tokens, keys):
    only the job's owner and admins may read them, here and nowhere else."""
    with db.read() as s:
        job = job_store.get_job(s, job_id)
        may_touch(who, job.owner, job_id)
        exported, variables = jobenv.unpack(job.env or {})
    return JobEnvOut(
        id=job_id, base="exported" if exported else "daemon", env=views.servable(variables)
    )


@router.get("/{job_id}/port", response_model=PortUseOut)
def port_use(job_id: JobId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> PortUseOut:
    """Who listens on the job's leased port now: the job itself, someone else (whose), or
    nobody yet. Only its owner and admins may ask."""
    with db.read() as s:
        job = job_store.get_job(s, job_id)
        may_touch(who, job.owner, job_id)
        port = lease_store.by_job(lease_store.live(s, [job_id])).get(job_id, ([], None))[1]
        # As the launch chooses: the account the submission proved, else the owner's mapped one.
        account = job.run_as or user_store.unix_accounts(s, {job.owner}).get(job.owner)
        running, attempt = job.state is JobState.RUNNING, job.attempt
    return portuse.port_use(settings, job_id, attempt, port, running, account)


@router.post("/{job_id}/cancel", response_model=CancelResult, responses=WRITE_ERRORS)
def cancel(job_id: JobId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> CancelResult:
    """Cancel a job. One that has already ended stays as it is: 200 with its state and
    a reason that says so (cancelling is idempotent). Taken on a full disk too."""
    result, changed = db.making_room(lambda: _cancel(db, job_id, who))
    if changed:
        wake.nudge(settings.wake_socket)
    return result


def _cancel(db: Database, job_id: int, who: Caller) -> tuple[CancelResult, bool]:
    """The cancel in one transaction; whether it changed the job."""
    with db.write() as s:
        job = job_store.get_job(s, job_id)
        may_touch(who, job.owner, job_id)
        if job.state in TERMINAL:
            # Checked first: an ended job may still carry the stop request that ended
            # it (a time limit, an earlier cancel), which is no news now.
            why = f"already {job.state}" + (f": {job.reason}" if job.reason else "")
            return CancelResult(id=job.id, state=job.state, reason=views.servable(why)), False
        job_store.cancel(s, job, time.time())
        return CancelResult(
            id=job.id,
            state=job.state,
            reason="stopping (SIGTERM sent, SIGKILL after the grace period)"
            if job.stop_request
            else views.servable(job.reason),
        ), True


@router.post("/{job_id}/hold", response_model=JobOut, responses={**CONFLICT, **WRITE_ERRORS})
def hold(job_id: JobId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> JobOut:
    return set_hold(settings, db, job_id, who, True)


@router.post("/{job_id}/release", response_model=JobOut, responses={**CONFLICT, **WRITE_ERRORS})
def release(job_id: JobId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> JobOut:
    return set_hold(settings, db, job_id, who, False)


def set_hold(settings: Settings, db: Database, job_id: int, who: Caller, hold: bool) -> JobOut:
    """Hold or release a waiting job; taken on a full disk too (store.headroom)."""

    def write() -> JobOut:
        with db.write() as s:
            job = job_store.get_job(s, job_id)
            may_touch(who, job.owner, job_id)
            try:
                job_store.set_hold(s, job, hold, time.time())
            except ValueError as exc:
                raise ApiError(409, "conflict", str(exc)) from None
            return views.jobs_out(s, [job])[0]

    out = db.making_room(write)
    wake.nudge(settings.wake_socket)
    return out


@router.post("/{job_id}/preempt", response_model=JobOut, responses={**CONFLICT, **WRITE_ERRORS})
def preempt(job_id: JobId, who: Auth, settings: SettingsDep, db: DatabaseDep) -> JobOut:
    """Ask a running, preemptible job to checkpoint and go back to the queue (admins only:
    it takes a user's GPUs away from them; the policy does this on its own under `las`)."""
    if not who.admin:
        raise ApiError(403, "forbidden", "only an admin may preempt a job")
    with db.write() as s:
        job = job_store.get_job(s, job_id)
        try:
            job_store.request_preempt(s, job, who.name, time.time())
        except job_store.NotPreemptible as exc:
            raise ApiError(409, "conflict", str(exc)) from None
        out = views.jobs_out(s, [job])[0]
    wake.nudge(settings.wake_socket)
    return out
