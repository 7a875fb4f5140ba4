"""Elastic jobs in the worker's pass (``core.scheduler.elastic`` decides): the running
ones asked to grow onto GPUs nobody waits for, or to shrink for a waiting job instead of
being preempted whole; what a job waiting for GPUs is told of them; and the line each
one's history gets once it starts on its new size."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ddpq.config import Settings
from ddpq.core.limits import Limits, OwnerUse
from ddpq.core.preempt import Guards
from ddpq.core.scheduler import elastic
from ddpq.store import limits as limit_store
from ddpq.store import resizes as resize_store
from ddpq.store.db import Session
from ddpq.store.supervision import RunningView

log = logging.getLogger("ddpq.worker")

Held = Mapping[int, tuple[list[int], int | None]]  # job -> (its GPUs, its port)


def guards(cfg: Settings) -> Guards:
    """The thrashing guards of preemptions and resizes alike."""
    return Guards(cfg.preempt_min_run_s, cfg.max_preemptions)


def resizable(active: Sequence[RunningView], held: Held, now: float) -> list[elastic.Resizable]:
    """The running elastic jobs, with the resize asked of each if one is under way."""
    return [
        elastic.Resizable(
            j.id,
            len(held.get(j.id, ([], None))[0]),
            j.gpus,
            most,
            j.started_at or now,
            j.preemptions,
            j.resize_to,  # None unless a resize is under way (a lease clears it)
            j.owner,
        )
        for j in active
        if (most := resizable_most(j)) is not None
    ]


def resizable_most(job: RunningView) -> int | None:
    """An elastic job's most GPUs, if it can be resized: if the preemption signal reaches
    it (one that is not preemptible would never be asked, and a shrink counted on it
    would never come). None: not elastic, or not resizable."""
    return job.gpus_max if job.preemptible else None


def least(active: Sequence[RunningView]) -> dict[int, int]:
    """Each running resizable elastic job's least GPUs."""
    return {j.id: j.gpus for j in active if resizable_most(j) is not None}


def leaving(job: RunningView, held: int) -> int:
    """GPUs a job being stopped gives back: all it holds, or, resized, the difference
    (fewer than none when it grows: it takes more when it comes back)."""
    return held - (job.resize_to or 0)


def ask(s: Session, wanted: Mapping[int, tuple[int, str]]) -> None:
    for job_id in resize_store.request_resizes(s, wanted):
        log.info("job %s: %s", job_id, wanted[job_id][1])


def ask_shrinks(s: Session, shrinks: Sequence[elastic.Shrink]) -> None:
    ask(s, {x.victim: (x.size, f"shrinking to {x.size} GPUs for job {x.for_job}") for x in shrinks})


def ask_grows(
    s: Session,
    cfg: Settings,
    someone_waits: bool,
    active: Sequence[RunningView],
    held: Held,
    free: int,
    now: float,
) -> None:
    """Grow running elastic jobs onto ``free`` GPUs while no queued job waits for GPUs;
    GPUs a grow under way will take are not free for another."""
    jobs = resizable(active, held, now)
    if not jobs:
        return
    coming = sum(j.resize_to - j.held for j in jobs if j.resize_to and j.resize_to > j.held)
    room = owner_room(limit_store.limits(s), active, held)
    sizes = elastic.grow(jobs, free - coming, someone_waits, now, guards(cfg), room)
    ask(s, {job_id: (size, f"growing to {size} GPUs") for job_id, size in sizes.items()})


def owner_room(limits: Limits, active: Sequence[RunningView], held: Held) -> dict[str, int]:
    """The GPUs each owner with a GPU limit may still take (``core.limits``: distinct GPUs,
    a GPU two of its jobs share by memory counted once)."""
    use = OwnerUse((j.owner, held.get(j.id, ([], None))[0]) for j in active)
    room: dict[str, int] = {}
    for owner in {j.owner for j in active}:
        cap = limits.of(owner).gpus
        if cap is not None:
            room[owner] = cap - len(use.held(owner))
    return room


def with_note(
    reasons: Mapping[int, str],
    stopped_by: Mapping[int, str],
    active: Sequence[RunningView],
    held: Held,
    now: float,
) -> dict[int, str]:
    """The waiting reasons, those of jobs waiting for GPUs told of an elastic job that
    gives some up, or could."""
    said = elastic.note(resizable(active, held, now))
    if said is None:
        return dict(reasons)
    return {
        i: f"{why}; {said}" if stopped_by.get(i) == "backfill" else why
        for i, why in reasons.items()
    }


def note_resized(
    s: Session, resized: Mapping[int, int], leased: Mapping[int, int], now: float
) -> None:
    """After the lease: each job that was being resized (``resized``: job -> the size
    asked) and has started (``leased``: job -> its GPUs now) says how it changed."""
    started = {i: n for i, n in leased.items() if i in resized}
    resize_store.note_resized(s, started, now)
