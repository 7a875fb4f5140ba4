"""The predicted start (``core.scheduler.forecast``) on plain data."""

from __future__ import annotations

import math

from ddpq.core.scheduler.forecast import (
    Job,
    Profile,
    done_of,
    expected_left,
    forecast,
    length_left,
    plan_forward,
)
from ddpq.core.scheduler.policy_progress import History, Record, Seen


def seen(job_id: int, gpus: int = 1, records: tuple[Record, ...] = (), **kw: float) -> Seen:
    running = bool(kw.get("running", 0))
    return Seen(job_id, "ann", "train", gpus, kw.get("attained", 0.0), running, records)


def test_progress_records_say_done_of_total_in_epochs_steps_or_a_fraction() -> None:
    assert done_of({"epoch": 2, "epochs": 4}) == (2.0, 4.0)
    assert done_of({"epoch": 2, "epochs": 4, "step": 5, "steps": 10, "phase": "train"}) == (
        1.5,
        4.0,
    )
    assert done_of({"step": 30, "steps": 120}) == (30.0, 120.0)
    assert done_of({"fraction": 0.25}) == (0.25, 1.0)
    assert done_of({"step": 500, "steps": 100}) == (100.0, 100.0)  # capped at the total


def test_records_that_say_nothing_usable_are_no_progress() -> None:
    for bad in (
        {"loss": 1.0},
        {"step": "x", "steps": 10},
        {"step": 1, "steps": 0},
        {"step": 1, "steps": math.inf},
        {"fraction": math.nan},
        {"epoch": None, "epochs": 3},
    ):
        assert done_of(bad) is None, bad


def test_the_expected_remaining_time_is_the_mean_over_the_longer_finished_jobs() -> None:
    ordered = [10.0, 20.0, 30.0, 100.0]
    sums = [0.0, 10.0, 30.0, 60.0, 160.0]
    assert expected_left(ordered, sums, 0.0) == 40.0
    assert expected_left(ordered, sums, 25.0) == 65.0 - 25.0  # (30 + 100) / 2 - 25
    assert expected_left(ordered, sums, 100.0) is None


def test_a_measured_rate_beats_the_time_limit_and_is_capped_by_it() -> None:
    records = (Record(0.0, 0.0, 100.0), Record(10.0, 10.0, 100.0))  # 1 step/s, 90 left
    running = Job(seen(1, records=records, running=1), time_limit_s=1000.0, started_at=0.0)
    assert length_left(running, History(), 10.0) == 90.0
    assert length_left(running, None, 10.0) == 990.0  # limits only
    capped = Job(seen(1, records=records, running=1), time_limit_s=50.0, started_at=0.0)
    assert length_left(capped, History(), 10.0) == 40.0


def test_without_progress_or_limit_the_history_of_its_class_gives_the_length() -> None:
    history = History()
    for gpu_s in (100.0, 200.0, 300.0, 400.0, 500.0):
        history.add("ann", "train", gpu_s)
    two_gpus = Job(seen(2, gpus=2))
    assert length_left(two_gpus, history, 0.0) == 150.0  # mean 300 GPU-s over 2 GPUs
    assert length_left(two_gpus, History(), 0.0) is None  # no history: unknown
    assert length_left(two_gpus, None, 0.0) is None
    # A time limit caps what the history says; alone (Slurm's way), it is the length.
    assert length_left(Job(seen(2, gpus=2), time_limit_s=1000.0), history, 0.0) == 150.0
    assert length_left(Job(seen(2, gpus=2), time_limit_s=100.0), history, 0.0) == 100.0
    assert length_left(Job(seen(2, gpus=2), time_limit_s=1000.0), None, 0.0) == 1000.0


def test_jobs_start_in_order_as_running_ones_end() -> None:
    # 2 GPUs: one free, one held until t=100. A 2-GPU job waits for t=100 and runs 50 s;
    # a 1-GPU job of 200 s behind it cannot start on the free GPU (it would delay the
    # first), but a 1-GPU job of 60 s can (backfilled before t=100).
    starts = forecast(
        2, [(1, 100.0)], [(1, 2, 50.0, None), (2, 1, 200.0, None), (3, 1, 60.0, None)], 0.0
    )
    assert starts == {1: 100.0, 2: 150.0, 3: 0.0}


def test_an_unknown_end_makes_what_needs_those_gpus_unknown() -> None:
    starts = forecast(2, [(1, None)], [(1, 2, 10.0, None), (2, 1, 10.0, None)], 0.0)
    assert starts == {1: None, 2: 0.0}
    # A job of unknown length holds its GPUs for ever: the next one never gets them.
    starts = forecast(1, [], [(1, 1, None, None), (2, 1, 10.0, None)], 0.0)
    assert starts == {1: 0.0, 2: None}


def test_an_overdue_job_is_expected_to_end_now_and_back_offs_are_kept() -> None:
    starts = forecast(1, [(1, 5.0)], [(1, 1, 10.0, 30.0), (2, 1, 10.0, None)], 20.0)
    assert starts == {1: 30.0, 2: 20.0}


def test_too_big_for_the_host_and_past_the_limit_are_unknown() -> None:
    queue = [(1, 5, 10.0, None), (2, 1, 10.0, None), (3, 1, 10.0, None)]
    assert forecast(4, [], queue, 0.0, limit=2) == {1: None, 2: 0.0, 3: None}


def test_the_profile_keeps_steps_and_finds_the_first_gap() -> None:
    p = Profile(0.0, 2)
    p.change(10.0, 20.0, -2)
    assert p.earliest(1, 5.0, 0.0) == 0.0
    assert p.earliest(1, 15.0, 0.0) == 20.0
    assert p.earliest(1, None, 0.0) == 20.0
    assert p.earliest(3, 1.0, 0.0) is None


def test_planning_forward_estimates_each_job_then_forecasts() -> None:
    records = (Record(0.0, 0.0, 100.0), Record(10.0, 10.0, 100.0))
    ahead = Job(seen(1, records=records, running=1), started_at=0.0)
    behind = Job(seen(2), time_limit_s=30.0)
    starts = plan_forward(1, [ahead], [behind], History(), 10.0)
    assert starts == {2: 100.0}
    # Slurm's answer: the job ahead has no limit, so nobody knows.
    assert plan_forward(1, [ahead], [behind], None, 10.0) == {2: None}


def test_in_order_no_job_starts_before_the_one_ahead_of_it() -> None:
    queue = [(1, 2, 50.0, None), (2, 1, 10.0, None)]
    assert forecast(2, [(1, 100.0)], queue, 0.0) == {1: 100.0, 2: 0.0}  # backfilled
    assert forecast(2, [(1, 100.0)], queue, 0.0, in_order=True) == {1: 100.0, 2: 150.0}
    # Behind a job nobody can place, nobody knows.
    assert forecast(1, [(1, None)], [(1, 1, 5.0, None), (2, 0, 5.0, None)], 0.0, in_order=True) == {
        1: None,
        2: None,
    }
