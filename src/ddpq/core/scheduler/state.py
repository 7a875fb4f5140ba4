"""One scheduling pass's bookkeeping: the world as it stands after the jobs placed so far
in the pass (pure). Gates and stages read it; only ``Pass.place`` changes it."""

from __future__ import annotations

import math

from ddpq.core.limits import Calendar, OwnerUse
from ddpq.core.scheduler.host import HostPool
from ddpq.core.scheduler.model import (
    Placement,
    QueuedJob,
    RunningJob,
    World,
    expected_end,
)
from ddpq.core.scheduler.placers import placer_for
from ddpq.core.sharing import MemoryPool, Sharer


class Pass:
    """``free``: GPUs free whole, in the order they are handed out; ``pool``: the GPUs'
    memory and sharers; ``ports``: ports left; ``live``: what holds usable GPUs and until
    when (for the backfill's shadow time); ``owners``/``calendar``: limits and
    reservations; ``host``: the host's free core slots and memory;
    ``ports_placed``/``sweeps_placed``: counted against budgets and caps.
    ``stopped``: a head that nobody may pass (``fifo``) has been met."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.now = world.now
        self.usable = set(world.usable_gpus)
        running = world.running
        whole_held = {g for job in running if job.mem_bytes is None for g in job.gpus}
        self.pool = MemoryPool(
            world.memory,
            [
                (job.gpus, Sharer(job.mem_bytes, job.share_cap))
                for job in running
                if job.mem_bytes is not None
            ],
            whole_held,
        )
        self.free = sorted(self.usable - whole_held - self.pool.shared())
        self.ports = list(world.free_ports)
        self.host = HostPool(world.host)
        # Only usable GPUs come back to the pool when a running job ends: one that
        # holds GPUs the policy has since made external frees none of those.
        self.live = [
            RunningJob(
                job.id,
                tuple(g for g in job.gpus if g in self.usable),
                job.started_at,
                job.time_limit_s,
            )
            for job in running
        ]
        self.owners = OwnerUse((job.owner, job.gpus) for job in running)
        self.limited = world.limits.any  # asked once: most hosts set no limit
        self.calendar = Calendar(
            world.reservations,
            self.usable,
            ((j.owner, j.gpus, expected_end(j)) for j in running),
            self.now,
        )
        self.ports_placed: dict[str, int] = {}
        self.sweeps_placed: dict[int, int] = {}
        self.placements: list[Placement] = []
        self.stopped = False

    def end_of(self, job: QueuedJob) -> float:
        """When ``job``'s time limit would end if it started now (inf without one)."""
        return math.inf if job.time_limit_s is None else self.now + job.time_limit_s

    def mine(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """The usable ones of ``gpus`` (those that come back to the pool)."""
        return tuple(g for g in gpus if g in self.usable)

    def place(self, job: QueuedJob, gpus: tuple[int, ...]) -> Placement:
        port = self.ports.pop(0) if job.needs_port else None
        if port is not None:
            self.ports_placed[job.owner] = self.ports_placed.get(job.owner, 0) + 1
        if job.sweep_id is not None:
            self.sweeps_placed[job.sweep_id] = self.sweeps_placed.get(job.sweep_id, 0) + 1
        placer_for(job, self.world.hardware).take(job, gpus, self.pool)
        cores = self.host.take(job, self.world.hardware.near_cpus(gpus))
        self.free[:] = [g for g in self.free if g not in gpus]
        self.owners.take(job.owner, gpus)
        self.calendar.take(job.owner, gpus, self.end_of(job))
        self.live.append(RunningJob(job.id, self.mine(gpus), self.now, job.time_limit_s))
        placement = Placement(job.id, gpus, port, job.mem_bytes, cores, job.ram_bytes)
        self.placements.append(placement)
        return placement
