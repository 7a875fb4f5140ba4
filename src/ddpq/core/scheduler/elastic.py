"""Elastic jobs (``--gpus 2-4``): the size each attempt takes, when a running one grows,
and when one shrinks rather than being preempted whole (pure).

An elastic job is resized the way a preemptible job is preempted: it is sent its
preemption signal, checkpoints and exits, and its next attempt starts at once on its new
size, its ``DDPQ_GPUS``, ``WORLD_SIZE`` and torchrun's ``--nproc-per-node`` following its
lease. While that happens the job is queued with ``resize_to``: it is placed first in the
next pass (it was running a moment ago; no job behind it takes its place), at that size,
or on what is free if less, never below its least.

- **start** (``choose_sized``): a queued elastic job takes, of the GPUs free, up to its
  most, unless a job ranked ahead of it waits for GPUs: then its least, as a job of that
  size, so it takes no GPU that job waits for.
- **grow** (``grow``): a running one below its most, when GPUs are free once the pass's
  placements start and no queued job waits for GPUs at all.
- **shrink** (``shrink_or_preempt``): what an elastic job holds above its least is lent:
  a queued job waiting for GPUs takes it back, whatever its rank, the elastic job
  shrinking by what that job lacks (under every policy: nobody is preempted, the job is
  given back what it borrowed). Where that is not enough and, under a preempting policy,
  the preemption rule (``core.preempt``) picks an elastic job above its least, it too
  gives up only what the waiting job still lacks, rather than go back to the queue whole.

Against thrashing: a resize waits until the job has run ``Guards.min_run_s`` (the
daemon's ``--preempt-min-run``) since its last start, and counts as one of its
preemptions; it grows no more once it has had ``Guards.max_preemptions`` (a shrink,
which gives back what it was lent, still comes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ddpq.core.policy import Order
from ddpq.core.preempt import (
    DEFAULT_GUARDS,
    Guards,
    Preemption,
    Running,
    Waiting,
    may_be_preempted,
    victims,
    worse_first,
)
from ddpq.core.scheduler.model import QueuedJob
from ddpq.core.scheduler.placement import Choice, choose
from ddpq.core.scheduler.state import Pass


def resizing_first(key: Callable[[QueuedJob], Any]) -> Callable[[QueuedJob], Any]:
    """The policy's order with jobs being resized ahead of every other."""
    return lambda job: (job.resize_to is None, key(job))


def choose_sized(job: QueuedJob, p: Pass, ahead_waits: bool) -> tuple[QueuedJob, Choice]:
    """The job as it would start (an elastic one with ``gpus`` its size now) and its GPUs.

    ``ahead_waits``: a job ranked ahead of it waits for GPUs. An elastic job tries its
    largest size first, then smaller ones down to its least (a size whose GPUs are not
    of the type or links it asks for may be found at a smaller one)."""
    if job.gpus_max is None:
        return job, choose(job, p)
    want = job.resize_to or (job.gpus if ahead_waits else job.gpus_max)
    top = max(job.gpus, min(want, job.gpus_max, len(p.free)))
    for size in range(top, job.gpus, -1):
        if p.limited and p.owners.blocks(job.owner, size, p.world.limits, shares=False):
            continue  # its owner's GPU limit allows its least (a gate said so), not this
        sized = replace(job, gpus=size)
        chosen = choose(sized, p)
        if chosen.gpus is not None:
            return sized, chosen
    return job, choose(job, p)


@dataclass(frozen=True)
class Resizable:
    """A running elastic job as the resize rules see it."""

    id: int
    held: int  # GPUs its attempt holds now
    least: int
    most: int
    started_at: float  # this attempt's start
    preemptions: int  # resizes included
    resize_to: int | None = None  # a resize asked for and not done yet
    owner: str = ""


def may_grow(job: Resizable, now: float, guards: Guards) -> bool:
    """Whether the thrashing guards let ``job`` grow now."""
    return (
        job.resize_to is None
        and job.preemptions < guards.max_preemptions
        and now - job.started_at >= guards.min_run_s
    )


def grow(
    running: Sequence[Resizable],
    free: int,
    someone_waits: bool,
    now: float,
    guards: Guards = DEFAULT_GUARDS,
    room: Mapping[str, int] | None = None,
) -> dict[int, int]:
    """The running elastic jobs to grow, each to its new size, onto ``free`` GPUs that
    nobody holds; none while a queued job waits for GPUs (``someone_waits``), which the
    free ones are kept for. Earliest submitted first; each takes
    what it lacks of its most, as far as they go, and as its owner's GPU limit allows
    (``room``: the GPUs each limited owner may still take)."""
    if someone_waits:
        return {}
    left = dict(room or {})
    out: dict[int, int] = {}
    for job in sorted(running, key=lambda j: j.id):
        more = min(job.most - job.held, free, left.get(job.owner, free))
        if more > 0 and may_grow(job, now, guards):
            out[job.id] = job.held + more
            free -= more
            if job.owner in left:
                left[job.owner] -= more
    return out


