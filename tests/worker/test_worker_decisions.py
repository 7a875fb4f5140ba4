"""The worker's decisions, in process: the real loop and store, the fake executor, a moved clock.

Each test runs single passes and asserts on what the store says, in milliseconds and
without a process. The end-to-end tests (test_supervision.py, test_leases.py ...) keep
proving that real shims, sessions and cgroups behave as the fake says they do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select

from ddpq.core.disposition import MAX_RELAUNCHES, PUT_OFF_S, attempt_header
from ddpq.core.rules import ExitRecord
from ddpq.core.states import JobState
from ddpq.executors.base import Launch, LaunchFailed
from ddpq.executors.fake import FakeExecutor
from ddpq.jobdir import JobDir
from ddpq.store import attempts as attempt_store
from ddpq.store import endings as ending_store
from ddpq.store import jobs as job_store
from ddpq.store import unlaunched as unlaunched_store
from ddpq.store.db import Session
from ddpq.store.models import Attempt
from ddpq.worker import exits
from ddpq.worker.unlaunched import Unlaunched
from tests.worker.rig import Rig, make_rig

Q, R, S, F = JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home")
    yield r
    r.close()


def one_gpu(tmp_path: Path) -> Rig:
    return make_rig(tmp_path / "home1", fake_gpus=1)


def test_a_job_is_leased_started_and_finished(rig: Rig) -> None:
    job = rig.submit(gpus=2)
    rig.step()
    view = rig.job(job)
    assert view.state is R and view.gpus == [0, 1] and view.port == 29600
    assert rig.host.running() == [job]
    launched = rig.host.attempt_of(job).launch
    assert (launched.gpus, launched.port, launched.attempt) == ((0, 1), 29600, 1)
    assert view.attempts == [(1, None, "", launched_handle(rig, job))]
    rig.host.finish(job, 0)
    rig.step()
    view = rig.job(job)
    assert view.state is S and view.reason == "exit code 0"
    assert (view.gpus, view.port) == ([], None)  # leases released
    assert view.attempts == [(1, S, "exit code 0", launched_handle(rig, job))]  # kept
    assert [e[1] for e in view.events] == [Q, JobState.STARTING, R, S]


def test_the_memory_an_attempt_held_at_most_is_kept_with_it(rig: Rig) -> None:
    """The executor's reading of the cgroup's high-water mark, for `ddpq show`'s peak."""
    from sqlalchemy import select

    from ddpq.store.models import Attempt

    job = rig.submit()
    rig.step()
    rig.host.finish(job, 0, peak_ram_bytes=300 << 20)
    rig.step()
    with rig.api.read() as s:
        peaks = s.execute(select(Attempt.peak_ram_bytes).where(Attempt.job_id == job)).all()
    assert [p for (p,) in peaks] == [300 << 20]


def launched_handle(rig: Rig, job: int) -> str:
    return rig.host.attempt_of(job).handle


def test_a_failed_job_is_retried_after_a_growing_back_off(rig: Rig) -> None:
    job = rig.submit(max_retries=2)
    rig.step()
    rig.host.finish(job, 1)
    rig.step()
    view = rig.job(job)
    assert view.state is Q and view.not_before == rig.clock() + 2.0
    assert "retry 1 of 2 in 2s" in view.events[-1][2]
    rig.step()  # still backing off: not started, and it says why
    assert rig.host.running() == [] and rig.job(job).reason == "waiting out its back-off"
    rig.clock.advance(2.0)
    rig.step()
    assert rig.job(job).state is R and rig.host.attempt_of(job).launch.attempt == 2
    rig.host.finish(job, 1)
    rig.step()
    assert rig.job(job).not_before == rig.clock() + 4.0  # doubled
    rig.clock.advance(4.0)
    rig.step()
    rig.host.finish(job, 1)
    rig.step()
    view = rig.job(job)
    assert view.state is F and view.reason == "exit code 1"  # retries used up
    assert [(n, state) for n, state, _, _ in view.attempts] == [(1, F), (2, F), (3, F)]


