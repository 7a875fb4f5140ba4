"""Placers: which GPUs a job that may start gets (pure).

The seam where placement is decided: ``placer_for`` is the one place that picks a placer
for a job: a share by memory, the best-connected set where the hardware's links are known
(or the job asks for a link class or a GPU type), else the first free GPUs.
A placer answers with plain data: the GPUs (or None where the job does not fit now), and
it records what it placed in the pass's ``MemoryPool``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import combinations
from math import comb
from typing import TYPE_CHECKING, Protocol

from ddpq.core.sharing import MemoryPool
from ddpq.core.topology import CLASSES, NO_HARDWARE, Hardware

if TYPE_CHECKING:
    from ddpq.core.scheduler.model import QueuedJob


class Placer(Protocol):
    def choose(
        self,
        job: QueuedJob,
        free: Sequence[int],
        pool: MemoryPool,
        *,
        only: Collection[int] | None = None,
        idle: bool = True,
    ) -> tuple[int, ...] | None:
        """The GPUs ``job`` gets, or None where it does not fit now. ``free``: the GPUs
        free whole, in hand-out order; ``pool``: every GPU's memory and its sharers;
        ``only``: only these GPUs; ``idle=False``: only GPUs that are shared already."""
        ...

    def take(self, job: QueuedJob, gpus: tuple[int, ...], pool: MemoryPool) -> None:
        """Record that ``job`` was placed on ``gpus``."""
        ...


class FirstFree:
    """Whole GPUs, the first free ones: what every job that does not share gets."""

    def choose(
        self,
        job: QueuedJob,
        free: Sequence[int],
        pool: MemoryPool,
        *,
        only: Collection[int] | None = None,
        idle: bool = True,
    ) -> tuple[int, ...] | None:
        return tuple(free[: job.gpus]) if job.gpus <= len(free) else None

    def take(self, job: QueuedJob, gpus: tuple[int, ...], pool: MemoryPool) -> None:
        pool.block(gpus)  # no sharing job may join a GPU held whole


class MemorySharing:
    """A share of GPUs by memory (``--gpu-mem``), as ``core.sharing`` places it: GPUs
    shared already first, tightest fit first, then idle ones."""

    def choose(
        self,
        job: QueuedJob,
        free: Sequence[int],
        pool: MemoryPool,
        *,
        only: Collection[int] | None = None,
        idle: bool = True,
    ) -> tuple[int, ...] | None:
        sharer = job.sharer
        assert sharer is not None, "only jobs that share GPUs by memory"
        return pool.choose(sharer, job.gpus, free, only=only, idle=idle)

    def take(self, job: QueuedJob, gpus: tuple[int, ...], pool: MemoryPool) -> None:
        sharer = job.sharer
        assert sharer is not None, "only jobs that share GPUs by memory"
        pool.take(gpus, sharer)


# Beyond this many candidate sets, sets are grown greedily from each GPU instead.
MOST_SETS = 5000


class BestConnected(FirstFree):
    """Whole GPUs, the free set whose members are best linked (``Hardware.cost``: worst
    link, then all links, then NUMA nodes spanned); of equal sets, the one that breaks the
    fewest good links among the GPUs left free (``Hardware.damage``), so a one-GPU job
    takes a GPU whose partners are busy, or a poorly linked one, and the next 2-GPU job
    still finds an NVLink pair. Only GPUs of the job's ``gpu_type``; a job with a
    ``gpu_link`` class gets no set with a worse link (it waits)."""

    def __init__(self, hardware: Hardware) -> None:
        self.hw = hardware

    def choose(
        self,
        job: QueuedJob,
        free: Sequence[int],
        pool: MemoryPool,
        *,
        only: Collection[int] | None = None,
        idle: bool = True,
    ) -> tuple[int, ...] | None:
        allowed = free if only is None else [g for g in free if g in only]
        candidates = self.hw.of_type(allowed, job.gpu_type, job.gpus)
        if job.gpus > len(candidates):
            return None
        if job.gpus == 0:
            return ()
        best = best_set(self.hw, candidates, job.gpus, free)
        if job.gpu_link is not None and self.hw.worst(best) > CLASSES.index(job.gpu_link):
            return None
        return best


def best_set(
    hw: Hardware, candidates: Sequence[int], n: int, free: Sequence[int]
) -> tuple[int, ...]:
    """The best set of ``n`` of ``candidates`` (at least ``n`` of them), sorted."""
    if n == 1:
        return (min(candidates, key=lambda g: (hw.damage((g,), free), g)),)
    sets: Iterable[tuple[int, ...]]
    if comb(len(candidates), n) <= MOST_SETS:
        sets = combinations(sorted(candidates), n)
    else:
        sets = [_grown(hw, g, candidates, n) for g in candidates]
    return min(sets, key=lambda s: (hw.cost(s), hw.damage(s, free), s))


def _grown(hw: Hardware, seed: int, candidates: Sequence[int], n: int) -> tuple[int, ...]:
    """A set grown from ``seed`` by adding, each time, the GPU best linked to it."""
    members = [seed]
    rest = [g for g in candidates if g != seed]
    while len(members) < n:
        nxt = min(
            rest,
            key=lambda c: (
                max(hw.link_rank(c, m) for m in members),
                sum(hw.link_rank(c, m) for m in members),
                c,
            ),
        )
        members.append(nxt)
        rest.remove(nxt)
    return tuple(sorted(members))


FIRST_FREE = FirstFree()
MEMORY_SHARING = MemorySharing()


def placer_for(job: QueuedJob, hardware: Hardware = NO_HARDWARE) -> Placer:
    """The one place the placer is chosen: a share of GPUs by memory, the best-connected
    whole GPUs where there is hardware to place by, else the first free whole GPUs."""
    if job.mem_bytes is not None:
        return MEMORY_SHARING
    if hardware.known or job.gpu_type is not None or job.gpu_link is not None:
        return BestConnected(hardware)
    return FIRST_FREE
