"""The GPUs as the worker last reported them, with the job (and owner) leasing each."""

from __future__ import annotations

import time

from fastapi import APIRouter

from ddpq.core.states import JobState
from ddpq.schemas import DeviceList, DeviceOut
from ddpq.server import views
from ddpq.server.deps import Auth, DatabaseDep, SettingsDep
from ddpq.store import devices as device_store
from ddpq.store import idle as idle_store
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store

router = APIRouter(prefix="/v1/devices", tags=["devices"])


@router.get("", response_model=DeviceList)
def devices(_who: Auth, db: DatabaseDep, settings: SettingsDep) -> DeviceList:
    now = time.time()
    with db.read() as s:
        snapshot = device_store.all_devices(s)
        live = lease_store.live(s)
        owners = {
            j.id: j.owner for j in job_store.jobs_in(s, [JobState.STARTING, JobState.RUNNING])
        }
        idle = idle_store.idle_now(s)
    gpu_holder = {x.resource: x for x in live if x.kind == lease_store.GPU}
    ports = {x.resource: x.job_id for x in live if x.kind == lease_store.PORT}
    items = []
    for d in snapshot:
        lease = gpu_holder.get(d.index)
        since = idle[lease.job_id].idle_since if lease and lease.job_id in idle else None
        status = "leased" if lease else ("external" if d.processes else "free")
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
                external_processes=list(d.processes),
                idle_since=views.ts(since),
                idle_long=since is not None and now - since >= settings.idle_long_s,
            )
        )
    return DeviceList(items=items, ports_leased=ports)
