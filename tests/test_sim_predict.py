"""The replay's predicted starts (``sim.foresee``): each job's start predicted at its
submission with the daemon's forecast, against when it started."""

from __future__ import annotations

import json
import subprocess
import sys

from ddpq.core.preempt import Guards
from ddpq.sim import report, trace
from ddpq.sim.replay import replay
from ddpq.sim.trace import TraceJob

GUARDS = Guards(min_run_s=600.0, max_preemptions=3, restart_cost_s=30.0)


def test_a_rate_predicts_the_start_a_time_limit_overstates() -> None:
    # The first job runs 200 s (limit 1000 s) and reports every 60 s; the second arrives
    # at 130 s, once two records give the first one's rate: it ends at 200 s.
    jobs = [
        TraceJob(0, 1, 0.0, 200.0, "u", reports_progress=True, time_limit_s=1000.0),
        TraceJob(1, 1, 130.0, 50.0, "u", time_limit_s=1000.0),
    ]
    result = replay(jobs, 1, "fifo", GUARDS, predict=True)
    assert result.forecasts is not None
    assert result.forecasts.full == {0: 0.0, 1: 200.0}
    assert result.forecasts.limits == {0: 0.0, 1: 1000.0}
    second = report.figures(result)["start_error"]
    assert second["estimates"]["median"] == 0.0
    assert second["time_limits"]["median"] == (1000.0 - 200.0) / (200.0 - 130.0)


def test_limits_are_made_for_jobs_without_one_and_overstate_their_length() -> None:
    jobs = trace.lab(50, 1)
    marked = trace.mark_limits([*jobs[:-1], TraceJob(99, 1, 0.0, 10.0, time_limit_s=7.0)], 1)
    assert marked[-1].time_limit_s == 7.0  # its own, kept
    for j in marked[:-1]:
        assert j.time_limit_s is not None and j.time_limit_s >= 1.5 * j.duration_s
        assert j.time_limit_s % trace.LIMIT_STEP_S == 0


def test_the_command_line_reports_the_error_of_both_predictions() -> None:
    args = ["--lab", "60", "--reports-progress", "0.7", "--policy", "las", "--predict", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "ddpq.sim", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(out.stdout)["start_error"]
    assert set(figures) == {"estimates", "time_limits"}
    assert set(figures["estimates"]) == {"waited", "known", "median", "p90"}
