"""The replay as the daemon sees it: durations hidden from the policy, progress records,
``srpt-progress`` against ``oracle`` (SRPT on the true remaining time)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core.policy import Policy
from ddpq.core.preempt import Guards
from ddpq.core.scheduler.policy_progress import Seen
from ddpq.sim import report, trace
from ddpq.sim.jobs import SimJob
from ddpq.sim.replay import ORACLE, replay
from ddpq.sim.trace import TraceJob

GUARDS = Guards(min_run_s=600, max_preemptions=3, restart_cost_s=30)


def job(i: int, submit: float, duration: float, progress: bool = False, gpus: int = 1) -> TraceJob:
    return TraceJob(i, gpus, submit, duration, "u", reports_progress=progress, workload="w")


def starts(trace_jobs: list[TraceJob], policy: str) -> dict[int, float]:
    """When each job first started, of those that started by the time a job first ended."""
    result = replay(trace_jobs, 1, policy, GUARDS)
    first_end = min(j.finished_at for j in result.jobs if j.finished_at is not None)
    started: dict[int, float] = {-1: first_end}
    for j in result.jobs:
        if j.first_start is not None and j.first_start <= first_end:
            started[j.trace.id] = j.first_start
    return started


def test_the_policy_never_sees_a_duration() -> None:
    """Two traces alike in all the daemon could see (the same jobs, arrivals, owners, and
    each job's progress until the first end), but for the lengths of the jobs that report
    nothing: every decision until the first end is the same. The oracle, which peeks,
    decides differently: the test can tell a policy that peeks."""
    common = [job(0, 0, 1000, progress=True)]
    a = [*common, job(1, 1, 50), job(2, 2, 5000), job(3, 3, 300)]
    b = [*common, job(1, 1, 4000), job(2, 2, 20), job(3, 3, 9000)]
    assert starts(a, Policy.SRPT_PROGRESS) == starts(b, Policy.SRPT_PROGRESS)
    assert starts(a, ORACLE) != starts(b, ORACLE)
    seen = {f.name for f in fields(Seen)}
    assert not seen & {"duration_s", "trace", "end_at", "done_s"}


def test_progress_records_are_the_fraction_done_every_interval_of_work() -> None:
    sim = SimJob(job(0, 0, 600, progress=True))
    sim.gpus, sim.started_at = (0,), 100.0
    got: list[tuple[float, object]] = [(r.at, r.done) for r in sim.records_at(250, 60)]
    assert got == [(160, pytest.approx(0.1)), (220, pytest.approx(0.2))]
    sim.stop(250, 60)  # preempted: resumes at 1000 after a 30 s restart
    sim.gpus, sim.started_at, sim.overhead_s = (0,), 1000.0, 30.0
    again: list[tuple[float, object, int]] = [
        (r.at, r.done, r.attempt) for r in sim.records_at(1100, 60)
    ]
    assert again[-1] == (1090, pytest.approx((150 + 60) / 600), 1)
    assert again[-2][2] == 0  # the first attempt's records are kept
    assert SimJob(job(1, 0, 600)).records_at(1100, 60) == []  # it reports nothing


def test_srpt_progress_preempts_a_long_reporting_job_for_a_new_one() -> None:
    """The long job (10,000 s) reports: at 700 s its rate leaves 9,300 s, more than twice
    the hour a new job is taken to need, so it goes. Near its end (2,000 s: 1,300 left) it
    stays. One that reports nothing, with no history, ranks as an hour plus what it has
    had: it stays until that is twice the new one's hour (its look at 3,660 s)."""
    new = job(1, 700, 100)
    long_job = replay([job(0, 0, 10_000, progress=True), new], 1, "srpt-progress", GUARDS)
    assert long_job.jobs[0].preemptions == 1 and long_job.jobs[1].finished_at == 800
    near_end = replay([job(0, 0, 2000, progress=True), new], 1, "srpt-progress", GUARDS)
    assert near_end.jobs[0].preemptions == 0 and near_end.jobs[1].first_start == 2000
    silent = replay([job(0, 0, 10_000), new], 1, "srpt-progress", GUARDS)
    assert silent.jobs[0].preemptions == 1 and silent.jobs[1].first_start == 3660


def test_the_oracle_is_srpt_on_the_true_remaining_time_without_the_guards() -> None:
    """The bound: a shorter job preempts at once (no minimum run), and the preempted one
    pays its 30 s restart. 0 (100 s) runs from 0; 1 (50 s) takes its GPU at 1; 2 (10 s)
    takes it from 1 at 2 and ends at 12; then 1 (49 left) to 12 + 30 + 49 = 91, and 0
    (99 left) to 91 + 30 + 99 = 220."""
    jobs = [job(0, 0, 100), job(1, 1, 50), job(2, 2, 10)]
    result = replay(jobs, 1, ORACLE, Guards(min_run_s=1000, max_preemptions=0))
    assert [j.finished_at for j in result.jobs] == [pytest.approx(x) for x in (220, 91, 12)]
    assert [j.preemptions for j in result.jobs] == [1, 1, 0]
    unpreemptible = [replace(job(0, 0, 100), preemptible=False), job(1, 1, 50)]
    assert replay(unpreemptible, 1, ORACLE).jobs[1].first_start == 100


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 500), st.integers(1, 300), st.booleans()),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from([Policy.SRPT_PROGRESS.value, ORACLE]),
)
def test_every_job_finishes_and_pays_each_restart(
    shape: list[tuple[int, int, int, bool]], policy: str
) -> None:
    jobs = [
        TraceJob(i, g, s, d, f"u{i % 3}", reports_progress=p, workload=f"w{i % 2}")
        for i, (g, s, d, p) in enumerate(shape)
    ]
    result = replay(jobs, 4, policy, Guards(20, 2, 5), progress_interval_s=10)
    assert report.figures(result)["unfinished"] == 0
    for j in result.jobs:
        held, paid = j.busy_gpu_s / j.trace.gpus, j.trace.duration_s + 5 * j.preemptions
        if policy == ORACLE:  # no minimum run: a restart can itself be cut short
            assert j.trace.duration_s - 1e-6 <= held <= paid + 1e-6
        else:
            assert held == pytest.approx(paid, abs=1e-6) and j.preemptions <= 2


