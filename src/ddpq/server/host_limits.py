"""A submission's CPU cores and host memory against what this host gives jobs: one that
asks for more than could ever be leased here is refused (422) rather than queued to wait
forever. The planner says the same of a job the admin's settings have since outgrown
(``core.hostres.never_fits``). And what ``ddpq gpus`` shows of the host's cores and memory."""

from __future__ import annotations

from collections.abc import Mapping

from ddpq import hostinfo
from ddpq.config import Settings
from ddpq.core import hostres
from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import capabilities
from ddpq.schemas import HostJob, HostOut
from ddpq.server.errors import ApiError
from ddpq.server.views import servable
from ddpq.store import host as host_store
from ddpq.store.db import Session


def refuse_beyond_host(spec: JobSpec, settings: Settings) -> None:
    """422 naming the field, where ``spec``'s own ``cpus`` or ``mem`` cannot fit here."""
    if not capabilities(settings.executor).on_this_host:
        return  # refused by the executor's capabilities already
    if spec.cpus is not None:
        capacity = hostinfo.cpu_capacity(settings.cpu_capacity)
        why = hostres.never_fits(spec.cpus, None, capacity, None)
        if why is not None:
            raise ApiError(422, "invalid", f"cpus: {why}")
    if spec.ram_bytes is not None:
        job_ram = hostres.job_ram_bytes(settings.job_ram, hostinfo.mem_total())
        why = hostres.never_fits(0, spec.ram_bytes, None, job_ram)
        if why is not None:
            raise ApiError(422, "invalid", f"mem: {why}")


def host_out(session: Session, settings: Settings, owners: Mapping[int, str]) -> HostOut | None:
    """The host's cores and memory and the jobs holding them (None where jobs run
    elsewhere). ``owners``: the owners of the jobs that hold leases."""
    if not capabilities(settings.executor).on_this_host:
        return None
    held = host_store.held_by(session, list(owners))
    jobs = [
        HostJob(job_id=job_id, owner=servable(owners.get(job_id)), cores=cores, mem=mem)
        for job_id, (cores, mem) in sorted(held.items())
        if cores or mem is not None
    ]
    return HostOut(
        cpu_capacity=hostinfo.cpu_capacity(settings.cpu_capacity),
        cores_held=host_store.slots_held(session),
        job_ram=hostres.job_ram_bytes(settings.job_ram, hostinfo.mem_total()),
        ram_held=host_store.ram_held(session),
        jobs=jobs,
    )
