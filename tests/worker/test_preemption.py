"""Preemption, in process: asked by an admin or by the LAS policy, a job checkpoints and goes
back to the queue without using a retry; one that does not checkpoint in time says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.core.policy import Policy
from ddpq.core.states import JobState
from ddpq.store import jobs as job_store
from tests.worker.rig import Rig, make_rig

Q, R, P = JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", preempt_grace_s=30.0)
    yield r
    r.close()


def preempt(rig: Rig, job_id: int, by: str = "boss") -> None:
    with rig.api.write() as s:
        job_store.request_preempt(s, job_store.get_job(s, job_id), by, rig.clock())


def test_a_preempted_job_checkpoints_and_is_requeued_without_a_retry(rig: Rig) -> None:
    job = rig.submit(preemptible=True, max_retries=0)
    rig.step()
    assert rig.host.attempt_of(job).launch.preempt_with == "USR1"
    preempt(rig, job)
    rig.step()  # the signal; the fake job saves and exits 75 at once
    assert rig.host.attempt_of(job).preempts == 1
    rig.step()  # recorded, requeued and (its GPU free) started again in the same pass
    view = rig.job(job)
    assert view.state is R and view.attempt == 2 and view.stop_request is None
    first = view.attempts[0]
    assert first[1] is P and first[2] == "preempted by boss: checkpointed"
    reasons = [why for _, to, why in view.events]
    assert "preemption asked for by boss" in reasons
    assert "preempted by boss: checkpointed; back in the queue" in reasons
    rig.host.finish(job, 0)
    rig.step()
    assert rig.job(job).state is JobState.SUCCEEDED  # retries were never touched


def test_a_job_that_does_not_checkpoint_in_time_is_stopped_and_says_so(rig: Rig) -> None:
    rig.host.preempt_ends_with = None  # it ignores the signal
    job = rig.submit(preemptible=True)
    rig.step()
    preempt(rig, job)
    rig.step()
    rig.clock.advance(31.0)  # past its 30 s: the shim stops it (SIGTERM, then SIGKILL)
    rig.host.finish(job, None, 9)
    rig.step()
    first = rig.job(job).attempts[0]
    assert first[1] is P and "did not exit within its 30s to checkpoint" in first[2]


def test_a_job_that_finishes_while_preempted_succeeds(rig: Rig) -> None:
    rig.host.preempt_ends_with = 0
    job = rig.submit(preemptible=True)
    rig.step()
    preempt(rig, job)
    rig.step()
    rig.step()
    assert rig.job(job).state is JobState.SUCCEEDED


def test_a_job_cancelled_while_it_is_being_preempted_ends_cancelled(rig: Rig) -> None:
    """Not back in the queue to run again: the cancel replaces the preemption (the job was
    lost to a later requeue before, its cancel ignored)."""
    rig.host.preempt_ends_with = None  # it takes its time to checkpoint
    job = rig.submit(preemptible=True)
    rig.step()
    preempt(rig, job)
    rig.step()  # the checkpoint signal is out
    assert rig.host.attempt_of(job).preempts == 1
    with rig.api.write() as s:
        job_store.cancel(s, job_store.get_job(s, job), rig.clock())
    rig.step()  # the cancel's SIGTERM, which ends it
    assert rig.host.attempt_of(job).stops == 1
    rig.step()
    view = rig.job(job)
    assert view.state is JobState.CANCELLED and view.attempt == 1, view
    assert view.attempts[0][1] is JobState.CANCELLED


def test_only_running_preemptible_jobs_can_be_preempted(rig: Rig) -> None:
    plain = rig.submit()
    queued = rig.submit(gpus=2, preemptible=True)
    rig.step()
    for job_id, words in ((plain, "not submitted --preemptible"), (queued, "only a running")):
        with pytest.raises(job_store.NotPreemptible, match=words):
            preempt(rig, job_id)


# ---- the LAS policy preempts on its own ------------------------------------------------------


@pytest.fixture
def las(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(
        tmp_path / "las",
        fake_gpus=2,
        policy=Policy.LAS,
        preempt_min_run_s=600.0,
        max_preemptions=2,
    )
    yield r
    r.close()


def test_las_preempts_a_long_served_job_for_a_new_one(las: Rig) -> None:
    long = las.submit(gpus=2, preemptible=True)
    las.step()
    las.clock.advance(2 * 3600.0)  # 4 GPU-hours: past the first LAS threshold
    short = las.submit(gpus=1)
    las.step()  # the policy asks the long job to go
    assert las.job(long).stop_request == "preempt"
    las.step()  # signalled; it checkpoints
    las.step()  # requeued; the short job starts on its GPUs
    assert las.job(short).state is R
    assert las.job(long).state is Q and las.job(long).attempts[0][1] is P
    assert f"preempted for job {short}" in las.job(long).attempts[0][2]
    las.host.finish(short, 0)
    las.step()
    assert las.job(long).state is R and las.job(long).attempt == 2  # and it resumes


def test_las_never_preempts_a_job_that_is_not_preemptible(las: Rig) -> None:
    pinned = las.submit(gpus=2)  # not preemptible
    las.step()
    las.clock.advance(5 * 3600.0)
    newcomer = las.submit(gpus=1)
    las.step()
    assert las.job(pinned).stop_request is None and las.job(newcomer).state is Q


def test_las_lets_a_job_run_its_minimum_time_before_preempting_it(tmp_path: Path) -> None:
    las = make_rig(tmp_path / "min", policy=Policy.LAS, preempt_min_run_s=3000.0)
    try:
        young = las.submit(gpus=2, preemptible=True)
        las.step()
        las.clock.advance(2000.0)  # 4000 GPU-s: a worse queue already, but run 2000 s < 3000
        newcomer = las.submit(gpus=1)
        las.step()
        assert las.job(young).stop_request is None and las.job(newcomer).state is Q
        las.clock.advance(1001.0)  # its minimum is run
        las.step()
        assert las.job(young).stop_request == "preempt"
    finally:
        las.close()


def test_las_stops_preempting_a_job_after_its_cap(las: Rig) -> None:
    long = las.submit(gpus=2, preemptible=True)
    las.step()
    for round_ in range(3):
        las.clock.advance(3 * 3600.0)
        short = las.submit(gpus=1)
        las.step()
        if round_ < 2:  # max_preemptions=2
            las.step()
            las.step()
            assert las.job(short).state is R
            las.host.finish(short, 0)
            las.step()
        else:
            assert las.job(long).stop_request is None and las.job(short).state is Q
    assert las.job(long).attempt == 3


@pytest.mark.parametrize("kind", ["preemption", "cancel"])
def test_a_restarted_worker_sends_the_stops_already_sent_again(rig: Rig, kind: str) -> None:
    """The executor's deadline for a shim that does not end its job (one its job stopped)
    lived in the worker that sent the stop: the next one sends it again, as it was."""
    rig.host.preempt_ends_with = None  # it takes its time
    rig.host.stop_ends_with_signal = None
    job = rig.submit(preemptible=True)
    rig.step()
    if kind == "preemption":
        preempt(rig, job)
    else:
        rig.cancel(job)
    rig.step()
    attempt = rig.host.attempt_of(job)
    sent = (attempt.preempts, attempt.stops)
    assert sent == ((1, 0) if kind == "preemption" else (0, 1))
    rig.restart()
    assert (attempt.preempts, attempt.stops) == (2 * sent[0], 2 * sent[1])
    rig.step(2)  # and only then: each worker sends a stop once
    assert (attempt.preempts, attempt.stops) == (2 * sent[0], 2 * sent[1])
    assert rig.job(job).state is R
