"""The preemption stage (under ``las``): for which waiting jobs running ones may be asked
to go, and how many GPUs are free for them once the pass's placements start (pure).

``core.preempt`` counts whole GPUs: no job is preempted for a job that shares GPUs by
memory (nor is one that shares them preempted: its GPU would stay shared). Nor for a job
a gate holds back for a reason freed GPUs do not change (its back-off, a limit, a
reservation, the host's cores or memory, or it can never fit here), nor for a member of
a sweep at its cap once this pass's placements start.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from ddpq.core.preempt import Waiting
from ddpq.core.scheduler.model import Placement, Plan, QueuedJob, SweepCaps

# Stages whose reason freed GPUs would not take away.
HOLDS_BACK = frozenset(
    {
        "back_off",
        "never_fits",
        "owner_limits",
        "own_gpus",
        "reservations",
        "running_cap",
        "cpu_cores",
        "host_memory",
    }
)


def waiting_for_gpus(
    queued: Sequence[QueuedJob],
    plan: Plan,
    placements: Sequence[Placement],
    sweep_caps: SweepCaps,
    dropped: Collection[int] = (),
) -> list[Waiting]:
    """The queued jobs that freed GPUs could start. ``placements``: those that really
    start (``plan``'s, less ``dropped``: left out for want of a port after the plan)."""
    placed = {p.job_id for p in placements}
    sweeps_placed: dict[int, int] = {}
    for job in queued:
        if job.id in placed and job.sweep_id is not None:
            sweeps_placed[job.sweep_id] = sweeps_placed.get(job.sweep_id, 0) + 1
    return [
        Waiting(c.id, c.owner, c.priority, c.submitted_at, c.attained_s, c.gpus)
        for c in queued
        if c.id not in placed
        and c.id not in dropped
        and plan.stopped_by.get(c.id) not in HOLDS_BACK
        and c.mem_bytes is None
        and sweep_caps.allows(c.sweep_id, sweeps_placed)
    ]


def free_after(
    usable_gpus: Iterable[int], held: Iterable[Iterable[int]], placements: Sequence[Placement]
) -> int:
    """Usable GPUs nobody holds once ``placements`` start (``held``: each lease's GPUs)."""
    taken = {g for gpus in held for g in gpus}
    taken.update(g for p in placements for g in p.gpus)
    return len(set(usable_gpus) - taken)
