"""The last stage: a job that passed every gate starts if it fits and no blocked head is
delayed by it (EASY backfill), per the policy's ``Backfill`` (pure).

The first job in order that does not fit becomes the *head*. ``easy``: later jobs start
on idle GPUs only when that cannot delay the head: their time limit ends before the
head's reserved start (the *shadow time*), or they use only GPUs still spare once the
head starts. A job without a time limit never backfills past a blocked head, and nothing
does when the head's start cannot be bounded (the jobs it waits for have no time limit).
A head that needs particular GPUs (a ``--gpu-type``, a ``--gpu-link`` class) starts at the
first moment the GPUs free by then hold a set its placer takes, not when enough of any kind
are; nothing backfills on GPUs "spare" past such a head (which of them it takes is not
known before), only jobs that end before its shadow time. A job that needs no GPU cannot
delay the head, so it may always start. ``none``: the head stops the pass. ``greedy``: the
head reserves nothing; any later job that fits starts (preemption, not reservation, makes
room for it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import groupby

from ddpq.core.policy import Backfill
from ddpq.core.scheduler.gates import IN_LINE
from ddpq.core.scheduler.model import QueuedJob, RunningJob, expected_end
from ddpq.core.scheduler.placers import placer_for
from ddpq.core.scheduler.state import Pass
from ddpq.core.units import size_for_people


def returns(running: Sequence[RunningJob], now: float) -> list[tuple[float, list[int]]]:
    """The GPUs running jobs give back, soonest first, those due at one moment together.
    A GPU comes back when the last job on it ends (several share one by memory)."""
    back: dict[int, float] = {}
    for job in running:
        for g in job.gpus:
            back[g] = max(back.get(g, now), expected_end(job))
    by_end = sorted(back.items(), key=lambda item: (item[1], item[0]))
    return [(end, [g for g, _ in due]) for end, due in groupby(by_end, key=lambda item: item[1])]


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
    for end, due in returns(running, now):
        if free >= need:
            break
        when = end
        free += len(due)
    if free < need:  # more than exists: the caller refuses such jobs at submit
        return math.inf, 0
    return when, free - need


Fits = Callable[[Sequence[int]], bool]


def shadow_fitting(
    fits: Fits, free_now: Sequence[int], running: Sequence[RunningJob], now: float
) -> float:
    """``shadow`` for a head that needs particular GPUs: the first moment the GPUs free by
    then hold a set it takes (``fits``), every running job using its whole time limit."""
    free = list(free_now)
    if fits(sorted(free)):
        return now
    for end, due in returns(running, now):
        free += due
        if fits(sorted(free)):
            return end
    return math.inf


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
        self.fits: Fits | None = None  # a head that needs particular GPUs: which sets do

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
            self.fits = particular_fit(job, p)
            if self.fits is None:
                self.shadow, self.extra = shadow(self.need, len(p.free), p.live, p.now)
            else:
                self.shadow, self.extra = shadow_fitting(self.fits, p.free, p.live, p.now), 0
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
            left = [g for g in p.free if g not in gpus]
            if self.fits is not None:
                when, extra = shadow_fitting(self.fits, left, trial, p.now), 0
            else:
                when, extra = shadow(self.need, len(left), trial, p.now)
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


def particular_fit(head: QueuedJob, p: Pass) -> Fits | None:
    """For a whole-GPU head with a GPU type or link class: whether a set of free GPUs holds
    one its placer takes (None: any ``need`` GPUs do)."""
    if head.mem_bytes is not None or (head.gpu_type is None and head.gpu_link is None):
        return None
    placer = placer_for(head, p.world.hardware)
    return lambda free: placer.choose(head, free, p.pool) is not None
