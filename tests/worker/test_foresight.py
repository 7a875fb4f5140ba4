"""What the worker knows ahead, in process: the progress samples it keeps, ``srpt-progress``
ranking by them (and preempting within the guards), and each queued job's predicted start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from ddpq.core.policy import Policy
from ddpq.core.states import JobState
from ddpq.store import progress as progress_store
from ddpq.store.models import Job, ProgressSample
from ddpq.worker.forecast import HISTORY_TTL_S
from tests.worker.rig import Rig, make_rig


def report(rig: Rig, job_id: int, step: int, steps: int) -> None:
    """The job writes a progress record; the worker reads it at its next look."""
    folder = rig.job(job_id).job_dir
    assert folder is not None
    Path(folder).mkdir(parents=True, exist_ok=True)
    with (Path(folder) / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "steps": steps}) + "\n")


def run_steps(rig: Rig, job_id: int, steps: int, upto: int, every_s: float) -> None:
    for step in range(1, upto + 1):
        rig.clock.advance(every_s)
        report(rig, job_id, step, steps)
        rig.step()


def predicted(rig: Rig, job_id: int) -> float | None:
    with rig.api.read() as s:
        return s.scalar(select(Job.predicted_start).where(Job.id == job_id))


@pytest.fixture
def srpt(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(
        tmp_path / "srpt",
        fake_gpus=1,
        policy=Policy.SRPT_PROGRESS,
        preempt_min_run_s=600.0,
        max_preemptions=2,
    )
    yield r
    r.close()


def test_the_worker_keeps_a_few_samples_per_job_with_its_clock(srpt: Rig) -> None:
    job = srpt.submit(preemptible=True)
    srpt.step()
    run_steps(srpt, job, 1000, 12, 10.0)
    with srpt.api.read() as s:
        kept = s.scalar(select(func.count()).where(ProgressSample.job_id == job))
        records = progress_store.records_of(s, [job])[job]
    assert kept == progress_store.KEPT
    assert [r.done for r in records] == [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
    assert records[-1].at == srpt.clock() and records[-1].total == 1000.0


def test_a_slow_reporting_job_is_preempted_for_a_new_one_after_its_minimum_run(
    srpt: Rig,
) -> None:
    slow = srpt.submit(preemptible=True)
    srpt.step()
    run_steps(srpt, slow, 1000, 10, 70.0)  # 700 s run, ~99,000 s left at its pace
    newcomer = srpt.submit()  # no progress, no history: ranked at one GPU-hour
    srpt.step()
    assert srpt.job(slow).stop_request == "preempt"
    assert srpt.job(newcomer).state is JobState.QUEUED


def test_a_job_near_its_end_is_not_preempted(srpt: Rig) -> None:
    nearly = srpt.submit(preemptible=True)
    srpt.step()
    run_steps(srpt, nearly, 12, 10, 70.0)  # 2 steps of 70 s left: 140 s
    newcomer = srpt.submit()
    srpt.step()
    assert srpt.job(nearly).stop_request is None
    # It waits for the job ahead, whose end its rate tells: 140 s from the last record.
    start = predicted(srpt, newcomer)
    assert start is not None and abs(start - (srpt.clock() + 140.0)) < 1e-6


def test_a_queued_job_is_predicted_from_the_time_limit_ahead_of_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "las", fake_gpus=1, policy=Policy.LAS)
    try:
        first = rig.submit(time_limit_s=300.0)
        rig.step()
        began = rig.clock()
        second = rig.submit(time_limit_s=100.0)
        third = rig.submit()
        rig.clock.advance(5.0)
        rig.step()
        assert predicted(rig, second) == began + 300.0
        assert predicted(rig, third) == began + 400.0
        rig.host.finish(first, 0)
        rig.clock.advance(5.0)
        rig.step()  # the second starts; the third now waits for its limit
        assert rig.job(second).state is JobState.RUNNING
        assert predicted(rig, third) == rig.clock() + 100.0
    finally:
        rig.close()


def test_each_job_keeps_its_own_newest_samples(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "two", fake_gpus=2)
    try:
        one, two = rig.submit(), rig.submit()
        rig.step()
        for step in range(1, 9):
            rig.clock.advance(10.0)
            report(rig, one, step, 100)
            if step <= 3:
                report(rig, two, step, 100)
            rig.step()
        with rig.api.read() as s:
            records = progress_store.records_of(s, [one, two])
        assert [r.done for r in records[one]] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
        assert [r.done for r in records[two]] == [1.0, 2.0, 3.0]  # untouched by one's
    finally:
        rig.close()


def test_a_job_held_back_by_what_the_forecast_does_not_model_has_no_start(
    tmp_path: Path,
) -> None:
    """Two GPUs but one rendezvous port: the second job waits for the port, not for a
    GPU, so the GPU-only forecast cannot say when it starts (not "now")."""
    rig = make_rig(tmp_path / "ports", fake_gpus=2, policy=Policy.LAS, port_range=(29600, 29600))
    try:
        first = rig.submit(gpus=1, time_limit_s=300.0)
        second = rig.submit(gpus=1, time_limit_s=300.0)
        rig.clock.advance(5.0)
        rig.step()
        assert rig.job(first).state is not JobState.QUEUED
        assert rig.job(second).state is JobState.QUEUED
        assert predicted(rig, second) is None
    finally:
        rig.close()


def test_a_flood_of_short_jobs_does_not_hold_back_another_users_new_job(srpt: Rig) -> None:
    """Bob's short jobs have a history that ranks them near zero; alice's first job has
    none (an hour, or no estimate at all between two rankings). He has used far more than
    her lately, so hers starts at the next free GPU, ahead of all of his (by hand: 1,500 of
    his held hers 73 s)."""
    for _ in range(6):  # bob's history: 6 s jobs
        done = srpt.submit(owner="bob")
        srpt.step()
        srpt.clock.advance(6.0)
        srpt.host.finish(done)
        srpt.step()
    flood = [srpt.submit(owner="bob") for _ in range(10)]
    srpt.clock.advance(HISTORY_TTL_S)  # history read again, estimates made: bob's ~6 s
    srpt.step()
    assert srpt.job(flood[0]).state is JobState.RUNNING
    mine = srpt.submit(owner="alice", command=["python", "train.py"])
    srpt.step()  # between rankings: alice's job has no estimate yet
    srpt.host.finish(flood[0])
    srpt.step(2)
    assert srpt.job(mine).state is JobState.RUNNING
    assert all(srpt.job(j).state is JobState.QUEUED for j in flood[1:])
