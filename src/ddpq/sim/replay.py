"""A trace replayed through the real planner with a simulated clock.

Each event (an arrival, an end, a job crossing into another LAS queue, a job reaching the
minimum run time that makes it preemptible) is one scheduling pass: ``core.scheduler.plan`` on
the queue as the daemon would build it, then under LAS ``core.preempt.victims``, exactly the
functions the worker calls. A preempted job keeps the work it did (it checkpointed) and
pays ``Guards.restart_cost_s`` when it starts again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpq.core.policy import LAS_THRESHOLDS, Order, Policy
from ddpq.core.preempt import DEFAULT_GUARDS, Guards, Running, Waiting, victims
from ddpq.core.rules import Run, recent_usage
from ddpq.core.scheduler import QueuedJob, RunningJob, plan
from ddpq.core.topology import NO_HARDWARE, Hardware
from ddpq.sim.trace import TraceJob

FAIR_SHARE_WINDOW_S = 7 * 24 * 3600.0
EPSILON = 1e-9


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
    placed: list[tuple[int, ...]] = field(default_factory=list)  # each attempt's GPUs

    @property
    def end_at(self) -> float:
        return self.started_at + self.overhead_s + (self.trace.duration_s - self.done_s)

    def attained_at(self, t: float) -> float:
        return self.attained_s + len(self.gpus) * (t - self.started_at)


@dataclass
class Result:
    jobs: list[SimJob]
    gpus: int
    policy: Policy
    runs: list[Run] = field(default_factory=list)


def replay(
    trace: Sequence[TraceJob],
    gpus: int,
    policy: Policy,
    guards: Guards = DEFAULT_GUARDS,
    thresholds: Sequence[float] = LAS_THRESHOLDS,
    hardware: Hardware = NO_HARDWARE,
) -> Result:
    """``hardware``: the box's links, for the placer (``sim.links`` compares placements)."""
    jobs = {j.id: SimJob(j) for j in trace}
    arrivals = sorted(jobs.values(), key=lambda j: (j.trace.submit_s, j.trace.id))
    queued: list[SimJob] = []
    running: dict[int, SimJob] = {}
    result = Result(list(jobs.values()), gpus, policy)
    t = 0.0
    while arrivals or queued or running:
        while arrivals and arrivals[0].trace.submit_s <= t + EPSILON:
            queued.append(arrivals.pop(0))
        _schedule(t, queued, running, gpus, policy, guards, thresholds, result, hardware)
        upcoming = _next_events(t, arrivals, queued, running, guards, policy, thresholds)
        if not upcoming:
            break  # only jobs that can never fit are left: they stay unfinished
        t = min(upcoming)
        for job in [j for j in running.values() if j.end_at <= t + EPSILON]:
            _end(job, job.end_at, running, result)
    return result


def _next_events(
    t: float,
    arrivals: list[SimJob],
    queued: list[SimJob],
    running: dict[int, SimJob],
    guards: Guards,
    policy: Policy,
    thresholds: Sequence[float],
) -> list[float]:
    events = [j.end_at for j in running.values()]
    if arrivals:
        events.append(arrivals[0].trace.submit_s)
    if policy is Policy.LAS and queued:
        for job in running.values():
            events.append(job.started_at + guards.min_run_s)  # it becomes preemptible
            above = [x for x in thresholds if x > job.attained_at(t) + EPSILON]
            if above and job.gpus:  # it moves to a worse queue
                events.append(job.started_at + (above[0] - job.attained_s) / len(job.gpus))
    return [e for e in events if e > t + EPSILON]


def _schedule(
    t: float,
    queued: list[SimJob],
    running: dict[int, SimJob],
    gpus: int,
    policy: Policy,
    guards: Guards,
    thresholds: Sequence[float],
    result: Result,
    hardware: Hardware = NO_HARDWARE,
) -> None:
    for _ in range(len(queued) + len(running) + 1):  # each round preempts or ends it
        runs = result.runs + [
            Run(j.trace.user, len(j.gpus), j.started_at, None) for j in running.values()
        ]
        order = Order(policy, recent_usage(runs, t, FAIR_SHARE_WINDOW_S), thresholds)
        waiting = [_queued(j) for j in queued]
        live = [RunningJob(j.trace.id, j.gpus, j.started_at) for j in running.values()]
        placements = plan(
            waiting, range(gpus), live, [], order.usage, t, order=order, hardware=hardware
        )
        by_id = {j.trace.id: j for j in queued}
        for p in placements:
            job = by_id[p.job_id]
            queued.remove(job)
            _start(job, p.gpus, t, running)
        if policy is not Policy.LAS or not queued:
            return
        held = sum(len(j.gpus) for j in running.values())
        wanted = victims(
            [_waiting(j) for j in queued],
            [_running(j, t) for j in running.values()],
            gpus - held,
            order,
            t,
            guards,
        )
        if not wanted:
            return
        for preemption in wanted:
            _preempt(running[preemption.victim], t, running, queued, guards, result)


def _queued(job: SimJob) -> QueuedJob:
    j = job.trace
    return QueuedJob(
        j.id, j.user, j.gpus, j.priority, j.submit_s, needs_port=False, attained_s=job.attained_s
    )


def _waiting(job: SimJob) -> Waiting:
    j = job.trace
    return Waiting(j.id, j.user, j.priority, j.submit_s, job.attained_s, j.gpus)


def _running(job: SimJob, t: float) -> Running:
    j = job.trace
    return Running(
        j.id,
        j.user,
        j.priority,
        j.submit_s,
        job.attained_at(t),
        len(job.gpus),
        job.started_at,
        j.preemptible,
        job.preemptions,
    )


def _start(job: SimJob, gpus: tuple[int, ...], t: float, running: dict[int, SimJob]) -> None:
    job.gpus = gpus
    job.placed.append(gpus)
    job.started_at = t
    job.overhead_s, job.owed_restart_s = job.owed_restart_s, 0.0
    if job.first_start is None:
        job.first_start = t
    running[job.trace.id] = job


def _stop(job: SimJob, t: float, running: dict[int, SimJob], result: Result) -> None:
    held = len(job.gpus) * (t - job.started_at)
    job.attained_s += held
    job.busy_gpu_s += held
    worked = max(0.0, t - job.started_at - job.overhead_s)
    job.done_s = min(job.trace.duration_s, job.done_s + worked)
    result.runs.append(Run(job.trace.user, len(job.gpus), job.started_at, t))
    del running[job.trace.id]
    job.gpus = ()


def _end(job: SimJob, t: float, running: dict[int, SimJob], result: Result) -> None:
    _stop(job, t, running, result)
    job.finished_at = t


def _preempt(
    job: SimJob,
    t: float,
    running: dict[int, SimJob],
    queued: list[SimJob],
    guards: Guards,
    result: Result,
) -> None:
    _stop(job, t, running, result)
    job.preemptions += 1
    job.owed_restart_s = guards.restart_cost_s
    queued.append(job)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..1) of ``values``; nan when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
