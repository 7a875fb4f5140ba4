"""Sharing GPUs by memory (pure): what a job reserves, what the GPUs have room for, and
what the jobs were measured to use.

A job submitted with ``--gpu-mem 10G`` reserves 10 GiB on each of its GPUs instead of the
GPUs themselves. Such jobs may share a GPU while the sum of their reservations, plus what
is held there outside them (processes in no ddpq job, and a sharing job's use beyond its
reservation), fits in its memory less a headroom; at most ``--gpu-share N`` jobs on a GPU
where one of them asks so. A whole-GPU job never shares: a GPU holds one whole-GPU job or
any number of sharing jobs, never both (the lease table refuses it too, see
``store.leases``).

``--gpu-mem auto`` reserves what the job was measured to need: the peak of the last
successful run of the same job (same owner, same name or command) and of every attempt
since, plus a margin. Without such a run it gets a whole GPU, and its peak is learned.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ddpq.core.gpus import Gpu

MIB = 1 << 20
# Less than a CUDA context takes (~300 MiB): a smaller reservation can only be a mistake.
MIN_GPU_MEM = 128 * MIB
# The most any one GPU is asked for (and the most any bookkeeping here adds up).
MAX_GPU_MEM = 1 << 50
MAX_GPU_SHARE = 64
AUTO = "auto"


@dataclass(frozen=True)
class GpuMemory:
    """What the planner knows of each GPU's memory, in bytes.

    ``total``: every GPU of the host (a GPU missing here is never shared). ``outside``:
    what is held on each that no live reservation covers (``outside_bytes``).
    ``headroom``: kept free on every shared GPU (fragmentation, the driver, a sample
    that came late)."""

    total: Mapping[int, int] = field(default_factory=dict)
    outside: Mapping[int, int] = field(default_factory=dict)
    headroom: int = 0

    def capacity(self, gpu: int) -> int:
        """What reservations may add up to on ``gpu`` with nothing outside (0: none)."""
        return max(0, self.total.get(gpu, 0) - self.headroom)

    def room(self, gpu: int) -> int:
        """What reservations may add up to on ``gpu`` now."""
        return max(0, self.capacity(gpu) - self.outside.get(gpu, 0))

    def can_ever_hold(self, mem_bytes: int, gpus: int) -> bool:
        """Whether ``gpus`` GPUs of this host could ever each take ``mem_bytes``."""
        return sum(1 for g in self.total if self.capacity(g) >= mem_bytes) >= gpus

    def largest(self) -> int:
        return max((self.capacity(g) for g in self.total), default=0)


NO_MEMORY = GpuMemory()


@dataclass(frozen=True)
class Sharer:
    """A job holding a share of GPUs: its reservation on each, and its ``--gpu-share``."""

    mem_bytes: int
    share_cap: int | None


class MemoryPool:
    """The shared GPUs during one planning pass: reservations, sharers and their caps.

    ``whole``: GPUs held (or placed) whole, which no sharing job may join.
    """

    def __init__(
        self,
        memory: GpuMemory,
        sharers: Iterable[tuple[Sequence[int], Sharer]],
        whole: Collection[int],
    ) -> None:
        self.memory = memory
        self.whole = set(whole)
        self.reserved: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.cap: dict[int, int] = {}
        for gpus, sharer in sharers:
            self.take(gpus, sharer)

    def shared(self) -> set[int]:
        """GPUs that sharing jobs hold: no whole-GPU job may take them."""
        return {g for g, n in self.count.items() if n > 0}

    def block(self, gpus: Iterable[int]) -> None:
        self.whole.update(gpus)

    def take(self, gpus: Iterable[int], sharer: Sharer) -> None:
        for g in gpus:
            self.reserved[g] = self.reserved.get(g, 0) + sharer.mem_bytes
            self.count[g] = self.count.get(g, 0) + 1
            if sharer.share_cap is not None:
                self.cap[g] = min(self.cap.get(g, sharer.share_cap), sharer.share_cap)

    def left(self, gpu: int) -> int:
        """Room left for another reservation on ``gpu`` (negative: over, e.g. outside use
        grew after the jobs there started)."""
        return self.memory.room(gpu) - self.reserved.get(gpu, 0)

    def fits(self, gpu: int, sharer: Sharer) -> bool:
        if gpu in self.whole or gpu not in self.memory.total:
            return False
        if self.left(gpu) < sharer.mem_bytes:
            return False
        after = self.count.get(gpu, 0) + 1
        caps = [c for c in (self.cap.get(gpu), sharer.share_cap) if c is not None]
        return all(after <= c for c in caps)

    def choose(
        self,
        sharer: Sharer,
        gpus: int,
        whole_free: Collection[int],
        *,
        only: Collection[int] | None = None,
        idle: bool = True,
    ) -> tuple[int, ...] | None:
        """The ``gpus`` GPUs to place a sharing job on, or None where it does not fit.

        GPUs other jobs share already come first, tightest fit first (the whole GPUs
        stay whole for the jobs that need them); then idle ones, those no whole-GPU job
        may take (``whole_free`` lacks them: they run outside processes) before those it
        could. ``only``: only these GPUs; ``idle=False``: only GPUs shared already."""
        candidates = [
            g
            for g in self.memory.total
            if self.fits(g, sharer)
            and (only is None or g in only)
            and (idle or self.count.get(g, 0) > 0)
        ]

        def preference(g: int) -> tuple[int, int, int]:
            shared = self.count.get(g, 0) > 0
            group = 0 if shared else (1 if g not in whole_free else 2)
            return (group, self.left(g) - sharer.mem_bytes, g)

        chosen = sorted(candidates, key=preference)[:gpus]
        return tuple(sorted(chosen)) if len(chosen) == gpus else None


# ---- measured: what the jobs' processes hold ------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One look at the host's GPUs' memory, in bytes: each GPU's size and what is used on
    it (NVML's device figures), and what each job's processes hold on each GPU."""

    total: Mapping[int, int]
    used: Mapping[int, int]
    use: Mapping[tuple[int, int], int] = field(default_factory=dict)

    @classmethod
    def of(cls, devices: Sequence[Gpu], pids_by_job: Mapping[int, Collection[int]]) -> Measured:
        return cls(
            {d.index: d.memory_total_mb * MIB for d in devices},
            {d.index: d.memory_used_mb * MIB for d in devices},
            job_use(devices, pids_by_job),
        )

    @classmethod
    def idle(cls, gpus: Iterable[int], size: int = 16 << 30) -> Measured:
        """GPUs of ``size`` with nothing on them (where nothing was measured)."""
        indices = list(gpus)
        return cls(dict.fromkeys(indices, size), dict.fromkeys(indices, 0))


