"""Fair-share usage, retry back-off, outcomes and time limits (ddpq.core.rules)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core.rules import (
    ExitRecord,
    Run,
    StopRequest,
    describe_exit,
    outcome_of,
    past_time_limit,
    recent_usage,
    retry_backoff_s,
    should_retry,
    within_attempt,
)
from ddpq.core.states import JobState

SETTINGS = settings(max_examples=250, deadline=None)
NOW = 100_000.0
HOUR = 3600.0

# --------------------------------------------------------------------------- recent_usage


def test_usage_inside_window_counts_fully() -> None:
    runs = [Run("alice", 2, NOW - 100, NOW - 40)]
    assert recent_usage(runs, NOW, HOUR) == {"alice": 2 * 60.0}


def test_usage_clipped_at_window_start() -> None:
    # Ran for two hours, one of them inside the window.
    runs = [Run("alice", 4, NOW - 2 * HOUR, NOW)]
    assert recent_usage(runs, NOW, HOUR) == {"alice": 4 * HOUR}


def test_usage_of_a_still_running_job_counts_until_now() -> None:
    runs = [Run("bob", 1, NOW - 30 * 60, None), Run("bob", 1, NOW - 5 * HOUR, None)]
    assert recent_usage(runs, NOW, HOUR) == {"bob": 30 * 60.0 + HOUR}


def test_usage_end_after_now_is_clipped_to_now() -> None:
    runs = [Run("bob", 2, NOW - 10, NOW + 500)]
    assert recent_usage(runs, NOW, HOUR) == {"bob": 20.0}


def test_runs_entirely_outside_window_do_not_count() -> None:
    runs = [
        Run("old", 8, NOW - 3 * HOUR, NOW - HOUR),  # ended exactly at the window start
        Run("old", 8, NOW - 3 * HOUR, NOW - 2 * HOUR),
        Run("future", 1, NOW + 10, None),  # clock skew: starts after now
        Run("empty", 1, NOW - 10, NOW - 10),
    ]
    assert recent_usage(runs, NOW, HOUR) == {}


def test_zero_gpu_run_weighs_a_tenth() -> None:
    usage = recent_usage([Run("cpu", 0, NOW - 100, NOW)], NOW, HOUR)
    assert usage["cpu"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("gpus", "cores", "weighs"),
    [
        (0, 1, 2.0),  # a core of a 2-core, 4-GPU host: half the host, 2 GPUs' worth
        (0, 2, 4.0),
        (1, 0, 1.0),
        (1, 1, 2.0),  # its core is the larger share
        (4, 1, 4.0),  # its GPUs are
        (0, 0, 0.1),  # it leased neither
    ],
)
def test_a_run_weighs_its_dominant_share_of_the_host(gpus: int, cores: int, weighs: float) -> None:
    usage = recent_usage([Run("u", gpus, NOW - 10, NOW, cores)], NOW, HOUR, gpus_per_core=2.0)
    assert usage["u"] == pytest.approx(10 * weighs)


def test_a_flood_of_one_core_jobs_outweighs_a_gpu_job_it_outlasts() -> None:
    """Bob's 3,000 one-core jobs against alice's 40 s on one GPU (a 2-core, 4-GPU host):
    once they have run 20 s, fair share puts alice's next job first. At a tenth of a GPU
    each, they stayed below hers for 400 s of the host's cores."""
    flood = [Run("bob", 0, NOW - 30 + i * 0.5, NOW - 29 + i * 0.5, 1) for i in range(50)]
    usage = recent_usage([Run("alice", 1, NOW - 100, NOW - 60), *flood], NOW, HOUR, 2.0)
    assert usage["bob"] > usage["alice"] == pytest.approx(40.0)


def test_usage_sums_per_owner() -> None:
    runs = [Run("a", 1, NOW - 10, NOW), Run("b", 2, NOW - 10, NOW), Run("a", 3, NOW - 10, NOW)]
    assert recent_usage(runs, NOW, HOUR) == {"a": 40.0, "b": 20.0}


runs_st = st.lists(
    st.builds(
        Run,
        owner=st.sampled_from(["a", "b", "c"]),
        gpus=st.integers(0, 8),
        started_at=st.floats(NOW - 3 * HOUR, NOW + HOUR),
        ended_at=st.one_of(st.none(), st.floats(NOW - 3 * HOUR, NOW + HOUR)),
    ),
    max_size=20,
)