def test_a_time_limit_stops_the_job_once_and_it_ends_timed_out(rig: Rig) -> None:
    rig.host.stop_ends_with_signal = None  # the job takes its time to go
    job = rig.submit(time_limit_s=10.0)
    rig.step()
    rig.clock.advance(9.9)
    rig.step()
    assert rig.host.attempt_of(job).stops == 0
    rig.clock.advance(0.1)
    rig.step()
    assert rig.host.attempt_of(job).stops == 1 and rig.job(job).stop_request == "timeout"
    rig.clock.advance(5.0)
    rig.step()
    assert rig.host.attempt_of(job).stops == 1  # sent once; the grace period does the rest
    rig.host.finish(job, None, 9)
    rig.step()
    view = rig.job(job)
    assert view.state is JobState.TIMED_OUT
    assert view.reason.startswith("time limit reached") and "killed by signal 9" in view.reason


def test_a_cancel_of_a_running_job_stops_it_and_it_ends_cancelled(rig: Rig) -> None:
    job = rig.submit()
    rig.step()
    rig.cancel(job)
    assert rig.job(job).state is R  # the API only asks; the worker stops it
    rig.step()  # stop sent; the fake ends it with SIGTERM at once
    rig.step()
    view = rig.job(job)
    assert view.state is JobState.CANCELLED and "signal 15" in view.reason
    assert rig.host.attempt_of(job).stops == 1


def test_a_cancel_that_arrives_while_the_job_is_starting_still_stops_it(rig: Rig) -> None:
    class CancelledMidLaunch(FakeExecutor):
        def start(self, launch: Launch) -> str:
            rig.cancel(launch.job_id)  # the API's cancel lands between lease and start
            return super().start(launch)

    rig.worker.executor = CancelledMidLaunch(rig.host)
    job = rig.submit()
    rig.step()
    assert rig.job(job).stop_request == "cancel"
    rig.step()
    rig.step()
    assert rig.job(job).state is JobState.CANCELLED


def test_a_job_cancelled_before_an_interrupted_launch_stays_cancelled(rig: Rig) -> None:
    job = rig.submit()
    # The worker leases the job, then dies before its executor started anything.
    with rig.worker.db.write() as s:
        leased = rig.worker.scheduler.lease_next(s, [0, 1], rig.clock(), rig.clock())
    assert [x.job_id for x in leased] == [job] and rig.job(job).state is JobState.STARTING
    rig.cancel(job)
    rig.restart()
    view = rig.job(job)
    assert view.state is JobState.CANCELLED and view.reason == "cancelled before it started"
    assert (view.gpus, view.port) == ([], None)


def test_an_interrupted_launch_is_requeued_and_runs(rig: Rig) -> None:
    job = rig.submit()
    with rig.worker.db.write() as s:
        rig.worker.scheduler.lease_next(s, [0, 1], rig.clock(), rig.clock())
    rig.restart()
    assert rig.job(job).state is Q
    rig.step()
    assert rig.job(job).state is R and rig.job(job).attempt == 2


def test_a_port_clash_is_requeued_on_another_port_a_bounded_number_of_times(rig: Rig) -> None:
    job = rig.submit(launcher="torchrun")
    rig.step()
    ports = []
    for _ in range(rig.settings.max_port_retries + 1):
        view = rig.job(job)
        assert view.state is R and view.port is not None
        ports.append(view.port)
        write_clash(view.job_dir, view.gpus, view.port, view.port)
        rig.host.finish(job, 1)
        rig.step()  # recorded, requeued and leased again in the same pass
    view = rig.job(job)
    assert len(set(ports)) == len(ports)  # a new port each time
    assert view.state is F and view.port_retries == rig.settings.max_port_retries
    requeued = [why for _, to, why in view.events if to is Q and "EADDRINUSE" in why]
    assert len(requeued) == 3 and "try 3 of 3" in requeued[-1]


def write_clash(job_dir: str | None, gpus: list[int], leased: int, taken: int) -> None:
    """The attempt's log: ddpq's header naming its ``leased`` port, then torch's error
    about the port ``taken``."""
    assert job_dir is not None
    folder = JobDir(Path(job_dir))
    folder.path.mkdir(parents=True, exist_ok=True)
    with folder.log.open("a") as f:
        f.write(attempt_header("2026-12-01 12:00:00", gpus, leased))
        f.write(f"torch.distributed.DistNetworkError: port: {taken}, EADDRINUSE\n")


