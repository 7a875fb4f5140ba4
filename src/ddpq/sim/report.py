"""The figures of a replay: completion times, queueing, makespan, utilisation, shares."""

from __future__ import annotations

import math
from typing import Any

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
    return {
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
        "user_share": {u: (s / busy if busy else 0.0) for u, s in sorted(by_user.items())},
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def table(rows: list[dict[str, Any]]) -> str:
    """The replays side by side, as a markdown table (hours for long figures)."""
    lines = [
        "| policy | mean JCT | p99 JCT | mean queueing | makespan | GPU use | preemptions/job |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {_h(r['mean_jct'])} | {_h(r['p99_jct'])} | "
            f"{_h(r['mean_queue_delay'])} | {_h(r['makespan'])} | "
            f"{100 * r['gpu_utilisation']:.1f}% | {r['preemptions_per_job']:.2f} |"
        )
    return "\n".join(lines)


def _h(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds:.0f} s" if seconds < 3600 else f"{seconds / 3600:.2f} h"