def gpu_memory(
    measured: Measured, sharers: Mapping[int, Mapping[int, int]], headroom: int
) -> GpuMemory:
    """The planner's view of the GPUs' memory: ``sharers`` maps each GPU to the jobs that
    share it and what each reserves there."""
    return GpuMemory(
        dict(measured.total), outside_bytes(measured.used, measured.use, sharers), headroom
    )


def job_use(
    devices: Iterable[Gpu], pids_by_job: Mapping[int, Collection[int]]
) -> dict[tuple[int, int], int]:
    """Bytes each job's processes hold on each GPU, from one NVML sample: ``(job, gpu) ->
    bytes``. A process whose use the driver cannot tell counts 0."""
    owner = {pid: job for job, pids in pids_by_job.items() for pid in pids}
    use: dict[tuple[int, int], int] = {}
    for gpu in devices:
        for proc in gpu.processes:
            job = owner.get(proc.pid)
            if job is not None and proc.used_memory_mb is not None:
                key = (job, gpu.index)
                use[key] = use.get(key, 0) + proc.used_memory_mb * MIB
    return use


def peaks(use: Mapping[tuple[int, int], int]) -> dict[int, int]:
    """Each job's largest use on any one of its GPUs (a reservation is per GPU)."""
    out: dict[int, int] = {}
    for (job, _), used in use.items():
        out[job] = max(out.get(job, 0), used)
    return out


def outside_bytes(
    used: Mapping[int, int],
    use: Mapping[tuple[int, int], int],
    sharers: Mapping[int, Mapping[int, int]],
) -> dict[int, int]:
    """What is held on each GPU that no live reservation covers: the GPU's used memory
    (``used``, NVML's device figure) less, for each job sharing it (``sharers``: GPU ->
    job -> its reservation), as much of that job's use as its reservation covers.

    So processes in no job count, whoever started them (and whether or not NVML could
    match them to a pid), and so does a sharing job's use beyond its reservation."""
    out = {}
    for gpu, total in used.items():
        covered = sum(
            min(use.get((job, gpu), 0), reserved) for job, reserved in sharers.get(gpu, {}).items()
        )
        out[gpu] = max(0, total - covered)
    return out


def auto_reservation(measured: Sequence[int] | None, margin: float) -> int | None:
    """``--gpu-mem auto``: the largest peak of the last successful run and of the attempts
    since (``measured``; None without a successful run), plus ``margin`` (0.1: 10%), in
    whole MiB and at least ``MIN_GPU_MEM``. None: no history, a whole GPU."""
    if not measured:
        return None
    need = max(measured) / MIB * (1.0 + max(0.0, margin))
    # Less a hair: 3000 MiB * 1.1 is 3300.0000000000005 in floating point, not 3301 MiB.
    return min(MAX_GPU_MEM, max(MIN_GPU_MEM, math.ceil(need - 1e-9) * MIB))
