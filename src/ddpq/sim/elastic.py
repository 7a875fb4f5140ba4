"""Elastic jobs in the replay: when one grows, when one shrinks (docs/elastic.md).

An elastic job asks for a range of GPUs (``TraceJob.gpus``..``gpus_max``) and is queued,
ranked and started as a job of its minimum. It **grows** when GPUs are free and nobody waits
for them: at its start it takes what is free up to its maximum, at no cost; later, once it
has run ``Guards.min_run_s`` since it last started (no thrashing), it is restarted on more
GPUs at its next checkpoint, which costs ``Guards.restart_cost_s`` as any restart does. It
**shrinks** instead of being preempted whole (a shrink is never held back: it gives back
what was lent): when the job ranked first in the queue does
not fit in the free GPUs but does once elastic jobs give back what they hold above their
minimum, the jobs holding most above their minimum give back just enough (each restart
paid). Work scales as ``jobs.speedup``: sub-linearly in GPUs. A growth, like a preemption,
counts against ``Guards.max_preemptions``.

The daemon's own rules (``core.scheduler.elastic``, built beside this replay) differ in two
details: there the GPUs lent to an elastic job go back to any job waiting for GPUs, not only
the first in line; and a job starts wide unless a job ranked ahead of it waits, where here
it starts wide only when the queue is empty after the pass (or, ``--elastic-grow idle``,
into what no queued job can start on).

The decisions only; ``replay`` applies them (each one is a stop and a start).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ddpq.core.preempt import Guards
from ddpq.sim.jobs import SimJob

Resize = tuple[SimJob, tuple[int, ...]]  # a job and the GPUs it runs on from now
EPSILON = 1e-9
# Each GPU beyond the minimum speeds a job up sub-linearly: (n / min) ** this (a flag).
SPEEDUP_EXPONENT = 0.8


def growth(
    t: float, running: Iterable[SimJob], free: Sequence[int], guards: Guards
) -> tuple[list[Resize], list[SimJob]]:
    """With nobody waiting: the free GPUs handed out (oldest submission first) to elastic
    jobs below their maximum. Returns the restarts (jobs that had been running) and the
    jobs started just now that simply start wider (their ``gpus`` extended in place). A
    growth counts against ``guards.max_preemptions``, as it does in the daemon."""
    left = list(free)
    restarts: list[Resize] = []
    widened: list[SimJob] = []
    for job in sorted(running, key=lambda j: (j.trace.submit_s, j.trace.id)):
        room = job.trace.gpus_max - len(job.gpus)
        if not left or not job.trace.elastic or room <= 0:
            continue
        just_started = job.started_at >= t - EPSILON
        stops = job.preemptions + job.resizes
        if not just_started and (
            t - job.started_at < guards.min_run_s or stops >= guards.max_preemptions
        ):
            continue
        extra, left = tuple(left[:room]), left[room:]
        if just_started:
            job.gpus = job.gpus + extra
            job.placed[-1] = job.gpus
            widened.append(job)
        else:
            restarts.append((job, job.gpus + extra))
    return restarts, widened


def shrinkage(need: int, running: Iterable[SimJob]) -> list[Resize]:
    """Elastic jobs giving back GPUs above their minimum, those holding most above it
    first, until ``need`` GPUs are given back; nothing when all together cannot."""
    grown = [j for j in running if j.trace.elastic and len(j.gpus) > j.trace.gpus]
    if need <= 0 or sum(len(j.gpus) - j.trace.gpus for j in grown) < need:
        return []
    out: list[Resize] = []
    for job in sorted(grown, key=lambda j: (j.trace.gpus - len(j.gpus), j.trace.id)):
        if need <= 0:
            break
        give = min(need, len(job.gpus) - job.trace.gpus)
        out.append((job, job.gpus[: len(job.gpus) - give]))
        need -= give
    return out


def growth_times(running: Iterable[SimJob], free: int, min_run_s: float) -> list[float]:
    """When elastic jobs below their maximum may next grow into ``free`` idle GPUs (one
    past its cap on resizes gets a pass that finds nothing to do: harmless)."""
    if free <= 0:
        return []
    return [
        j.started_at + min_run_s
        for j in running
        if j.trace.elastic and len(j.gpus) < j.trace.gpus_max
    ]
