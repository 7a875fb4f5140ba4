"""The last stage: a job that passed every gate starts if it fits and no blocked head is
delayed by it (EASY backfill), per the policy's ``Backfill`` (pure).

The first job in order that does not fit becomes the *head*. ``easy``: later jobs start
on idle GPUs only when that cannot delay the head: their time limit ends before the
head's reserved start (the *shadow time*), or they use only GPUs still spare once the
head starts. A job without a time limit never backfills past a blocked head, and nothing
does when the head's start cannot be bounded (the jobs it waits for have no time limit).
A job that needs no GPU cannot delay the head, so it may always start. ``none``: the
head stops the pass. ``greedy``: the head reserves nothing; any later job that fits
starts (preemption, not reservation, makes room for it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby

from ddpq.core.policy import Backfill
from ddpq.core.scheduler.gates import IN_LINE
from ddpq.core.scheduler.model import QueuedJob, RunningJob, expected_end
from ddpq.core.scheduler.state import Pass
from ddpq.core.units import size_for_people


def shadow(
    need: int, free_now: int, running: Sequence[RunningJob], now: float
) -> tuple[float, int]:
    """When the head can start at the latest, and how many GPUs are spare then.

    Returns ``(shadow_time, extra)``: by ``shadow_time`` at least ``need`` GPUs
    are free even if every running job uses its whole time limit; ``extra`` is
    how many more than ``need`` are free at that moment. ``shadow_time`` is
    ``inf`` when the head waits on a job without a time limit.
    """
    free = free_now
    when = now
    # A GPU comes back when the last job on it ends (several share one by memory).
    back: dict[int, float] = {}
    for job in running:
        for g in job.gpus:
            back[g] = max(back.get(g, now), expected_end(job))

    # GPUs due at the same moment all come back together.
    for end, due in groupby(sorted(back.values())):
        if free >= need:
            break
        when = end
        free += len(list(due))
    if free < need:  # more than exists: the caller refuses such jobs at submit
        return math.inf, 0
    return when, free - need


def next_in_line(job: QueuedJob) -> str:
    """What the head is told. Coarse on purpose (no counts that change every pass), so a
    reason changes, and is written, only when the job's situation really does."""
    plural = "" if job.gpus == 1 else "s"
    if job.mem_bytes is None:
        return f"waiting for {job.gpus} free GPU{plural} (next in line)"
    on = "a GPU" if job.gpus == 1 else f"{job.gpus} GPUs"
    return f"waiting for {size_for_people(job.mem_bytes)} of memory free on {on} (next in line)"


class Line:
    """The head and its shadow time during one pass."""

    def __init__(self, backfill: Backfill) -> None:
        self.backfill = backfill
        self.head_named = False  # whether a job has been told it is next in line
        self.shadow: float | None = None  # set once an ``easy`` head is blocked
        self.need = 0
        self.extra = 0

    def admit(self, job: QueuedJob, gpus: tuple[int, ...] | None, p: Pass) -> str | None:
        """None: ``job`` starts on ``gpus`` now; else why it waits (it passed every gate,
        so it waits for GPUs, or in line behind the head)."""
        if self.shadow is None:
            return None if gpus is not None else self._blocked(job, p)
        if gpus is None:
            return IN_LINE
        return None if self._backfills(job, gpus, p) else IN_LINE

    def _blocked(self, job: QueuedJob, p: Pass) -> str:
        # Not "behind job N" for the rest: the head changes with every start, and a
        # reason that changed for the whole queue on each pass would be a write per job.
        why = IN_LINE if self.head_named else next_in_line(job)
        self.head_named = True
        if self.backfill is Backfill.NONE:
            p.stopped = True  # first come, first served: nobody passes it
        elif self.backfill is Backfill.EASY:
            self.need = job.gpus  # a sharing head: as if it needed its GPUs whole
            self.shadow, self.extra = shadow(self.need, len(p.free), p.live, p.now)
        return why

    def _backfills(self, job: QueuedJob, gpus: tuple[int, ...], p: Pass) -> bool:
        """Whether ``job`` may start on ``gpus`` past the head without delaying it."""
        assert self.shadow is not None
        if job.gpus == 0:
            return True  # holds no GPU the head needs
        if job.time_limit_s is None or self.shadow == math.inf:
            return False
        if job.sharer is not None:
            # It may hold a GPU the head needs, or keep a shared one busy for longer.
            trial = [*p.live, RunningJob(job.id, p.mine(gpus), p.now, job.time_limit_s)]
            left = len([g for g in p.free if g not in gpus])
            when, extra = shadow(self.need, left, trial, p.now)
            if when <= self.shadow:
                self.extra = extra
                return True
            return False
        if p.now + job.time_limit_s <= self.shadow:
            return True
        if job.gpus <= self.extra:
            self.extra -= job.gpus
            return True
        return False
