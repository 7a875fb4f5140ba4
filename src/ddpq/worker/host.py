"""The host's CPU cores and memory as the worker leases them (``core.hostres``): fixed
when the worker starts, from the settings and what the host is.

Where jobs run elsewhere (``Capabilities.on_this_host`` false: Slurm), this host's cores
and memory are not theirs: nothing is counted and no core is leased; a job's memory (its
own ``--mem`` or the defaults) still goes with its launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpq import hostinfo
from ddpq.config import Settings
from ddpq.core import hostres
from ddpq.core.hostres import HostDefaults
from ddpq.core.scheduler import NO_HOST, HostUse


@dataclass(frozen=True)
class HostSetup:
    """``cpus``: the host's CPU ids slots stand for; ``capacity``: slots (None: cores not
    counted); ``job_ram``: bytes jobs may hold in all (None: not counted)."""

    cpus: tuple[int, ...]
    capacity: int | None
    job_ram: int | None
    defaults: HostDefaults

    def use(self, slots_held: frozenset[int], ram_held: int) -> HostUse:
        """The host as a pass starts, with what running jobs hold."""
        if self.capacity is None and self.job_ram is None:
            return NO_HOST
        return HostUse(self.capacity, slots_held, self.job_ram, ram_held, self.cpus)

    def cores_of(self, slots: tuple[int, ...]) -> tuple[int, ...]:
        """The CPUs a job's slots are (its cpuset); () where none are leased."""
        return hostres.cpus_of(slots, self.cpus) if self.capacity is not None else ()


def host_setup(settings: Settings, gpu_count: int, on_this_host: bool = True) -> HostSetup:
    memory = HostDefaults(0, settings.default_mem_per_gpu, settings.default_mem)
    if not on_this_host:
        return HostSetup((), None, None, memory)
    capacity = hostinfo.cpu_capacity(settings.cpu_capacity)
    per_gpu = settings.cpus_per_gpu
    if per_gpu is None:
        per_gpu = hostres.auto_cpus_per_gpu(capacity, gpu_count)
    job_ram = hostres.job_ram_bytes(settings.job_ram, hostinfo.mem_total())
    defaults = HostDefaults(per_gpu, settings.default_mem_per_gpu, settings.default_mem)
    return HostSetup(hostinfo.host_cpus(), capacity, job_ram, defaults)
