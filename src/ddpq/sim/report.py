"""The figures of a replay: completion times, queueing, makespan, utilisation, shares."""

from __future__ import annotations

import math
from typing import Any

from ddpq.sim.foresee import errors
from ddpq.sim.replay import Result, percentile


def figures(result: Result) -> dict[str, Any]:
    """``mean_jct``/``p99_jct`` (job completion time: end minus submission), the mean
    queueing delay (first start minus submission), the makespan (first submission to last
    end), GPU utilisation (GPU time held, restarts included, over GPUs × makespan),
    preemptions per job, and each user's share of the GPU time held. Seconds throughout."""
    done = [j for j in result.jobs if j.finished_at is not None]
    jct = [j.finished_at - j.trace.submit_s for j in done if j.finished_at is not None]
    delay = [j.first_start - j.trace.submit_s for j in done if j.first_start is not None]
    first = min((j.trace.submit_s for j in result.jobs), default=0.0)
    last = max((j.finished_at for j in done if j.finished_at is not None), default=first)
    makespan = last - first
    busy = sum(j.busy_gpu_s for j in result.jobs)
    by_user: dict[str, float] = {}
    for j in result.jobs:
        by_user[j.trace.user] = by_user.get(j.trace.user, 0.0) + j.busy_gpu_s
    out = {
        "policy": result.policy,
        "gpus": result.gpus,
        "jobs": len(result.jobs),
        "unfinished": len(result.jobs) - len(done),
        "mean_jct": _mean(jct),
        "p99_jct": percentile(jct, 0.99),
        "mean_queue_delay": _mean(delay),
        "makespan": makespan,
        "gpu_utilisation": busy / (result.gpus * makespan) if makespan > 0 else 0.0,
        "preemptions_per_job": _mean([float(j.preemptions) for j in result.jobs]),
        "resizes_per_job": _mean([float(j.resizes) for j in result.jobs]),
        "elastic_jobs": sum(1 for j in result.jobs if j.trace.elastic),
        "user_share": {u: (s / busy if busy else 0.0) for u, s in sorted(by_user.items())},
    }
    if result.forecasts is not None:  # the starts predicted at submission
        out["start_error"] = {
            "estimates": errors(result.jobs, result.forecasts.full),
            "time_limits": errors(result.jobs, result.forecasts.limits),
        }
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def table(rows: list[dict[str, Any]]) -> str:
    """The replays side by side, as a markdown table (hours for long figures)."""
    elastic = any(r.get("elastic_jobs") for r in rows)  # a column for resizes then
    lines = [
        "| policy | mean JCT | p99 JCT | mean queueing | makespan | GPU use | preemptions/job |"
        + (" resizes/job |" if elastic else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if elastic else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {_h(r['mean_jct'])} | {_h(r['p99_jct'])} | "
            f"{_h(r['mean_queue_delay'])} | {_h(r['makespan'])} | "
            f"{100 * r['gpu_utilisation']:.1f}% | {r['preemptions_per_job']:.2f} |"
            + (f" {r['resizes_per_job']:.2f} |" if elastic else "")
        )
    return "\n".join(lines)


def _h(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds:.0f} s" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def start_table(rows: list[dict[str, Any]]) -> str:
    """The predicted starts' error, over the jobs that waited: |predicted - actual| over
    the wait, median and p90, from every estimate and from time limits alone; and the
    share of those jobs with a prediction (unknown ones are not in the figures)."""
    lines = [
        "| policy | jobs that waited | estimates: median | p90 | known "
        "| time limits: median | p90 | known |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, lim = r["start_error"]["estimates"], r["start_error"]["time_limits"]
        lines.append(
            f"| {r['policy']} | {e['waited']:.0f} | {_pct(e['median'])} | {_pct(e['p90'])} | "
            f"{_pct(e['known'])} | {_pct(lim['median'])} | {_pct(lim['p90'])} | "
            f"{_pct(lim['known'])} |"
        )
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"
