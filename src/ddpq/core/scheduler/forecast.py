"""When each queued job is expected to start (pure): the queue run forward in simulated
time, in the policy's order, with each job's expected length.

A job's length comes from the same estimates ``srpt-progress`` ranks by
(``policy_progress``): its own measured rate over its progress records; else the mean
remaining GPU-time of the finished jobs of its class that ran longer than it has
(``expected_left``), over its GPUs; either capped by its time limit; else its time limit;
else unknown.
``limits_only`` is Slurm's ``squeue --start``: time limits alone, the baseline the replay
compares with.

The forward run is conservative backfill over whole GPUs: each job, in order, starts at
the earliest time its GPUs are free for its whole expected length, given the running
jobs' expected ends and the starts already forecast for the jobs ahead of it, and holds
them from then. A job of unknown length holds its GPUs for ever; a job that can never get
its GPUs (a running job of unknown end holds them) is unknown (None), and holds nothing.
What it leaves out, on purpose: gates other than GPUs (limits, caps, ports, sharing by
memory, host cores), later arrivals and preemptions; an elastic job counts at its size now
(a running one at the GPUs it holds, a queued one at its least), never grown or shrunk.
Work is bounded: ``limit`` jobs, each one walk of a profile of at most
``2 × (running + limit)`` steps.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpq.core.scheduler.policy_progress import History, Seen, remaining_s

# The most queued jobs forecast per pass (the first in the policy's order); the others'
# start is unknown. Keeps a pass over a flood of jobs cheap.
MAX_FORECAST = 500


def done_of(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """A progress record's ``(done, total)``: epochs (with the step within a training
    epoch, as ``ddpq ls`` draws its bar), else steps, else a ``fraction`` of 1; None when
    it says none of them, or says them wrongly (not numbers, not finite, total ≤ 0)."""
    try:
        if "epochs" in record and "epoch" in record:
            total, epoch = float(record["epochs"]), float(record["epoch"])
            steps, step = float(record.get("steps") or 0), float(record.get("step") or 0)
            training = record.get("phase") == "train" and steps > 0
            done = epoch - 1 + step / steps if training else epoch
        elif "steps" in record and "step" in record:
            total, done = float(record["steps"]), float(record["step"])
        elif "fraction" in record:
            total, done = 1.0, float(record["fraction"])
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(total) and math.isfinite(done)) or total <= 0:
        return None
    return max(0.0, min(done, total)), total


def expected_left(ordered: Sequence[float], sums: Sequence[float], attained: float) -> float | None:
    """E[S - a | S > a] for a job that has had ``attained`` GPU-seconds, whose total is
    distributed as ``ordered`` (sorted; ``sums`` its prefix sums); None when no finished
    job of the history ran longer."""
    first = bisect_right(ordered, attained)
    n = len(ordered) - first
    if n == 0:
        return None
    return (sums[len(ordered)] - sums[first]) / n - attained


@dataclass(frozen=True)
class Job:
    """A job as the forecast sees it: what the policy sees (``seen``), and its time limit
    and start (a running job's; None for a queued one)."""

    seen: Seen
    time_limit_s: float | None = None
    started_at: float | None = None
    not_before: float | None = None


def length_left(job: Job, history: History | None, now: float) -> float | None:
    """Seconds ``job`` is expected to run from ``now`` (a running one) or from its start (a
    queued one): its measured rate's, else its class's history's, either capped by its
    time limit; else its time limit; else None. ``history`` None: its time limit alone."""
    seen = job.seen
    begun = job.started_at if job.started_at is not None else now
    limit = None if job.time_limit_s is None else max(0.0, begun + job.time_limit_s - now)
    if history is None:
        return limit
    left = remaining_s(seen.records, now, seen.running) if seen.records else None
    if left is None:
        ordered, sums = history.samples(seen.owner, seen.workload)
        gpu_s = expected_left(ordered, sums, seen.attained_s)
        left = None if gpu_s is None else gpu_s / max(1, seen.gpus)
    if left is None or limit is None:
        return limit if left is None else left
    return min(left, limit)


class Profile:
    """Free whole GPUs over time: ``free[i]`` from ``times[i]`` to ``times[i + 1]`` (the
    last for ever)."""

    def __init__(self, now: float, free: int) -> None:
        self.times = [now]
        self.free = [free]

    def _cut(self, t: float) -> int:
        """The index of the step that starts at ``t`` (made if needed)."""
        i = bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return i
        self.times.insert(i, t)
        self.free.insert(i, self.free[i - 1])
        return i

    def change(self, start: float, end: float, gpus: int) -> None:
        """``gpus`` more free from ``start`` to ``end`` (fewer, if negative)."""
        i = self._cut(max(start, self.times[0]))
        j = self._cut(end) if math.isfinite(end) else len(self.times)
        for k in range(i, j):
            self.free[k] += gpus

    def earliest(self, gpus: int, length: float | None, after: float) -> float | None:
        """The first time from ``after`` when ``gpus`` are free for ``length`` seconds
        (None: for ever); None if never."""
        start: float | None = None
        for i, t in enumerate(self.times):
            end = self.times[i + 1] if i + 1 < len(self.times) else math.inf
            if end <= after:
                continue
            if self.free[i] < gpus:
                start = None
                continue
            if start is None:
                start = max(t, after)
            if length is not None and end - start >= length:
                return start
        return start


def forecast(
    total_gpus: int,
    running: Sequence[tuple[int, float | None]],
    queue: Sequence[tuple[int, int, float | None, float | None]],
    now: float,
    limit: int = MAX_FORECAST,
    in_order: bool = False,
) -> dict[int, float | None]:
    """Each queued job's expected start. ``running``: (GPUs, expected end or None);
    ``queue``, in the policy's order: (id, GPUs, expected length or None, not before).
    ``in_order``: no job starts before the one ahead of it (``fifo``: no backfill)."""
    profile = Profile(now, total_gpus - sum(g for g, _ in running))
    for gpus, end in running:
        if end is not None:
            profile.change(max(end, now), math.inf, gpus)
    out: dict[int, float | None] = {}
    floor: float | None = now  # in order: the start of the job ahead (None: unknown)
    for k, (job_id, gpus, length, not_before) in enumerate(queue):
        if k >= limit or gpus > total_gpus or floor is None:
            out[job_id] = None
            continue
        after = max(now, not_before or now, floor if in_order else now)
        start = profile.earliest(gpus, length, after) if gpus else after
        out[job_id] = start
        if in_order:
            floor = start
        if start is not None and gpus:
            profile.change(start, math.inf if length is None else start + length, -gpus)
    return out


def plan_forward(
    total_gpus: int,
    running: Sequence[Job],
    queued: Sequence[Job],
    history: History | None,
    now: float,
    limit: int = MAX_FORECAST,
    in_order: bool = False,
) -> dict[int, float | None]:
    """``forecast`` with each job's length estimated (``length_left``); ``queued`` in the
    policy's order. Only the first ``limit`` queued jobs' lengths are estimated."""
    ends = [
        (j.seen.gpus, None if (left := length_left(j, history, now)) is None else now + left)
        for j in running
    ]
    head = [
        (j.seen.id, j.seen.gpus, length_left(j, history, now), j.not_before) for j in queued[:limit]
    ]
    out = forecast(total_gpus, ends, head, now, limit, in_order)
    out.update({j.seen.id: None for j in queued[limit:]})
    return out
