"""Predicted starts in the replay: each job's start as the daemon would predict it at its
submission (``core.scheduler.forecast``, the worker's function), with the same estimates
(progress records, time limits, finished jobs' history) and from time limits alone (what
Slurm's ``squeue --start`` does), kept to compare with when it really starts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpq.core.scheduler.forecast import Job, plan_forward
from ddpq.core.scheduler.policy_progress import History
from ddpq.sim.jobs import SimJob


@dataclass
class Forecasts:
    """Each job's start predicted at its submission: from every estimate, from limits."""

    full: dict[int, float | None] = field(default_factory=dict)
    limits: dict[int, float | None] = field(default_factory=dict)


def predict_arrivals(
    t: float,
    arrived: Sequence[SimJob],
    queued: Sequence[SimJob],
    running: Sequence[SimJob],
    gpus: int,
    key: Callable[[SimJob], Any],
    history: History,
    interval: float,
    into: Forecasts,
    in_order: bool = False,
) -> None:
    """Predict the start of the jobs that ``arrived`` at ``t`` (after the pass at ``t``:
    one it started is predicted at ``t``, as the daemon's first pass would place it)."""
    waiting = {j.trace.id for j in queued}
    if not any(j.trace.id in waiting for j in arrived):
        for j in arrived:
            into.full[j.trace.id] = into.limits[j.trace.id] = t
        return
    ahead = [Job(j.seen(t, interval), j.trace.time_limit_s, j.started_at) for j in running]
    line = [Job(j.seen(t, interval), j.trace.time_limit_s) for j in sorted(queued, key=key)]
    full = plan_forward(gpus, ahead, line, history, t, in_order=in_order)
    limits = plan_forward(gpus, ahead, line, None, t, in_order=in_order)
    for j in arrived:
        i = j.trace.id
        into.full[i], into.limits[i] = (full[i], limits[i]) if i in waiting else (t, t)


def errors(jobs: Sequence[SimJob], predicted: dict[int, float | None]) -> dict[str, float]:
    """Over the jobs that waited: the median and p90 of |predicted - actual start| over
    the wait, and the share of them with a prediction at all (unknown ones excluded)."""
    from ddpq.sim.replay import percentile

    waited = [
        j
        for j in jobs
        if j.first_start is not None
        and j.first_start > j.trace.submit_s
        and j.trace.id in predicted
    ]
    rel = []
    for j in waited:
        guess = predicted[j.trace.id]
        assert j.first_start is not None
        if guess is not None:
            rel.append(abs(guess - j.first_start) / (j.first_start - j.trace.submit_s))
    return {
        "waited": float(len(waited)),
        "known": len(rel) / len(waited) if waited else math.nan,
        "median": percentile(rel, 0.5),
        "p90": percentile(rel, 0.9),
    }
