"""srpt-progress: the estimator (a job's measured rate, not its claim), the Gittins rank from
finished jobs' history, the fair-share band, and the order and preemptions they give."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpq.config import Settings
from ddpq.core.policy import Order, Policy
from ddpq.core.preempt import Guards, Running, Waiting, victims
from ddpq.core.scheduler.policy_progress import (
    MIN_HISTORY,
    PRIOR_S,
    History,
    Record,
    Seen,
    estimate,
    gittins_rank,
    measured_rate,
    over_band,
    remaining_s,
)


def rank_of(samples: list[float], attained: float) -> float:
    history = History()
    for s in samples:
        history.add("u", "w", s)
    return gittins_rank(*history.samples("u", "w"), attained)


def test_the_remaining_time_is_what_is_left_at_the_measured_rate() -> None:
    """10% a minute: 70% left at 120 s is 420 s; running, 30 s later 390 s are left."""
    records = [Record(0, 0.1, 1), Record(60, 0.2, 1), Record(120, 0.3, 1)]
    assert measured_rate(records) == pytest.approx(0.1 / 60)
    assert remaining_s(records, 150, running=False) == pytest.approx(420)
    assert remaining_s(records, 150, running=True) == pytest.approx(390)
    assert remaining_s(records, 10_000, running=True) == 0  # overdue: never below zero


def test_a_slipping_claim_is_ranked_by_what_the_job_does() -> None:
    """The job says 100 s to go at every record (its claim slips by a minute each time)
    while doing 10 steps a minute of 1000: the 710 left take 4260 s, not its 100."""
    records = [Record(60 * k, 10 * k + 200, 1000, eta_s=100) for k in range(10)]
    assert remaining_s(records, 540, running=False) == pytest.approx(710 / 10 * 60)


def test_a_growing_total_is_followed_at_the_measured_pace() -> None:
    """Its step count grows (it added epochs): the rate is of steps done, the remaining of
    the newest total."""
    records = [Record(0, 0, 100), Record(60, 10, 100), Record(120, 20, 400)]
    assert remaining_s(records, 120, running=False) == pytest.approx(380 / 10 * 60)


def test_the_rate_skips_the_pause_between_attempts_and_uses_the_newest_pairs() -> None:
    slow = [Record(60 * k, k, 1000, attempt=0) for k in range(20)]  # 1 step a minute
    fast = [Record(5000 + 60 * k, 19 + 5 * k, 1000, attempt=1) for k in range(6)]
    assert measured_rate(slow + fast) == pytest.approx(5 / 60)  # the 5 newest pairs
    # One record of the new attempt: the pair that spans the restart does not count.
    assert measured_rate([*slow[-3:], fast[0]]) == pytest.approx(1 / 60)


def test_no_rate_without_two_records_that_moved() -> None:
    assert measured_rate([]) is None
    assert measured_rate([Record(0, 0.5, 1, eta_s=10)]) is None  # a claim alone
    assert measured_rate([Record(0, 0.5, 1), Record(60, 0.5, 1)]) is None  # stalled
    assert remaining_s([Record(0, 0.5, 1, eta_s=10)], 0, running=True) is None


def test_gittins_rank_by_hand() -> None:
    """Finished jobs took 10 and 100 GPU-s. New: a quantum of 10 finishes half of them for
    an expected 10 GPU-s: 20 per job finished (100: 55 for all). Past 10: only the 100
    remains, 90 to go; at 50, 50. Older than all history: ranked by its age."""
    assert rank_of([10, 100], 0) == pytest.approx(20)
    assert rank_of([10, 100], 10) == pytest.approx(90)
    assert rank_of([10, 100], 50) == pytest.approx(50)
    assert rank_of([10, 100], 500) == 500


def test_gittins_rank_of_a_known_length_is_its_remaining_time() -> None:
    assert rank_of([300.0] * MIN_HISTORY, 120) == pytest.approx(180)


def test_gittins_rank_moves_a_job_back_once_it_outlives_the_short_mode() -> None:
    """Most runs of this command are short: a young one ranks near them; one that has run
    past them all is one of the long ones, and ranks after a fresh job."""
    samples = [60.0] * 8 + [36_000.0] * 2
    young, old = rank_of(samples, 0), rank_of(samples, 120)
    assert young < 100 < 30_000 < old


def test_history_uses_the_narrowest_class_with_enough_jobs() -> None:
    history = History()
    for _ in range(MIN_HISTORY):
        history.add("ann", "train", 1000)
        history.add("bob", "eval", 10)
    history.add("ann", "eval", 5)
    assert history.samples("ann", "train")[0] == [1000] * MIN_HISTORY
    assert history.samples("ann", "eval")[0] == [5] + [1000] * MIN_HISTORY  # ann's own
    assert len(history.samples("cat", "x")[0]) == 2 * MIN_HISTORY + 1  # everyone's
    assert gittins_rank(*History().samples("cat", "x"), 100) == PRIOR_S + 100


def test_estimate_prefers_measured_progress_and_counts_gpus() -> None:
    history = History()
    history.add("u", "w", 50)
    records = (Record(0, 0.0, 1), Record(60, 0.5, 1))
    with_progress = Seen(1, "u", "w", 4, 240, running=False, records=records)
    assert estimate(with_progress, history, 60) == pytest.approx(60 * 4)
    without = Seen(2, "u", "w", 4, 0, running=False)
    assert estimate(without, history, 60) == pytest.approx(50)


def test_over_band_names_the_owners_far_above_the_others_mean() -> None:
    usage = {"ann": 700.0, "bob": 200.0, "cat": 100.0, "idle": 10_000.0}
    assert over_band(usage, ["ann", "bob", "cat"], band=1.0) == {"ann"}  # 700 > 2 x 150
    assert over_band(usage, ["ann", "bob", "cat"], band=3.6) == {"ann"}  # 700 > 4.6 x 150
    assert over_band(usage, ["ann", "bob", "cat"], band=3.7) == frozenset()  # 700 < 705
    assert over_band(usage, ["ann"]) == frozenset()  # alone: all is their share
    assert over_band({}, ["ann", "bob"]) == frozenset()
    assert over_band({"ann": 5.0, "bob": 5.0}, ["ann", "bob"]) == frozenset()  # even


@pytest.mark.parametrize(
    ("mine", "theirs", "over"),
    [(192.0, 40.0, True), (81.0, 40.0, True), (80.0, 40.0, False), (1.0, 0.0, True)],
)
def test_over_band_can_name_one_of_two_owners(mine: float, theirs: float, over: bool) -> None:
    """With two owners, a share of the total could never pass (1 + band) / 2 = 1: one who
    used more than twice the other is over it now (a flood of short jobs against a new
    user's one, found by hand: 1,500 jobs held hers 73 s)."""
    band = over_band({"bob": mine, "ann": theirs}, ["ann", "bob"])
    assert band == ({"bob"} if over else frozenset())


def waiting(i: int, owner: str = "u", priority: int = 0, gpus: int = 1) -> Waiting:
    return Waiting(i, owner, priority, float(i), 0.0, gpus)


def running(i: int, owner: str = "u", gpus: int = 1, preemptions: int = 0) -> Running:
    return Running(i, owner, 0, float(i), 0.0, gpus, 0.0, True, preemptions)


def test_srpt_order_priority_then_band_then_estimate() -> None:
    remaining = {1: 500.0, 2: 100.0, 3: 50.0, 4: 10.0}
    order = Order(Policy.SRPT_PROGRESS, {}, remaining=remaining, over_band=frozenset({"hog"}))
    jobs = [waiting(1), waiting(2), waiting(3, priority=1), waiting(4, owner="hog")]
    assert [j.id for j in sorted(jobs, key=order.key)] == [3, 2, 1, 4]
    # No estimate: ranked as a fresh job with an hour's work, later the more it has had.
    assert order.rank(waiting(9))[-1] == 3600.0


def test_srpt_preempts_only_a_job_estimated_far_longer() -> None:
    guards = Guards(min_run_s=0, max_preemptions=3)
    remaining = {1: 100.0, 10: 150.0, 11: 250.0}
    order = Order(Policy.SRPT_PROGRESS, {}, remaining=remaining)
    assert victims([waiting(1)], [running(10)], 0, order, 1.0, guards) == []  # 1.5x: no
    (p,) = victims([waiting(1)], [running(10), running(11)], 0, order, 1.0, guards)
    assert p.victim == 11
    # The guards still hold: a job preempted to the cap is not taken again.
    assert victims([waiting(1)], [running(11, preemptions=3)], 0, order, 1.0, guards) == []
    # An owner above the band loses GPUs to one within it, whatever the estimates.
    banded = Order(
        Policy.SRPT_PROGRESS, {}, remaining={1: 900.0, 10: 10.0}, over_band=frozenset({"hog"})
    )
    (p,) = victims([waiting(1)], [running(10, owner="hog")], 0, banded, 1.0, guards)
    assert p.victim == 10


def test_the_daemon_takes_the_policy_now_that_the_worker_keeps_its_history(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, policy=Policy.SRPT_PROGRESS, allow_root_without_auth=True)
    settings.validate((32768, 60999))  # no ConfigError: worker.forecast feeds it
