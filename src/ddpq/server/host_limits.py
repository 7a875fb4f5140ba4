"""A submission's CPU cores and host memory against what this host gives jobs: one that
asks for more than could ever be leased here is refused (422) rather than queued to wait
forever. The planner says the same of a job the admin's settings have since outgrown
(``core.hostres.never_fits``)."""

from __future__ import annotations

from ddpq import hostinfo
from ddpq.config import Settings
from ddpq.core import hostres
from ddpq.core.spec import JobSpec
from ddpq.executors.capabilities import capabilities
from ddpq.server.errors import ApiError


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