def test_an_unrelated_address_in_use_is_a_plain_failure(rig: Rig) -> None:
    job = rig.submit(launcher="torchrun")
    rig.step()
    view = rig.job(job)
    assert view.port is not None
    write_clash(view.job_dir, view.gpus, view.port, view.port + 1)  # another program's port
    rig.host.finish(job, 1)
    rig.step()
    assert rig.job(job).state is F


def test_a_running_job_is_readopted_by_a_restarted_worker(rig: Rig) -> None:
    job = rig.submit()
    rig.step()
    handle = launched_handle(rig, job)
    rig.restart()
    view = rig.job(job)
    assert view.state is R and view.attempts[-1][3] == handle and rig.worker.running() == [job]
    rig.host.finish(job, 0)
    rig.step()
    assert rig.job(job).state is S and len(rig.host.attempts) == 1  # never started twice


def test_a_job_that_ended_while_the_worker_was_down_is_finalised_on_restart(rig: Rig) -> None:
    ok, bad = rig.submit(), rig.submit()
    rig.step()
    rig.worker.close()
    rig.host.finish(ok, 0)
    rig.host.finish(bad, 3)
    rig.restart()  # reconcile records both before any pass
    assert rig.job(ok).state is S and rig.job(bad).state is F
    assert rig.job(bad).reason == "exit code 3"


def test_a_lost_shim_fails_the_job_and_frees_its_gpus(rig: Rig) -> None:
    job = rig.submit(gpus=2, max_retries=0)
    rig.step()
    rig.host.lose(job)
    waiting = rig.submit(gpus=2)
    rig.step()
    assert rig.job(job).state is F and rig.job(job).reason.startswith("lost")
    assert rig.job(waiting).state is R and rig.job(waiting).gpus == [0, 1]


def test_a_failed_dependency_cancels_the_chain_and_a_success_releases_it(rig: Rig) -> None:
    a = rig.submit()
    b = rig.submit(after=(a,))
    c = rig.submit(after=(b,))
    ok = rig.submit()
    then = rig.submit(after=(ok,))
    assert rig.job(b).state is JobState.HELD and rig.job(then).state is JobState.HELD
    rig.step()
    rig.host.finish(a, 1)
    rig.host.finish(ok, 0)
    rig.step()
    assert rig.job(b).state is JobState.CANCELLED and rig.job(b).reason == f"dependency {a} failed"
    assert rig.job(c).state is JobState.CANCELLED
    assert rig.job(c).reason == f"dependency {b} cancelled"
    assert rig.job(then).state is R  # released and started in the same pass


def test_a_launch_that_fails_fails_its_job_only(tmp_path: Path) -> None:
    rig = one_gpu(tmp_path)
    try:
        bad, good = rig.submit(), rig.submit()
        rig.host.refuse[bad] = "cannot start the job: train.py does not exist"
        rig.step()
        view = rig.job(bad)
        assert view.state is F and view.reason == "cannot start the job: train.py does not exist"
        assert (view.gpus, view.port) == ([], None)
        rig.step()
        assert rig.job(good).state is R and rig.job(good).gpus == [0]
    finally:
        rig.close()


def test_a_launch_the_executor_lost_is_queued_again_without_a_retry_used(
    tmp_path: Path,
) -> None:
    # The fork server went away before it answered: nothing of the job ran, so it waits
    # for the next pass, its GPU free for it; a job that may not be retried runs all the same.
    rig = one_gpu(tmp_path)
    try:
        job = rig.submit(max_retries=0)
        rig.host.lose_launch[job] = "cannot start the job: no answer from the fork server"
        rig.step()
        view = rig.job(job)
        why = "launch interrupted before the job started (cannot start the job: no answer"
        assert view.state is Q and view.reason.startswith(why), view.reason
        assert (view.gpus, view.port) == ([], None) and view.attempts[0][1] is Q
        rig.step()
        assert rig.job(job).state is R and rig.host.running() == [job]
    finally:
        rig.close()