def overlap(run: Run, now: float, window: float) -> float:
    end = now if run.ended_at is None else run.ended_at
    return max(0.0, min(end, now) - max(run.started_at, now - window))


@SETTINGS
@given(runs_st, st.floats(1.0, 4 * HOUR))
def test_usage_is_weighted_overlap_with_window(runs: list[Run], window: float) -> None:
    usage = recent_usage(runs, NOW, window)
    expect: dict[str, float] = {}
    for run in runs:
        part = overlap(run, NOW, window)
        if part > 0:
            weight = run.gpus if run.gpus else 0.1
            expect[run.owner] = expect.get(run.owner, 0.0) + weight * part
    assert usage.keys() == expect.keys()
    for owner, value in expect.items():
        assert math.isclose(usage[owner], value, rel_tol=1e-9, abs_tol=1e-6)
    for owner, value in usage.items():
        cap = sum((r.gpus or 0.1) for r in runs if r.owner == owner) * window
        assert 0 < value <= cap * (1 + 1e-9)


@SETTINGS
@given(runs_st, st.floats(1.0, 2 * HOUR), st.floats(0.0, 2 * HOUR))
def test_wider_window_never_counts_less(runs: list[Run], window: float, more: float) -> None:
    narrow = recent_usage(runs, NOW, window)
    wide = recent_usage(runs, NOW, window + more)
    for owner, value in narrow.items():
        assert wide[owner] >= value * (1 - 1e-9)


# --------------------------------------------------------------------------- back-off


