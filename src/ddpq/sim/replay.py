"""A trace replayed through the real planner with a simulated clock.

Each event (an arrival, an end, a job crossing into another LAS queue, a job reaching the
minimum run time that makes it preemptible, under ``srpt-progress`` a progress record) is
one scheduling pass: ``core.scheduler.plan`` on the queue as the daemon would build it, then
under a preempting policy ``core.preempt.victims``, exactly the functions the worker calls.
A preempted job keeps the work it did (it checkpointed) and pays ``Guards.restart_cost_s``
when it starts again. Policies see jobs through ``SimJob.seen`` only (no job's length);
``oracle`` is SRPT on the true remaining GPU-time, the bound to compare with. Elastic jobs
grow into idle GPUs and shrink for waiting jobs as ``sim.elastic`` decides, each resize a
restart.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpq.core.policy import LAS_THRESHOLDS, PREEMPTING, Backfill, Order, Policy
from ddpq.core.preempt import DEFAULT_GUARDS, Guards, Running, Waiting, victims
from ddpq.core.rules import Run, recent_usage
from ddpq.core.scheduler import QueuedJob, RunningJob, plan
from ddpq.core.scheduler.policy_progress import History, estimates, over_band
from ddpq.core.topology import NO_HARDWARE, Hardware
from ddpq.sim import elastic
from ddpq.sim.foresee import Forecasts, predict_arrivals
from ddpq.sim.jobs import SimJob
from ddpq.sim.trace import TraceJob

# SRPT on each job's true remaining GPU-time, not a daemon policy: the bound. It preempts
# for any shorter job at once (no minimum run, no cap: only preemptible jobs, each restart
# paid), as the textbook SRPT does.
ORACLE = "oracle"
POLICIES = (*(p.value for p in Policy), ORACLE)
PROGRESS_INTERVAL_S = 60.0

FAIR_SHARE_WINDOW_S = 7 * 24 * 3600.0
EPSILON = 1e-9


@dataclass
class Result:
    jobs: list[SimJob]
    gpus: int
    policy: str
    runs: list[Run] = field(default_factory=list)
    history: History = field(default_factory=History)  # finished jobs' GPU-time
    progress_interval_s: float = PROGRESS_INTERVAL_S
    forecasts: Forecasts | None = None  # starts predicted at submission (``predict``)
    elastic: bool = False  # some job is elastic: grow and shrink passes
    grow_beside_queue: bool = False  # grow into GPUs a pass leaves idle, queue or not


def replay(
    trace: Sequence[TraceJob],
    gpus: int,
    policy: str,
    guards: Guards = DEFAULT_GUARDS,
    thresholds: Sequence[float] = LAS_THRESHOLDS,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
    progress_error: float = 0.0,
    hardware: Hardware = NO_HARDWARE,
    predict: bool = False,
    speedup_exponent: float = elastic.SPEEDUP_EXPONENT,
    grow_beside_queue: bool = False,
) -> Result:
    """Replay ``trace`` on ``gpus`` GPUs under ``policy`` (a ``Policy`` or ``oracle``).
    ``progress_error``: each reporting job's records are off by a factor drawn (per job,
    seeded by its id) from 1 ± this, as if its step count were wrong. ``hardware``: the
    box's links, for the placer (``sim.links`` compares placements). ``predict``: each
    job's start predicted at its submission, kept in ``Result.forecasts`` (``sim.foresee``).
    ``speedup_exponent``: an elastic job on n GPUs works (n / its minimum) ** this as fast.
    ``grow_beside_queue``: elastic jobs also grow into GPUs that no queued job can start on
    now (the first in line needs more), not only when the queue is empty."""
    if policy not in POLICIES:
        raise ValueError(f"no policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == ORACLE:
        guards = Guards(min_run_s=0.0, max_preemptions=2**31, restart_cost_s=guards.restart_cost_s)
    jobs = {
        j.id: SimJob(j, progress_bias=_bias(j.id, progress_error), exponent=speedup_exponent)
        for j in trace
    }
    arrivals = sorted(jobs.values(), key=lambda j: (j.trace.submit_s, j.trace.id))
    queued: list[SimJob] = []
    running: dict[int, SimJob] = {}
    result = Result(list(jobs.values()), gpus, str(policy), progress_interval_s=progress_interval_s)
    result.forecasts = Forecasts() if predict else None
    result.elastic = any(j.elastic for j in trace)
    result.grow_beside_queue = grow_beside_queue
    t = 0.0
    while arrivals or queued or running:
        arrived = []
        while arrivals and arrivals[0].trace.submit_s <= t + EPSILON:
            arrived.append(arrivals.pop(0))
        queued.extend(arrived)
        _schedule(t, queued, running, gpus, guards, thresholds, result, hardware)
        if result.forecasts is not None and arrived:
            _predict(t, arrived, queued, running, gpus, thresholds, result)
        upcoming = _next_events(t, arrivals, queued, running, guards, result, thresholds)
        if not upcoming:
            break  # only jobs that can never fit are left: they stay unfinished
        t = min(upcoming)
        for job in [j for j in running.values() if j.end_at <= t + EPSILON]:
            _end(job, job.end_at, running, result)
    return result


def _predict(
    t: float,
    arrived: list[SimJob],
    queued: list[SimJob],
    running: dict[int, SimJob],
    gpus: int,
    thresholds: Sequence[float],
    result: Result,
) -> None:
    assert result.forecasts is not None
    order = _order(t, queued, running, thresholds, result)

    def key(job: SimJob) -> tuple[float, ...]:
        return order.key(_queued(job))

    interval = result.progress_interval_s
    live = list(running.values())
    in_order = order.backfill is Backfill.NONE
    forecasts = result.forecasts
    predict_arrivals(
        t, arrived, queued, live, gpus, key, result.history, interval, forecasts, in_order
    )


def _bias(job_id: int, error: float) -> float:
    return 1.0 + random.Random(f"progress-error-{job_id}").uniform(-error, error)


def _next_events(
    t: float,
    arrivals: list[SimJob],
    queued: list[SimJob],
    running: dict[int, SimJob],
    guards: Guards,
    result: Result,
    thresholds: Sequence[float],
) -> list[float]:
    events = [j.end_at for j in running.values()]
    if arrivals:
        events.append(arrivals[0].trace.submit_s)
    if result.elastic and (result.grow_beside_queue or not queued):
        free = result.gpus - sum(len(j.gpus) for j in running.values())
        events += elastic.growth_times(running.values(), free, guards.min_run_s)
    if result.policy in (Policy.SRPT_PROGRESS, ORACLE) and queued:
        for job in running.values():
            events.append(job.started_at + guards.min_run_s)  # it becomes preemptible
        if result.policy == Policy.SRPT_PROGRESS and running:
            # Estimates change with new records and service: a look each interval, as
            # the daemon's worker reads progress on a timer (not at each job's record).
            every = result.progress_interval_s
            events.append((math.floor(t / every) + 1) * every)
    if result.policy == Policy.LAS and queued:
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
    guards: Guards,
    thresholds: Sequence[float],
    result: Result,
    hardware: Hardware = NO_HARDWARE,
) -> None:
    for _ in range(2 * (len(queued) + len(running)) + 1):  # each round resizes, preempts or ends
        order = _order(t, queued, running, thresholds, result)
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
        if result.elastic and _shrink(t, queued, running, gpus, order, guards, result):
            continue  # the first in line fits now
        if result.elastic and (result.grow_beside_queue or not queued):
            _grow(t, running, gpus, guards, result)
        if order.policy not in PREEMPTING or not queued:
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


def _grow(t: float, running: dict[int, SimJob], gpus: int, guards: Guards, result: Result) -> None:
    held = {g for j in running.values() for g in j.gpus}
    free = [g for g in range(gpus) if g not in held]
    restarts, _ = elastic.growth(t, running.values(), free, guards)
    for job, wider in restarts:
        _resize(job, wider, t, running, guards, result)


def _shrink(
    t: float,
    queued: list[SimJob],
    running: dict[int, SimJob],
    gpus: int,
    order: Order,
    guards: Guards,
    result: Result,
) -> bool:
    """Elastic jobs give back what the first job in line lacks, if together they can."""
    if not queued:
        return False
    first = min(queued, key=lambda j: order.key(_queued(j)))
    free = gpus - sum(len(j.gpus) for j in running.values())
    resizes = elastic.shrinkage(first.trace.gpus - free, running.values())
    for job, narrower in resizes:
        _resize(job, narrower, t, running, guards, result)
    return bool(resizes)


def _resize(
    job: SimJob,
    on: tuple[int, ...],
    t: float,
    running: dict[int, SimJob],
    guards: Guards,
    result: Result,
) -> None:
    """Checkpoint and restart on other GPUs: the work is kept, the restart paid."""
    _stop(job, t, running, result)
    job.owed_restart_s = guards.restart_cost_s
    job.resizes += 1
    _start(job, on, t, running)


def _order(
    t: float,
    queued: list[SimJob],
    running: dict[int, SimJob],
    thresholds: Sequence[float],
    result: Result,
) -> Order:
    """The policy's order for this pass, from what the daemon would know now."""
    runs = result.runs + [
        Run(j.trace.user, len(j.gpus), j.started_at, None) for j in running.values()
    ]
    usage = recent_usage(runs, t, FAIR_SHARE_WINDOW_S)
    live = [*queued, *running.values()]
    if result.policy == ORACLE:
        truth = {j.trace.id: j.true_remaining(t) for j in live}
        return Order(Policy.SRPT_PROGRESS, usage, thresholds, truth, preempt_factor=1.0)
    policy = Policy(result.policy)
    if policy is not Policy.SRPT_PROGRESS:
        return Order(policy, usage, thresholds)
    seen = [j.seen(t, result.progress_interval_s) for j in live]
    guesses = estimates(seen, result.history, t)
    band = over_band(usage, (j.owner for j in seen))
    return Order(policy, usage, thresholds, guesses, band)


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
    result.runs.append(Run(job.trace.user, len(job.gpus), job.started_at, t))
    del running[job.trace.id]
    job.stop(t, result.progress_interval_s)


def _end(job: SimJob, t: float, running: dict[int, SimJob], result: Result) -> None:
    _stop(job, t, running, result)
    job.finished_at = t
    result.history.add(job.trace.user, job.trace.workload, job.attained_s)


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
