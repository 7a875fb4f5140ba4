"""The placement stage: the placer's choice of GPUs, and the gates that need it (pure).

``own_gpus``: a sharing job whose owner is at the GPU limit may still join GPUs its owner
holds already; where none has room, that limit is why it waits. ``reservations``: a job
may take no GPU a reservation needs (``core.limits``); a sharing job refused idle GPUs
tries GPUs shared already, which a reservation counts as taken anyway.

Then the host's CPU cores and memory (``host.HostPool``): a job whose GPUs are found but
that waits for them (``cpu_cores``, ``host_memory``) holds nothing and is never the head
that backfill protects; one that could never fit here says so first (``never_fits``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ddpq.core.scheduler.model import QueuedJob
from ddpq.core.scheduler.placers import placer_for
from ddpq.core.scheduler.state import Pass
from ddpq.core.topology import describe_class

# The stage's name for a job that waits for GPUs of its type or link class while enough
# others are free: it still waits for GPUs, so backfill makes it the head it protects.
HARDWARE_WAIT = "hardware"


@dataclass(frozen=True)
class Choice:
    """The GPUs a job would get now (None: it does not fit), or the gate that refused
    them and why."""

    gpus: tuple[int, ...] | None
    stopped_by: str | None = None
    reason: str | None = None


def choose(job: QueuedJob, p: Pass) -> Choice:
    never = p.host.never(job)
    if never is not None:
        return Choice(None, "never_fits", never)
    chosen = _gpus(job, p)
    if chosen.gpus is not None:
        host = p.host.blocks(job)
        if host is not None:
            return Choice(None, *host)
    return chosen


def _gpus(job: QueuedJob, p: Pass) -> Choice:
    hw = p.world.hardware
    placer = placer_for(job, hw)
    limits = p.world.limits
    own = p.owners.only_own(job.owner, job.gpus, limits) if job.sharer else None
    only: Collection[int] | None = own
    if job.sharer and job.gpu_type is not None:  # its placer knows no types: only those
        only = hw.of_type(sorted(p.usable if own is None else own), job.gpu_type, job.gpus)
    gpus = placer.choose(job, p.free, p.pool, only=only)
    if gpus is None and job.sharer is None and (job.gpu_type or job.gpu_link):
        why = hardware_wait(job, p)
        if why is not None:
            return Choice(None, HARDWARE_WAIT, why)
    if gpus is None and own is not None:
        limit = limits.of(job.owner).gpus
        assert limit is not None
        return Choice(None, "own_gpus", p.owners.gpu_limit_reason(job.owner, limit))
    if gpus is None or job.gpus == 0 or not p.calendar:
        return Choice(gpus)
    end = p.end_of(job)
    kept = p.calendar.blocks(job.owner, gpus, end)
    if kept is not None and job.sharer is not None:
        # On GPUs other jobs share already, it may take none a reservation needs.
        other = placer.choose(job, p.free, p.pool, only=only, idle=False)
        if other is not None and p.calendar.blocks(job.owner, other, end) is None:
            return Choice(other)
    if kept is not None:
        return Choice(None, "reservations", p.calendar.reason(kept, end))
    return Choice(gpus)


def hardware_wait(job: QueuedJob, p: Pass) -> str | None:
    """Why a job that asks for a GPU type or link class waits although enough GPUs are
    free (None: too few are free at all, which backfill says)."""
    if len(p.free) < job.gpus:
        return None
    hw = p.world.hardware
    typed = hw.of_type(p.free, job.gpu_type, job.gpus)
    kind = f" of type {job.gpu_type!r}" if job.gpu_type else ""
    if len(typed) < job.gpus:
        return f"waiting for {job.gpus} free GPUs{kind} ({len(typed)} free now)"
    assert job.gpu_link is not None
    return (
        f"waiting for {job.gpus} free GPUs{kind} linked by {describe_class(job.gpu_link)} "
        f"or better ({len(typed)} free, no such set among them)"
    )