def test_backoff_doubles_from_base() -> None:
    assert [retry_backoff_s(a) for a in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def test_backoff_is_capped() -> None:
    assert retry_backoff_s(8) == 256.0
    assert retry_backoff_s(9) == 300.0
    assert retry_backoff_s(101) == 300.0  # the API allows at most 100 retries
    assert retry_backoff_s(4, base_s=1.0, cap_s=5.0) == 5.0
    assert retry_backoff_s(3, base_s=0.5, cap_s=60.0) == 2.0


def test_backoff_before_first_attempt_is_base() -> None:
    assert retry_backoff_s(0) == 2.0
    assert retry_backoff_s(-3) == 2.0


@SETTINGS
@given(st.integers(1, 200), st.floats(0.1, 60.0), st.floats(1.0, 3600.0))
def test_backoff_grows_until_cap(attempt: int, base: float, cap: float) -> None:
    here = retry_backoff_s(attempt, base, cap)
    after = retry_backoff_s(attempt + 1, base, cap)
    assert isinstance(here, float)
    assert min(base, cap) <= here <= cap
    assert here <= after
    if here < cap:
        assert after == pytest.approx(min(cap, 2 * here))
    else:
        assert after == cap


# --------------------------------------------------------------------------- outcomes


def rec(
    exit_code: int | None = 0, signal: int | None = None, error: str | None = None
) -> ExitRecord:
    return ExitRecord(exit_code, signal, started_at=NOW - 10, ended_at=NOW, error=error)


records = st.builds(
    rec,
    exit_code=st.one_of(st.none(), st.integers(0, 255)),
    signal=st.one_of(st.none(), st.integers(1, 31)),
    error=st.one_of(st.none(), st.just("shim could not exec")),
)


def test_clean_exit_succeeds() -> None:
    out = outcome_of(rec(0), None, 10.0)
    assert out.state is JobState.SUCCEEDED
    assert out.reason == "exit code 0"


@pytest.mark.parametrize("code", [1, 2, 137, 255])
def test_nonzero_exit_fails(code: int) -> None:
    out = outcome_of(rec(code), None, 10.0)
    assert out.state is JobState.FAILED
    assert out.reason == f"exit code {code}"


def test_signal_fails_even_with_zero_code() -> None:
    out = outcome_of(rec(None, 9), None, 10.0)
    assert out.state is JobState.FAILED
    assert out.reason == "killed by signal 9"
    assert outcome_of(rec(0, 11), None, 10.0).state is JobState.FAILED


def test_shim_error_fails_even_with_zero_code() -> None:
    out = outcome_of(rec(0, error="no such file: train.py"), None, 10.0)
    assert out.state is JobState.FAILED
    assert out.reason == "no such file: train.py"


def test_no_exit_information_fails() -> None:
    assert outcome_of(rec(None), None, 10.0).state is JobState.FAILED


def test_cancel_and_timeout_reasons() -> None:
    cancelled = outcome_of(rec(None, 15), StopRequest.CANCEL, 10.0)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.reason == "cancelled (SIGTERM, SIGKILL after 10s); killed by signal 15"
    timed_out = outcome_of(rec(0), StopRequest.TIMEOUT, 2.5)
    assert timed_out.state is JobState.TIMED_OUT
    assert timed_out.reason == "time limit reached (SIGTERM, SIGKILL after 2.5s); exit code 0"


@SETTINGS
@given(records, st.sampled_from([None, StopRequest.CANCEL, StopRequest.TIMEOUT]))
def test_outcome_mapping(record: ExitRecord, stop: StopRequest | None) -> None:
    out = outcome_of(record, stop, 10.0)
    if stop is StopRequest.CANCEL:
        # A stop ddpq asked for wins over however the process ended, even exit 0.
        assert out.state is JobState.CANCELLED
    elif stop is StopRequest.TIMEOUT:
        assert out.state is JobState.TIMED_OUT
    elif record.error is None and record.signal is None and record.exit_code == 0:
        assert out.state is JobState.SUCCEEDED
    else:
        assert out.state is JobState.FAILED
    assert out.reason.endswith(describe_exit(record))


# --------------------------------------------------------------------------- retry


def test_should_retry_only_plain_failures_within_budget() -> None:
    assert should_retry(JobState.FAILED, retries_used=0, max_retries=2)
    assert should_retry(JobState.FAILED, retries_used=1, max_retries=2)
    assert not should_retry(JobState.FAILED, retries_used=2, max_retries=2)
    assert not should_retry(JobState.FAILED, retries_used=0, max_retries=0)


@pytest.mark.parametrize(
    "state", [s for s in JobState if s is not JobState.FAILED], ids=lambda s: s.value
)
def test_should_retry_never_for_other_states(state: JobState) -> None:
    assert not should_retry(state, retries_used=0, max_retries=5)


@SETTINGS
@given(st.integers(1, 200), st.integers(0, 100))
def test_max_retries_means_that_many_extra_attempts(failures: int, max_retries: int) -> None:
    # Failures 1 .. max_retries + 1 in all: every one but the last is retried.
    assert should_retry(JobState.FAILED, failures - 1, max_retries) == (failures <= max_retries)


# --------------------------------------------------------------------------- time limits


def test_past_time_limit() -> None:
    assert not past_time_limit(NOW - 59, 60.0, NOW)
    assert past_time_limit(NOW - 60, 60.0, NOW)
    assert past_time_limit(NOW - 61, 60.0, NOW)
    assert not past_time_limit(None, 60.0, NOW)
    assert not past_time_limit(NOW - 1e9, None, NOW)


@pytest.mark.parametrize(
    ("began", "ended", "held"),
    [
        (150.0, 180.0, (150.0, 180.0)),  # a true record is kept as it is
        (150.0, -1e300, (150.0, 150.0)),  # an end before its start: no time at all
        (-1e300, -1e300, (100.0, 100.0)),  # both before the attempt began
        (150.0, 1e300, (150.0, 200.0)),  # an end ahead of now
        (1e300, 1e300, (200.0, 200.0)),
        (50.0, 180.0, (100.0, 180.0)),  # a start before the attempt's
    ],
)
def test_an_exit_records_times_are_held_to_its_attempt(
    began: float, ended: float, held: tuple[float, float]
) -> None:
    """The job can write over the shim's record; its times count in fair share and the
    usage reports only within its attempt's start (100) and now (200)."""
    record = ExitRecord(0, None, began, ended)
    kept = within_attempt(record, 100.0, 200.0)
    assert (kept.started_at, kept.ended_at) == held
    assert kept.exit_code == 0
    no_start = within_attempt(ExitRecord(0, None, 150.0, 1e300), None, 200.0)
    assert (no_start.started_at, no_start.ended_at) == (150.0, 200.0)
