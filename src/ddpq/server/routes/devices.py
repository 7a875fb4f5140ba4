"""The GPUs as the worker last reported them, with the job (and owner) leasing each, or
the jobs sharing each by memory, and whose the processes in no job are (their account, and
the ddpq user it maps to)."""

from __future__ import annotations

import time
from dataclasses import replace

from fastapi import APIRouter

from ddpq import enforcement
from ddpq.core.enforcement import phrase
from ddpq.core.states import JobState
from ddpq.schemas import DeviceList, DeviceOut, DeviceShare, LimitOut
from ddpq.server import views
from ddpq.server.deps import Auth, DatabaseDep, SettingsDep
from ddpq.server.host_limits import host_out
from ddpq.store import devices as device_store
from ddpq.store import idle as idle_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import usage as usage_store

router = APIRouter(prefix="/v1/devices", tags=["devices"])


@router.get("", response_model=DeviceList)
def devices(_who: Auth, settings: SettingsDep, db: DatabaseDep) -> DeviceList:
    now = time.time()
    with db.read() as s:
        snapshot = device_store.all_devices(s)
        live = lease_store.live(s)
        owners = {
            j.id: j.owner for j in job_store.jobs_in(s, [JobState.STARTING, JobState.RUNNING])
        }
        accounts = {p.account for d in snapshot for p in d.processes if p.account}
        people = usage_store.people(s, accounts, names_are_users=not settings.auth)
        idle = idle_store.idle_now(s)
        host = host_out(s, settings, owners)
    gpu_holder = {x.resource: x for x in live if x.kind == lease_store.GPU}
    ports = {x.resource: x.job_id for x in live if x.kind == lease_store.PORT}
    shared: dict[int, list[DeviceShare]] = {}
    for x in live:
        if x.kind == lease_store.GPU_SHARE and x.mem_bytes is not None:
            share = DeviceShare(
                job_id=x.job_id,
                owner=views.servable(owners.get(x.job_id)),
                gpu_mem=x.mem_bytes,
                since=views.ts_req(x.acquired_at),
            )
            shared.setdefault(x.resource, []).append(share)
    items = []
    for d in snapshot:
        lease = gpu_holder.get(d.index)
        since = idle[lease.job_id].idle_since if lease and lease.job_id in idle else None
        status = "leased" if lease else ("external" if d.processes else "free")
        if d.index in shared:
            status = "shared"
        items.append(
            DeviceOut(
                index=d.index,
                uuid=views.servable(d.uuid),
                name=views.servable(d.name),
                fake=d.fake,
                memory_total_mb=d.memory_total_mb,
                memory_used_mb=d.memory_used_mb,
                status=status,  # type: ignore[arg-type]
                job_id=lease.job_id if lease else None,
                owner=owners.get(lease.job_id) if lease else None,
                since=views.ts(lease.acquired_at) if lease else None,
                external_processes=[
                    replace(p, user=people.get(p.account or "")) for p in d.processes
                ],
                shares=shared.get(d.index, []),
                idle_since=views.ts(since),
                idle_long=since is not None and now - since >= settings.idle_long_s,
                numa=d.numa,
                cpus=views.servable(d.cpus),
                links={i: views.servable(word) for i, word in d.links},
                mig_profile=views.servable(d.mig_profile),
                parent=d.parent,
            )
        )
    limits = [
        LimitOut(controller=c.controller, enforced=c.enforced, how=c.how, said=phrase(c))
        for c in enforcement.read(settings.home)
    ]
    return DeviceList(items=items, ports_leased=ports, limits=limits, host=host)
