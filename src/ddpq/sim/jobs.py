"""A job in the replay: its true state, and what the daemon would see of it.

The replay knows each job's length (``TraceJob.duration_s``) to end it on time; a policy
must not. ``seen`` is the only door from a job to a policy: the GPU-time it has held, the
progress records it wrote (``reports_progress``: its fraction done, every
``progress_interval`` seconds of work), and its owner and workload. ``true_remaining`` is
for the ``oracle`` only, the bound a policy is compared with.

An elastic job (``TraceJob.gpus_max``) may run on more GPUs than it asked for; its
``duration`` is its length on what it asked for, and on n GPUs it works ``speedup`` times
as fast: (n / asked) ** ``exponent``, sub-linear (docs/elastic.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddpq.core.scheduler.policy_progress import RATE_WINDOW, Record, Seen
from ddpq.sim.trace import TraceJob

# The records of earlier attempts a job keeps showing (the newest): enough for a rate.
KEPT_RECORDS = RATE_WINDOW + 1


@dataclass
class SimJob:
    trace: TraceJob
    done_s: float = 0.0  # of its duration, worked off in earlier attempts
    attained_s: float = 0.0  # GPU-seconds held in earlier attempts
    busy_gpu_s: float = 0.0  # GPU time it occupied, restarts included
    first_start: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    owed_restart_s: float = 0.0  # paid at its next start
    # The current attempt, while running:
    started_at: float = 0.0
    overhead_s: float = 0.0
    gpus: tuple[int, ...] = ()
    attempt: int = 0
    records: list[Record] = field(default_factory=list)  # of earlier attempts
    placed: list[tuple[int, ...]] = field(default_factory=list)  # each attempt's GPUs
    # What its progress records multiply its true fraction done by (capped at 1): a job
    # whose step count is wrong. 1: exact.
    progress_bias: float = 1.0
    exponent: float = 1.0  # of an elastic job's speedup on more GPUs than it asked for
    resizes: int = 0  # restarts on another number of GPUs (an elastic job's)

    @property
    def speed(self) -> float:
        """Seconds of its length worked off per second on the GPUs it holds now."""
        return speedup(len(self.gpus), self.trace.gpus, self.exponent)

    @property
    def end_at(self) -> float:
        left = (self.trace.duration_s - self.done_s) / self.speed
        return self.started_at + self.overhead_s + left

    def attained_at(self, t: float) -> float:
        return self.attained_s + len(self.gpus) * (t - self.started_at)

    def worked_at(self, t: float) -> float:
        """Seconds of its length done by ``t``, this attempt's work included."""
        now = max(0.0, t - self.started_at - self.overhead_s) if self.gpus else 0.0
        return min(self.trace.duration_s, self.done_s + now * self.speed)

    def records_at(self, t: float, interval: float) -> list[Record]:
        """The progress records it has written by ``t``: one every ``interval`` seconds
        of this attempt's work (after its restart), each with its fraction done."""
        if not self.trace.reports_progress:
            return []
        out = list(self.records)
        if self.gpus:
            work_from = self.started_at + self.overhead_s
            length = (self.trace.duration_s - self.done_s) / self.speed  # seconds left
            last = math.floor(min(t - work_from, length) / interval)
            for k in range(max(1, last - KEPT_RECORDS + 1), last + 1):
                out.append(self._record(work_from + k * interval, k * interval * self.speed))
        return out[-KEPT_RECORDS:]

    def _record(self, at: float, worked_this_attempt: float) -> Record:
        length = self.trace.duration_s or 1.0
        done = min(1.0, self.progress_bias * (self.done_s + worked_this_attempt) / length)
        return Record(at, done, 1.0, self.attempt)

    def seen(self, t: float, interval: float) -> Seen:
        j = self.trace
        return Seen(
            j.id,
            j.user,
            j.workload,
            j.gpus,
            self.attained_at(t) if self.gpus else self.attained_s,
            bool(self.gpus),
            self.records_at(t, interval),
        )

    def true_remaining(self, t: float) -> float:
        """GPU-seconds of work it has left (the oracle's knowledge, nobody else's)."""
        return (self.trace.duration_s - self.worked_at(t)) * self.trace.gpus

    def stop(self, t: float, interval: float) -> None:
        """This attempt ends at ``t``: its work, service and records are kept."""
        self.records = self.records_at(t, interval)
        held = len(self.gpus) * (t - self.started_at)
        self.attained_s += held
        self.busy_gpu_s += held
        self.done_s = self.worked_at(t)
        self.gpus = ()
        self.attempt += 1


def speedup(held: int, asked: int, exponent: float) -> float:
    """How much faster a job works on ``held`` GPUs than on the ``asked`` its length is
    measured on: (held / asked) ** exponent, 1 when it holds what it asked for (or none)."""
    if held == asked or held == 0 or asked == 0:
        return 1.0
    return float((held / asked) ** exponent)