@dataclass(frozen=True)
class Shrink:
    victim: int
    size: int  # its next attempt's GPUs
    for_job: int


def shrink_or_preempt(
    waiting: Sequence[Waiting],
    running: Sequence[Running],
    least: Mapping[int, int],
    free: int,
    order: Order,
    now: float,
    guards: Guards = DEFAULT_GUARDS,
    preempt: bool = True,
) -> tuple[list[Shrink], list[Preemption]]:
    """For each waiting job in order that lacks GPUs: the GPUs elastic jobs hold above
    their least (``least``, by id) are lent, and come back to it, whatever its rank, as
    shrinks, where they are enough; else ``core.preempt.victims``, an elastic victim that
    can give what the job still lacks and keep its least shrunk by that much rather than
    preempted whole. ``preempt=False`` (a policy that preempts nobody): lent GPUs only."""
    shrinks: list[Shrink] = []
    out: list[Preemption] = []
    taken: set[int] = set()
    for job in sorted(waiting, key=order.key):
        if job.gpus <= free:
            free -= job.gpus  # it will start once the GPUs come back
            continue
        left = [r for r in running if r.id not in taken]
        lent = lent_back(job, left, least, job.gpus - free, order, now, guards)
        whole: list[Preemption] = []
        if lent:
            free = 0
        elif preempt:
            lent, whole, spare = instead_of_whole(job, left, least, free, order, now, guards)
            if lent or whole:
                free = spare  # what the last victim freed beyond the job's need
        shrinks.extend(lent)
        out.extend(whole)
        taken.update([x.victim for x in lent] + [p.victim for p in whole])
    return shrinks, out


def lent_back(
    job: Waiting,
    running: Sequence[Running],
    least: Mapping[int, int],
    short: int,
    order: Order,
    now: float,
    guards: Guards,
) -> list[Shrink]:
    """The shrinks that give ``job`` the ``short`` GPUs it lacks from what elastic jobs
    hold above their least (those that have run ``guards.min_run_s``; the worst ranked,
    then the latest started, first), or none if they hold too few."""
    lenders = sorted(
        (r for r in running if may_lend(r, least, now, guards)),
        key=lambda r: (worse_first(order, r), -r.started_at, -r.id),
    )
    if sum(r.gpus - least[r.id] for r in lenders) < short:
        return []
    out = []
    for r in lenders:
        if short <= 0:
            break
        give = min(r.gpus - least[r.id], short)
        out.append(Shrink(r.id, r.gpus - give, job.id))
        short -= give
    return out


def may_lend(job: Running, least: Mapping[int, int], now: float, guards: Guards) -> bool:
    """Whether elastic ``job`` holds GPUs above its least that it may give back now."""
    return job.id in least and job.gpus > least[job.id] and now - job.started_at >= guards.min_run_s


def anyone_may_give(
    running: Sequence[Running],
    least: Mapping[int, int],
    now: float,
    guards: Guards = DEFAULT_GUARDS,
    preempt: bool = True,
) -> bool:
    """Whether any running job may give GPUs to a waiting one, by a shrink or (``preempt``)
    a preemption. Most passes none may (no job has run ``min_run_s``, none is preemptible):
    then ``shrink_or_preempt`` finds nothing for any waiting job, however long the queue,
    and its caller need not read what it would have needed."""
    return any(
        may_lend(r, least, now, guards) or (preempt and may_be_preempted(r, now, guards))
        for r in running
    )


def instead_of_whole(
    job: Waiting,
    running: Sequence[Running],
    least: Mapping[int, int],
    free: int,
    order: Order,
    now: float,
    guards: Guards,
) -> tuple[list[Shrink], list[Preemption], int]:
    """``victims`` for ``job``, each elastic victim that can give what the job still lacks
    and keep its least shrunk by that much instead; and the GPUs left over once it starts."""
    by_id = {r.id: r for r in running}
    short = job.gpus - free
    shrinks: list[Shrink] = []
    whole: list[Preemption] = []
    for chosen in victims([job], running, free, order, now, guards):
        victim = by_id[chosen.victim]
        keep = victim.gpus - short
        if victim.id in least and keep >= least[victim.id]:
            shrinks.append(Shrink(victim.id, keep, job.id))
            short = 0
        else:
            whole.append(chosen)
            short -= victim.gpus
    return shrinks, whole, max(0, -short)


def note(running: Sequence[Resizable]) -> str | None:
    """What a job waiting for GPUs is told of the elastic jobs that could give some up:
    one shrinking for it, else one above its least (None: neither)."""
    for job in running:
        if job.resize_to is not None and job.resize_to < job.held:
            return f"elastic job {job.id} is shrinking to {job.resize_to} GPUs"
    for job in running:
        if job.resize_to is None and job.held > job.least:
            extra = job.held - job.least
            return f"elastic job {job.id} holds {extra} GPU{'s' * (extra > 1)} above its least"
    return None
