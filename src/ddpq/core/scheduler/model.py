"""The scheduler's plain data: the jobs it decides on, the world it decides in, and what
it decides (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddpq.core.limits import NO_LIMITS, Limits, Reservation
from ddpq.core.sharing import NO_MEMORY, GpuMemory, Sharer
from ddpq.core.topology import NO_HARDWARE, Hardware


def needs_port(gpus: int, launcher: str) -> bool:
    """Whether a job gets a rendezvous port: torchrun needs one, and so may any job on
    GPUs (a script that starts its own ranks); a plain CPU job does not."""
    return gpus > 0 or launcher == "torchrun"


@dataclass(frozen=True)
class QueuedJob:
    id: int
    owner: str
    gpus: int
    priority: int
    submitted_at: float
    time_limit_s: float | None = None
    not_before: float | None = None  # back-off (a retry, a put-off launch): not before this
    # Only jobs that rendezvous (torchrun, or any job on GPUs) lease a port: a CPU-only
    # helper job must not use up the range that DDP jobs need.
    needs_port: bool = True
    # GPU-seconds of its earlier attempts (the LAS policy ranks by it).
    attained_s: float = 0.0
    sweep_id: int | None = None  # the sweep it belongs to, if any (see SweepCaps)
    # Sharing: bytes it reserves on each of its ``gpus`` GPUs (None: it takes them whole),
    # and the most jobs it lets a GPU it is on take (``--gpu-share``).
    mem_bytes: int | None = None
    share_cap: int | None = None
    # Hardware it asks for (``core.topology``): the link class every pair of its GPUs must
    # have at least (``--gpu-link``: NV, PIX, ...), and a model name or MIG profile.
    gpu_link: str | None = None
    gpu_type: str | None = None
    # The host's CPU cores it leases (0: none, it shares the cores) and the host memory
    # it holds (None: none); resolved from the admin's defaults (``core.hostres``).
    cpus: int = 0
    ram_bytes: int | None = None
    # Elastic (``elastic``): the most GPUs it may be given (``gpus`` is its least; None:
    # exactly ``gpus``), and while it is being resized, the size it takes back (placed
    # before anything else: it was running a moment ago).
    gpus_max: int | None = None
    resize_to: int | None = None

    @property
    def sharer(self) -> Sharer | None:
        return None if self.mem_bytes is None else Sharer(self.mem_bytes, self.share_cap)


@dataclass(frozen=True)
class RunningJob:
    id: int
    gpus: tuple[int, ...]
    started_at: float
    time_limit_s: float | None = None
    owner: str = ""
    mem_bytes: int | None = None  # sharing: its reservation on each of its GPUs
    share_cap: int | None = None


def expected_end(job: RunningJob) -> float:
    """When a running job's time limit ends (inf without one)."""
    if job.time_limit_s is None:
        return math.inf
    return job.started_at + job.time_limit_s


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpus: tuple[int, ...]
    port: int | None
    mem_bytes: int | None = None  # sharing: what it reserves on each GPU
    cores: tuple[int, ...] = ()  # the core slots it leases (``core.hostres``)
    ram_bytes: int | None = None  # the host memory it holds


@dataclass(frozen=True)
class PortBudget:
    """Rendezvous ports one owner may hold at once, and how many each holds now."""

    per_owner: int
    held: Mapping[str, int]

    def allows(self, owner: str, placed: Mapping[str, int]) -> bool:
        return self.held.get(owner, 0) + placed.get(owner, 0) < self.per_owner


NO_PORT_LIMIT = PortBudget(per_owner=2**31, held={})


@dataclass(frozen=True)
class SweepCaps:
    """How many members each capped sweep may run at once (``%K``), and how many hold
    leases now. A sweep absent from ``cap`` has no cap."""

    cap: Mapping[int, int]
    running: Mapping[int, int]

    def allows(self, sweep_id: int | None, placed: Mapping[int, int]) -> bool:
        if sweep_id is None or sweep_id not in self.cap:
            return True
        return self.running.get(sweep_id, 0) + placed.get(sweep_id, 0) < self.cap[sweep_id]


NO_SWEEP_CAPS = SweepCaps(cap={}, running={})


@dataclass(frozen=True)
class HostUse:
    """The host as a pass starts. ``capacity``: core slots there are (None: cores are not
    counted, as where jobs run elsewhere); ``held``: the slots running jobs lease;
    ``job_ram``: the memory jobs may hold in all (None: not counted); ``ram_held``: what
    running jobs hold of it; ``cpus``: the host's CPU ids the slots stand for
    (``core.hostres``), so a GPU job's cores can come from its GPUs' NUMA nodes."""

    capacity: int | None = None
    held: frozenset[int] = field(default_factory=frozenset)
    job_ram: int | None = None
    ram_held: int = 0
    cpus: tuple[int, ...] = ()


NO_HOST = HostUse()


@dataclass(frozen=True)
class World:
    """What one scheduling pass decides in: a snapshot, never changed by the pass.

    ``usable_gpus``: every GPU the policy lets ddpq hand out whole (held or not).
    ``running``: jobs holding leases; their GPUs are not free.
    ``free_ports``: unleased ports in the order they should be used.
    ``port_budget``: how many ports each owner may hold. ``sweep_caps``: ``%K`` of sweeps.
    ``memory``: every GPU's memory, for jobs that share GPUs (``core.sharing``); they may
    use any GPU there, external ones too (what outside processes hold is counted).
    ``limits``, ``reservations``: see ``core.limits``. ``hardware``: links and models.
    ``host``: the host's CPU cores and memory, and what running jobs hold of them.
    """

    usable_gpus: Sequence[int]
    running: Sequence[RunningJob]
    free_ports: Sequence[int]
    now: float
    port_budget: PortBudget = NO_PORT_LIMIT
    sweep_caps: SweepCaps = NO_SWEEP_CAPS
    memory: GpuMemory = NO_MEMORY
    limits: Limits = NO_LIMITS
    reservations: Sequence[Reservation] = ()
    # How the GPUs are linked and what each is (``core.topology``), for the placer.
    hardware: Hardware = NO_HARDWARE
    # The most jobs one owner holds leases for at once (0: no cap), where no admin's limit
    # (``limits``, which wins) names a figure for them: ``gates.running_cap``.
    running_cap: int = 0
    host: HostUse = NO_HOST


@dataclass(frozen=True)
class Plan:
    """What starts now, and for every queued job that does not, why, in words
    (``reasons``) and which stage of the pipeline stopped it (``stopped_by``: a gate's
    name, or ``backfill``)."""

    placements: list[Placement]
    reasons: dict[int, str] = field(default_factory=dict)
    stopped_by: dict[int, str] = field(default_factory=dict)