def test_the_trace_column_and_the_lab_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,num_gpu,submit_time,duration,reports_progress\n0,1,0,10,1\n1,1,0,9,\n")
    assert [j.reports_progress for j in trace.read(path)] == [True, False]
    path.write_text("job_id,num_gpu,submit_time,duration,reports_progress\n0,1,0,10,yes\n")
    with pytest.raises(trace.TraceError, match=r"t\.csv:2: reports_progress is 0 or 1"):
        trace.read(path)
    lab = trace.lab(400, seed=3)
    assert lab == trace.lab(400, seed=3) and len({j.workload for j in lab}) > 1
    marked = trace.mark_progress(lab, 0.7, seed=3)
    assert 0.6 < sum(j.reports_progress for j in marked) / len(marked) < 0.8
    trace.write(marked, path)
    assert trace.read(path) == marked


def test_the_command_line_compares_the_new_policy_with_the_oracle() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddpq.sim",
            "--lab",
            "40",
            "--reports-progress",
            "0.7",
            "--policy",
            "srpt-progress",
            "--policy",
            "oracle",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    ours, oracle = json.loads(out.stdout)
    assert ours["policy"] == "srpt-progress" and oracle["policy"] == "oracle"
    assert ours["unfinished"] == oracle["unfinished"] == 0
    bad = subprocess.run(
        [sys.executable, "-m", "ddpq.sim", "--lab", "5", "--progress-interval", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--progress-interval" in bad.stderr