def test_a_launch_lost_again_and_again_fails_in_the_end(rig: Rig) -> None:
    job = rig.submit()
    for _ in range(MAX_RELAUNCHES + 1):
        rig.host.lose_launch[job] = "cannot start the job: no answer from the fork server"
        rig.step()
    view = rig.job(job)
    assert view.state is F and view.attempt == MAX_RELAUNCHES + 1
    assert view.reason == f"launch interrupted before the job started, {MAX_RELAUNCHES + 1} times"


def test_a_launch_with_no_room_waits_for_room_however_often_with_nothing_used(
    tmp_path: Path,
) -> None:
    """A launch that found the job folders' disk full (another user's files may have
    filled it): the job is not failed, and uses no relaunch; it waits PUT_OFF_S, and so
    does every other launch (a queue of doomed launches would otherwise hold the GPUs
    pass after pass), and it starts once there is room."""
    rig = one_gpu(tmp_path)
    try:
        job, other = rig.submit(max_retries=0), rig.submit()
        full = "cannot start the job: no room on the disk of its folder (No space left on device)"
        for _ in range(MAX_RELAUNCHES + 2):  # more often than a lost launch may be
            rig.host.no_room[job] = full
            rig.step()
            view = rig.job(job)
            assert view.state is Q and view.reason == f"{full}; tried again in {PUT_OFF_S:g}s"
            assert (view.gpus, view.port) == ([], None)
            rig.clock.advance(PUT_OFF_S - 1)
            rig.step()  # the pause: nothing is launched, the other job's neither
            assert rig.host.running() == [] and rig.job(other).state is Q
            rig.clock.advance(1)
        rig.step()  # room at last: it goes first, as it was submitted first
        assert rig.job(job).state is R and rig.host.running() == [job]
    finally:
        rig.close()


def test_a_failure_after_put_off_launches_still_has_its_retries(rig: Rig) -> None:
    """Each put-off launch opened an attempt, and the attempt number stood for the retries
    used: two put-offs left a job of one retry none (found by review)."""
    job = rig.submit(max_retries=1)
    for _ in range(2):
        rig.host.no_room[job] = "cannot start the job: no room on the disk of its folder"
        rig.step()
        rig.clock.advance(PUT_OFF_S)
    rig.step()
    assert rig.job(job).state is R and rig.job(job).attempt == 3
    rig.host.finish(job, 1)
    rig.step()
    view = rig.job(job)
    assert view.state is Q and view.events[-1][2].endswith("retry 1 of 1 in 2s"), view.events
    rig.clock.advance(2)
    rig.step()
    rig.host.finish(job, 1)
    rig.step()
    assert rig.job(job).state is F and rig.job(job).reason == "exit code 1"


def test_a_job_cancelled_while_its_launch_found_no_room_ends_cancelled(rig: Rig) -> None:
    job = rig.submit()
    with rig.worker.db.write() as s:
        rig.worker.scheduler.lease_next(s, [0, 1], rig.clock(), rig.clock())
    rig.cancel(job)  # while it is starting: the launch that follows finds no room
    with rig.worker.db.write() as s:
        unlaunched_store.requeue_unlaunched(s, job, "no room", rig.clock(), put_off=True)
    view = rig.job(job)
    assert view.state is JobState.CANCELLED and view.reason == "cancelled before it started"
    assert (view.gpus, view.port) == ([], None)


def test_a_finished_jobs_gpu_goes_to_the_next_job_in_the_same_pass(tmp_path: Path) -> None:
    rig = one_gpu(tmp_path)
    try:
        first, second = rig.submit(), rig.submit()
        rig.step()
        assert rig.host.running() == [first] and rig.job(second).reason.startswith("waiting")
        rig.host.finish(first, 0)
        rig.step()
        assert rig.job(first).state is S and rig.host.running() == [second]
    finally:
        rig.close()


