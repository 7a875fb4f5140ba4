"""Changing a queued job (``PATCH /v1/jobs/{id}``, ``ddpq update``) and queuing a job
again (``POST /v1/jobs/{id}/restart``, ``ddpq restart``). What may change when is
``core.edits``; a change is one write of the job's row with its event in its history
(``store.edits``, through ``store.transitions``)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Body

from ddpq import wake
from ddpq.config import Settings
from ddpq.core import edits
from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import JobChanges, JobOut
from ddpq.schemas.submit_rules import hardware_refusal, session_port_refusal
from ddpq.server import queue_caps, views
from ddpq.server.deps import Auth, DatabaseDep, SettingsDep, may_touch, proven_account
from ddpq.server.errors import CONFLICT, NO_ROOM, QUEUE_CAP, WRITE_ERRORS, ApiError
from ddpq.server.host_limits import refuse_beyond_host
from ddpq.server.params import JobId
from ddpq.server.submission_checks import (
    check_cwd,
    check_gpus,
    check_hardware,
    check_priority,
    cluster_options,
    refuse_if_disk_short,
)
from ddpq.store import edits as edit_store
from ddpq.store import jobs as job_store
from ddpq.store import memory as memory_store
from ddpq.store.db import Session

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# What a restarted job does not carry over: it runs again now, not after what the first
# run waited for, and not held unless asked.
_FRESH: dict[str, Any] = {
    "hold": False,
    "after": (),
    "after_sweeps": (),
    "after_any": (),
    "after_notok": (),
    "after_any_sweeps": (),
    "after_notok_sweeps": (),
}


@router.patch("/{job_id}", response_model=JobOut, responses={**CONFLICT, **WRITE_ERRORS})
def update(
    job_id: JobId, body: JobChanges, who: Auth, settings: SettingsDep, db: DatabaseDep
) -> JobOut:
    """Change a waiting job's priority, time limit, GPUs, name or hold; a running job's
    time limit only (its owner may lower it, an admin raise it). 409 with the reason for
    anything else; taken on a full disk too, as hold and release are."""
    values = body.values()
    if not values and body.hold is None:
        raise ApiError(422, "invalid", "nothing to change: give a field to set")
    check_priority(values.get("priority"), who)

    def write() -> JobOut:
        with db.write() as s:
            job = job_store.get_job(s, job_id)
            may_touch(who, job.owner, job_id)
            why = edits.update_refusal(
                job.state, values, hold=body.hold, admin=who.admin, time_limit_s=job.time_limit_s
            )
            if why is not None:
                raise ApiError(409, "conflict", f"job {job_id}: {why}")
            now = time.time()
            if values:
                spec = job_store.spec_of(s, job)
                checked(s, replace(spec, **values), settings, gpus_changed="gpus" in values)
                old = {k: getattr(spec, k) for k in values}
                if "name" in values:
                    values["mem_key"] = memory_store.mem_key(values["name"], spec.command)
                reason = f"updated by {who.name}: {edits.described(old, body.values())}"
                if not edit_store.update_job(s, job, values, reason, now):
                    raise ApiError(409, "conflict", f"job {job_id} moved on meanwhile; try again")
                if "name" in values:
                    edit_store.settle_renamed(s, job, spec.name, now)
            if body.hold is not None:
                try:
                    job_store.set_hold(s, job, body.hold, now)
                except ValueError as exc:
                    raise ApiError(409, "conflict", str(exc)) from None
            return views.jobs_out(s, [job])[0]

    out = db.making_room(write)
    wake.nudge(settings.wake_socket)
    return out


@router.post(
    "/{job_id}/restart",
    status_code=201,
    response_model=JobOut,
    responses={**CONFLICT, **WRITE_ERRORS, **NO_ROOM, **QUEUE_CAP},
)
def restart(
    job_id: JobId,
    who: Auth,
    settings: SettingsDep,
    db: DatabaseDep,
    body: Annotated[JobChanges | None, Body()] = None,
) -> JobOut:
    """Queue a new job with the spec of a job that has run or is running (``body``: what
    to change on the way). It waits for nothing the first one waited for, and runs as a
    new submission of its owner's would."""
    changes = body or JobChanges()
    values = changes.values()
    check_priority(values.get("priority"), who)
    refuse_if_disk_short(db)
    with db.write() as s:
        job = job_store.get_job(s, job_id)
        may_touch(who, job.owner, job_id)
        if settings.auth and who.name != job.owner:
            raise ApiError(403, "forbidden", f"job {job_id}: only its owner may queue it again")
        why = edits.restart_refusal(job.state)
        if why is not None:
            raise ApiError(409, "conflict", f"job {job_id}: {why}")
        spec = replace(job_store.spec_of(s, job), **_FRESH, **values)
        run_as = proven_account(who, settings) if who.name == job.owner else job.run_as
        spec = replace(spec, run_as=run_as, hold=bool(changes.hold))
        if "name" in values:
            spec = replace(spec, mem_key=memory_store.mem_key(values["name"], spec.command))
        # As a new submission: the priority it carries over (an admin may have raised it)
        # and the daemon's rules as they are now, not as they were at the first submission.
        check_priority(spec.priority, who)
        spec = replace(spec, slurm_options=cluster_options(spec, settings))
        checked(s, spec, settings)
        check_cwd(settings, db, spec.cwd, spec.owner, spec.run_as)
        queue_caps.refuse_if_over(s, settings, spec.owner, 1)
        now = time.time()
        new = job_store.create_job(s, spec, now)
        edit_store.note_restart(s, new, job_id, who.name, now)
        out = views.job_out(new, ([], None), views.spec_waits(spec))
    wake.nudge(settings.wake_socket)
    return out


def checked(s: Session, spec: JobSpec, settings: Settings, gpus_changed: bool = True) -> None:
    """422 for a changed spec this daemon could not run, as a submission of it would get.
    Its hardware is judged anew only with a new count of GPUs (or a restart): a running
    job's new time limit is no reason to refuse it if a GPU of its kind has gone since."""
    if spec.gpus == 0 and (spec.gpu_mem_bytes is not None or spec.gpu_mem_auto):
        raise ApiError(422, "invalid", "gpus: a job that shares GPUs by memory needs one")
    if spec.gpus == 0 and spec.gpu_type is not None:
        raise ApiError(422, "invalid", "gpus: a job that asks for a GPU type needs one")
    if spec.gpus_max is not None and not 0 < spec.gpus <= spec.gpus_max:
        raise ApiError(422, "invalid", f"gpus: an elastic job's least, 1 to {spec.gpus_max}")
    if spec.gpus_per_node is not None and spec.gpus != spec.nodes * spec.gpus_per_node:
        raise ApiError(422, "invalid", "gpus: a job over nodes has gpus_per_node on each")
    for why in (
        hardware_refusal(spec.gpus, spec.nodes, spec.gpu_link, spec.gpu_type),
        session_port_refusal(spec.interactive, spec.gpus, spec.command),
        capabilities(settings.executor).refuses(spec),
    ):
        if why is not None:
            raise ApiError(422, "invalid", why)
    refuse_beyond_host(spec, settings)
    check_gpus(s, spec.gpus_max or spec.gpus, spec.gpu_mem_bytes, settings)
    if gpus_changed:
        check_hardware(s, spec.gpus, spec.gpu_type, spec.gpu_link)
