"""Placers: which GPUs a job that may start gets (pure).

The seam where placement is decided: ``placer_for`` is the one place that picks a placer
for a job; a topology-aware placer (NVLink islands, one NUMA node) would plug in here.
A placer answers with plain data: the GPUs (or None where the job does not fit now), and
it records what it placed in the pass's ``MemoryPool``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Protocol

from ddpq.core.sharing import MemoryPool

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


FIRST_FREE = FirstFree()
MEMORY_SHARING = MemorySharing()


def placer_for(job: QueuedJob) -> Placer:
    """The one place the placer is chosen: whole GPUs, or a share of them by memory."""
    return FIRST_FREE if job.mem_bytes is None else MEMORY_SHARING