def test_one_exit_that_cannot_be_recorded_fails_that_job_alone(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken, fine = rig.submit(), rig.submit()
    rig.step()
    real, real_many = ending_store.record_exit, ending_store.record_exits_many

    def record_exit(s: object, ending: ending_store.Ending, *args: object) -> None:
        if ending.job_id == broken and args[1].job_state is S:  # type: ignore[attr-defined]
            raise RuntimeError("a bug reading what the job wrote")
        real(s, ending, *args)  # type: ignore[arg-type]

    def record_exits_many(s: Session, ends: list[ending_store.Exit], now: float) -> None:
        if any(e.ending.job_id == broken for e in ends):  # all together fail: one by one
            raise RuntimeError("a bug reading what the job wrote")
        real_many(s, ends, now)

    monkeypatch.setattr(ending_store, "record_exit", record_exit)
    monkeypatch.setattr(ending_store, "record_exits_many", record_exits_many)
    rig.host.finish(broken, 0)
    rig.host.finish(fine, 0)
    rig.step()
    assert rig.job(fine).state is S
    view = rig.job(broken)
    assert view.state is F and view.reason == exits.UNRECORDABLE


def test_progress_is_read_from_the_job_folder_and_written_when_it_changes(rig: Rig) -> None:
    job = rig.submit()
    rig.step()
    folder = JobDir(Path(str(rig.job(job).job_dir)))
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.metrics.write_text('{"epoch": 1, "epochs": 3}\n{"epoch": 2, "nested": {"x": 1}}\n')
    rig.clock.advance(1.0)
    rig.step()
    assert rig.job(job).progress == {"epoch": 2}  # the newest line, flattened


def test_nothing_runs_before_its_handle_is_stored(rig: Rig) -> None:
    """A restarted worker must find whatever runs: the executor lets an attempt go only
    once the store holds its handle."""
    seen: list[str | None] = []

    class Checking(FakeExecutor):
        def proceed(self, job_ids: Sequence[int]) -> None:
            seen.extend(rig.job(i).attempts[-1][3] for i in job_ids)
            super().proceed(job_ids)

    rig.worker.executor = Checking(rig.host)
    job = rig.submit()
    rig.step()
    assert seen == [launched_handle(rig, job)] and rig.host.attempt_of(job).proceeded


def disk_full_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write that stores the launched attempts fails once, as on a full disk."""
    real = attempt_store.mark_running_many
    calls = []

    def failing_once(*args: object, **kw: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attempt_store, "mark_running_many", failing_once)


def test_an_attempt_whose_handle_cannot_be_stored_never_runs_and_is_requeued(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_full_once(monkeypatch)
    job = rig.submit()
    rig.step()  # the scheduling phase fails; the worker goes on
    first = rig.host.attempt_of(job)
    assert not first.proceeded and first.record is not None and not first.record.launched
    rig.step()  # the abandoned attempt is recorded as never run, and the job starts again
    view = rig.job(job)
    assert view.state is R and view.attempt == 2 and rig.host.attempt_of(job).proceeded
    assert view.attempts[0][1:3] == (Q, "launch interrupted before the job started")


def test_a_job_that_forges_nothing_ran_is_rerun_a_bounded_number_of_times(rig: Rig) -> None:
    """The shim's "nothing ran" record lies in the job's own folder: a job may write one and
    kill its shim. It is requeued for free only MAX_RELAUNCHES times, then it fails."""
    job = rig.submit(max_retries=0)
    for _ in range(MAX_RELAUNCHES + 1):
        rig.step()
        attempt = rig.host.attempt_of(job)
        assert attempt.proceeded and rig.job(job).state is R
        at = rig.clock()
        attempt.record = ExitRecord(None, 9, at, at, None, launched=False)  # the forgery
    rig.step()
    view = rig.job(job)
    assert view.state is F and view.attempt == MAX_RELAUNCHES + 1
    assert view.reason == f"launch interrupted before the job started, {MAX_RELAUNCHES + 1} times"


def test_progress_of_several_jobs_in_one_pass_is_recorded(rig: Rig) -> None:
    jobs = [rig.submit(), rig.submit()]
    rig.step()
    for n, job in enumerate(jobs):
        folder = JobDir(Path(str(rig.job(job).job_dir)))
        folder.path.mkdir(parents=True, exist_ok=True)
        folder.metrics.write_text(f'{{"step": {n + 1}}}\n')
    rig.clock.advance(1.0)
    rig.step()
    assert [rig.job(j).progress for j in jobs] == [{"step": 1}, {"step": 2}]


def test_a_job_waiting_in_a_clusters_queue_shows_why_and_its_limit_starts_when_it_runs(
    rig: Rig,
) -> None:
    rig.host.stop_ends_with_signal = None
    job = rig.submit(time_limit_s=10.0)
    rig.host.waiting[job] = "waiting in Slurm: Resources"
    rig.step()
    view = rig.job(job)
    assert view.state is R and view.reason == "waiting in Slurm: Resources"
    rig.clock.advance(60.0)  # far past its limit, but it has not run yet
    rig.host.waiting[job] = "waiting in Slurm: Priority"
    rig.step()
    assert rig.host.attempt_of(job).stops == 0
    assert rig.job(job).reason == "waiting in Slurm: Priority"
    del rig.host.waiting[job]  # the cluster runs it now
    rig.step()
    assert rig.job(job).reason == "running" and rig.host.attempt_of(job).stops == 0
    rig.clock.advance(9.9)
    rig.step()
    assert rig.host.attempt_of(job).stops == 0
    rig.clock.advance(0.2)
    rig.step()
    assert rig.host.attempt_of(job).stops == 1 and rig.job(job).stop_request == "timeout"


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("forged", [-1e300, 0.0, 1e300])
def test_a_forged_end_in_the_exit_record_is_held_to_the_attempt(
    rig: Rig, forged: float, alone: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job can write over its exit record: the end it claims counts only between its
    attempt's start and the pass that records it (fair share and usage read it), whether
    its end is recorded with the pass's others or alone (a requeue, a failed batch)."""
    if alone:
        monkeypatch.setattr(ending_store, "record_exits_many", None)  # each alone
    job = rig.submit()
    rig.step()
    started = rig.clock()
    rig.clock.advance(30.0)
    rig.host.attempt_of(job).record = ExitRecord(0, None, forged, forged)
    rig.step()
    with rig.api.read() as s:
        ended = s.execute(select(Attempt.ended_at).where(Attempt.job_id == job)).scalar_one()
    assert rig.job(job).state is S
    assert ended == (started if forged < started else rig.clock())


def test_a_failed_launch_whose_record_is_rolled_back_is_recorded_by_the_next_pass(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that fails (a full disk: its log's header could not be written) while the
    transaction that records it rolls back too: its job was left starting, holding its
    leases, for good (found by hand, a disk filled from a shell). The next pass records it."""
    disk_full_once(monkeypatch)
    job = rig.submit()
    rig.host.refuse[job] = "cannot write its log: No space left on device"
    rig.step()  # the launch fails, and so does the write that records it
    assert rig.job(job).state is JobState.STARTING
    rig.step()
    view = rig.job(job)
    assert view.state is F and "No space left on device" in view.reason
    assert view.gpus == [] and view.port is None  # its leases let go


def test_a_failed_launch_recorded_twice_counts_once(rig: Rig) -> None:
    """The transaction that records failed launches can commit and still raise (its log
    not synced: LogNotSynced comes after the commit); the next pass records them again,
    which must change nothing (found by review: a second relaunch counted)."""
    job = rig.submit()
    with rig.worker.db.write() as s:
        [leased] = rig.worker.scheduler.lease_next(s, [0, 1], rig.clock(), rig.clock())
    kept = Unlaunched()
    kept.add(job, leased.attempt, LaunchFailed("lost for the test", interrupted=True))
    for _ in range(2):  # committed, but not known to be: taken up again
        with rig.worker.db.write() as s:
            kept.record(s, rig.clock())
    view = rig.job(job)
    assert view.state is Q and view.reason.startswith("launch interrupted")
    assert sum("launch interrupted" in why for _, _, why in view.events) == 1
    with rig.worker.db.read() as s:
        assert job_store.get_job(s, job).relaunches == 1
