"""The host's CPU cores and memory in one scheduling pass (pure): which core slots are
free, how much of the memory given to jobs is held, and whether a job fits in what is left
(``core.hostres`` says what a job holds and which CPUs its slots are).

Asked by the placement stage once a job's GPUs are found (a job that waits for GPUs says
so, and backfill and preemption treat it as before): a job that waits for cores or memory
holds nothing and delays nobody (it is never the head that backfill protects), so a flood
of CPU jobs queues without holding back the GPU jobs behind it.
"""

from __future__ import annotations

from ddpq.core import hostres
from ddpq.core.scheduler.model import HostUse, QueuedJob


class HostPool:
    """``HostUse`` after the jobs placed so far in the pass."""

    def __init__(self, use: HostUse) -> None:
        self.use = use
        capacity = use.capacity or 0
        self.free = [slot for slot in range(capacity) if slot not in use.held]
        self.ram_held = use.ram_held

    def never(self, job: QueuedJob) -> str | None:
        """Why ``job`` can never fit in the host's cores or memory (None: it can)."""
        use = self.use
        return hostres.never_fits(job.cpus, job.ram_bytes, use.capacity, use.job_ram)

    def blocks(self, job: QueuedJob) -> tuple[str, str] | None:
        """The stage that stops ``job`` for the host's cores or memory now, and why (None:
        it fits now)."""
        use = self.use
        if use.capacity is not None and job.cpus > len(self.free):
            held = use.capacity - len(self.free)
            return "cpu_cores", hostres.waiting_for_cores(job.cpus, held, use.capacity)
        ram = job.ram_bytes
        if ram is not None and use.job_ram is not None and self.ram_held + ram > use.job_ram:
            return "host_memory", hostres.waiting_for_ram(ram, use.job_ram)
        return None

    def take(self, job: QueuedJob, near: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """Record ``job`` as placed; the core slots it leases (none where cores are not
        counted), from the CPUs ``near`` its GPUs first."""
        if job.ram_bytes is not None:
            self.ram_held += job.ram_bytes
        if self.use.capacity is None or job.cpus == 0:
            return ()
        slots = hostres.near_first(self.free, job.cpus, self.use.cpus, near)
        self.free = [s for s in self.free if s not in slots]
        return tuple(slots)
