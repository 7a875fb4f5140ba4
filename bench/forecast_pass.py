"""What the estimates and the predicted starts cost a worker pass over a big queue.

    PYTHONPATH=src:. python bench/forecast_pass.py [--jobs 10000] [--passes 20]

An in-process worker (the tests' rig: the real loop and store, the fake executor, a
hand-moved clock) on 4 fake GPUs, all held by running jobs, with ``--jobs`` 1-GPU jobs
queued. Times passes in which the forecast (and ``srpt-progress``'s estimates) is made
(the clock moved past ``FORECAST_EVERY_S``) and passes in which it is not, under ``las``
and ``srpt-progress``, and the forecast's own part (``Foresight.forecast`` and
``srpt_order``, timed around the calls). Prints a markdown table (milliseconds, median of
``--passes``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.worker.rig import Rig, make_rig

from ddpq.core.policy import Policy
from ddpq.core.spec import JobSpec
from ddpq.store import jobs as job_store
from ddpq.worker.forecast import FORECAST_EVERY_S


def fill(rig: Rig, jobs: int) -> None:
    for i in range(4):
        rig.submit(name=f"run{i}", time_limit_s=3600.0)
    rig.step()  # the 4 GPUs are taken
    with rig.api.write() as s:
        for i in range(jobs):
            spec = JobSpec(name=f"q{i}", owner=f"user{i % 4}", command=["true"], cwd="/", gpus=1)
            job_store.create_job(s, spec, rig.clock())


def timed(rig: Rig, passes: int, advance: float) -> float:
    took = []
    for _ in range(passes):
        rig.clock.advance(advance)
        t0 = time.perf_counter()
        rig.step()
        took.append(1000 * (time.perf_counter() - t0))
    return statistics.median(took)


class Stopwatch:
    """Wraps one of ``Foresight``'s methods: the milliseconds each call took."""

    def __init__(self, method: Any) -> None:
        self.method, self.took = method, list[float]()

    def __call__(self, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.method(*args)
        finally:
            self.took.append(1000 * (time.perf_counter() - t0))


def measure(policy: Policy, jobs: int, passes: int) -> tuple[float, float, float]:
    """The median pass when the forecast is due, between, and the forecast's own share
    (with srpt-progress's estimates) of a pass when it is due."""
    with tempfile.TemporaryDirectory() as home:
        rig = make_rig(Path(home) / "home", fake_gpus=4, policy=policy)
        try:
            sight = rig.worker.scheduler.foresight
            watches = [Stopwatch(sight.forecast), Stopwatch(sight.srpt_order)]
            sight.forecast, sight.srpt_order = watches  # type: ignore[method-assign,assignment]
            fill(rig, jobs)
            rig.step()
            for w in watches:
                w.took.clear()
            due = timed(rig, passes, FORECAST_EVERY_S + 0.5)
            own = [a + b for a, b in zip(*(w.took or [0.0] * passes for w in watches), strict=True)]
            quiet = timed(rig, passes, 0.01)
            return due, quiet, statistics.median(own)
        finally:
            rig.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    print(
        f"| policy, {args.jobs} queued | pass when the forecast is due | of which the "
        "forecast (and estimates) | pass between |"
    )
    print("|---|---|---|---|")
    for policy in (Policy.LAS, Policy.SRPT_PROGRESS):
        due, quiet, own = measure(policy, args.jobs, args.passes)
        print(f"| {policy.value} | {due:.1f} ms | {own:.1f} ms | {quiet:.1f} ms |")


if __name__ == "__main__":
    main()
