"""Scheduling policies: the order in which queued jobs are considered, and what a job that
does not fit does to the jobs behind it (pure).

- ``fifo``: submission order, and the first job that does not fit blocks everyone behind it
  (the baseline every other policy is measured against).
- ``fairshare``: higher priority first, then the owner who used fewer GPU-seconds lately,
  then submission order; EASY backfill behind a blocked head (``core.scheduler``).
- ``las``: higher priority first, then least attained service (Tiresias, NSDI'19): a job's
  GPU-seconds so far, discretised into a few queues so that jobs of similar age share
  fairly and short jobs overtake long ones without knowing any job's length. No job
  reserves GPUs; a waiting job of a better queue may preempt preemptible jobs of a worse
  one instead (``core.preempt``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class Policy(StrEnum):
    FIFO = "fifo"
    FAIRSHARE = "fairshare"
    LAS = "las"
    SRPT_PROGRESS = "srpt-progress"


# What the daemon does out of the box (``--policy``); chosen by replaying traces
# (bench/RESULTS.md, "Scheduling policy"): LAS cut the mean job completion time 2-20x
# against FIFO and fairshare on every trace replayed; srpt-progress (issue 25) cut LAS's
# mean by 3-45% on the lab traces and 21% on the Tiresias one under the same guards, with
# a lower p99 on three of four (9% higher on one, still below FIFO's).
DEFAULT_POLICY = Policy.SRPT_PROGRESS


class Backfill(StrEnum):
    NONE = "none"  # the first job that does not fit stops the pass
    EASY = "easy"  # later jobs start only where they cannot delay that one (shadow time)
    GREEDY = "greedy"  # any later job that fits starts; preemption, not reservation, helps


BACKFILL = {
    Policy.FIFO: Backfill.NONE,
    Policy.FAIRSHARE: Backfill.EASY,
    Policy.LAS: Backfill.GREEDY,
    Policy.SRPT_PROGRESS: Backfill.GREEDY,
}

# The policies that preempt running jobs for waiting ones (``core.preempt``).
PREEMPTING = frozenset({Policy.LAS, Policy.SRPT_PROGRESS})

# Under ``srpt-progress``, a waiting job preempts a running one of its class only when the
# running one's estimate is more than this many times its own.
SRPT_PREEMPT_FACTOR = 2.0
# The rank of a job ``Order.remaining`` has no estimate for (one GPU-hour, plus its age).
NO_ESTIMATE_S = 3600.0

# GPU-seconds at which a job moves to the next LAS queue: one GPU-hour, then eight. The
# replay (bench/RESULTS.md) chose them; below the first a job counts as short.
LAS_THRESHOLDS: tuple[float, ...] = (3600.0, 8 * 3600.0)


class Orderable(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def owner(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def submitted_at(self) -> float: ...
    @property
    def attained_s(self) -> float: ...


@dataclass(frozen=True)
class Order:
    """How a policy ranks jobs: smaller keys go first."""

    policy: Policy
    usage: Mapping[str, float]  # recent GPU-seconds per owner (fair share)
    thresholds: Sequence[float] = LAS_THRESHOLDS
    # ``srpt-progress``: each job's estimated remaining GPU-seconds, by id, and the owners
    # above their fair-share band (``core.scheduler.policy_progress``).
    remaining: Mapping[int, float] = field(default_factory=dict)
    over_band: frozenset[str] = frozenset()
    preempt_factor: float = SRPT_PREEMPT_FACTOR

    def key(self, job: Orderable) -> tuple[float, ...]:
        if self.policy is Policy.FIFO:
            return (job.submitted_at, job.id)
        if self.policy is Policy.SRPT_PROGRESS:
            # Between equal estimates (new jobs of unknown length), fair share decides.
            share = self.usage.get(job.owner, 0.0)
            return (*self.rank(job), share, job.submitted_at, job.id)
        if self.policy is Policy.LAS:
            # Within a queue, fair share between users, then submission order.
            queue = las_queue(job.attained_s, self.thresholds)
            share = self.usage.get(job.owner, 0.0)
            return (-job.priority, queue, share, job.submitted_at, job.id)
        return (-job.priority, self.usage.get(job.owner, 0.0), job.submitted_at, job.id)

    @property
    def backfill(self) -> Backfill:
        return BACKFILL[self.policy]

    def rank(self, job: Orderable) -> tuple[float, ...]:
        """A job's class for preemption (smaller is better): priority, then LAS queue
        (``srpt-progress``: above the band or not, then the estimate)."""
        if self.policy is Policy.SRPT_PROGRESS:
            left = self.remaining.get(job.id, NO_ESTIMATE_S + job.attained_s)
            return (-job.priority, int(job.owner in self.over_band), left)
        return (-job.priority, las_queue(job.attained_s, self.thresholds))

    def outranks(self, waiting: Orderable, running: Orderable) -> bool:
        """Whether ``waiting`` may take the GPUs of ``running`` (``core.preempt``)."""
        mine, theirs = self.rank(waiting), self.rank(running)
        if self.policy is Policy.SRPT_PROGRESS and mine[:-1] == theirs[:-1]:
            return theirs[-1] > self.preempt_factor * mine[-1]
        return theirs > mine


def las_queue(attained_s: float, thresholds: Sequence[float] = LAS_THRESHOLDS) -> int:
    """Which LAS queue a job with ``attained_s`` GPU-seconds is in (0: the least served)."""
    return bisect_right(list(thresholds), attained_s)
