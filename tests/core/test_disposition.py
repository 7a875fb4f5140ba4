"""core.disposition: what follows an ended attempt, for every kind of end (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpq.core.disposition import (
    INTERRUPTED,
    MAX_RELAUNCHES,
    Disposition,
    JobFacts,
    after_exit,
    after_interrupted_launch,
)
from ddpq.core.rules import ExitRecord, StopRequest
from ddpq.core.states import TERMINAL, JobState

NOW = 1_000.0


def rec(code: int | None = 0, sig: int | None = None, launched: bool = True) -> ExitRecord:
    return ExitRecord(code, sig, NOW - 5, NOW, None, launched)


def decide(
    record: ExitRecord,
    clash: bool = False,
    *,
    attempt: int = 1,
    max_retries: int = 0,
    port_retries: int = 0,
    stop: StopRequest | None = None,
    relaunches: int = 0,
    retries_used: int = 0,
) -> Disposition:
    job = JobFacts(attempt, max_retries, port_retries, stop, relaunches, retries_used=retries_used)
    return after_exit(
        record, job, grace_s=10.0, max_port_retries=3, now=NOW, port_clash=lambda: clash
    )


def test_success_and_plain_failure_finish() -> None:
    ok = decide(rec(0))
    assert (ok.job_state, ok.attempt_state, ok.finished) == (JobState.SUCCEEDED,) * 2 + (True,)
    bad = decide(rec(3))
    assert bad.job_state is JobState.FAILED and bad.job_reason == "exit code 3"


def test_a_failure_with_retries_left_is_requeued_after_its_back_off() -> None:
    d = decide(rec(1), attempt=2, max_retries=3, retries_used=1)
    assert d.job_state is JobState.QUEUED and d.attempt_state is JobState.FAILED
    assert d.not_before == NOW + 4.0 and not d.finished and d.retry
    assert d.job_reason == "attempt 2 failed (exit code 1); retry 2 of 3 in 4s"


def test_free_requeues_use_no_retry() -> None:
    """Attempt 5 after two put-off launches, a preemption and a port clash: its failure is
    the job's first, retried (the attempt number stood for the retries used: none left)."""
    d = decide(rec(1), attempt=5, max_retries=1)
    assert d.job_state is JobState.QUEUED and d.retry
    assert d.job_reason == "attempt 5 failed (exit code 1); retry 1 of 1 in 2s"
    spent = decide(rec(1), attempt=6, max_retries=1, retries_used=1)
    assert spent.job_state is JobState.FAILED and not spent.retry


def test_a_port_clash_is_requeued_at_once_within_its_bound_only() -> None:
    d = decide(rec(1), clash=True, port_retries=2)
    assert d.job_state is JobState.QUEUED and d.port_requeue and d.not_before is None
    spent = decide(rec(1), clash=True, port_retries=3)
    assert spent.job_state is JobState.FAILED and not spent.port_requeue


def test_the_log_is_read_only_for_a_failure_that_could_be_a_clash() -> None:
    asked = []

    def clash() -> bool:
        asked.append(1)
        return True

    job = JobFacts(1, 0, 0, None)
    after_exit(rec(0), job, grace_s=1, max_port_retries=3, now=NOW, port_clash=clash)
    after_exit(
        rec(1), JobFacts(1, 0, 3, None), grace_s=1, max_port_retries=3, now=NOW, port_clash=clash
    )
    assert asked == []


def test_a_stop_asked_for_decides_the_state_whatever_the_exit() -> None:
    assert decide(rec(0), stop=StopRequest.CANCEL).job_state is JobState.CANCELLED
    assert decide(rec(None, 15), stop=StopRequest.TIMEOUT).job_state is JobState.TIMED_OUT


@given(st.integers(0, 10), st.sampled_from([None, StopRequest.CANCEL, StopRequest.TIMEOUT]))
def test_an_attempt_that_never_ran_is_requeued_for_free_a_bounded_number_of_times(
    relaunches: int, stop: StopRequest | None
) -> None:
    d = decide(rec(None, launched=False), relaunches=relaunches, stop=stop, max_retries=0)
    assert d == after_interrupted_launch(stop, relaunches)
    if stop is StopRequest.CANCEL:
        assert d.job_state is JobState.CANCELLED
    elif relaunches < MAX_RELAUNCHES:
        assert d.job_state is JobState.QUEUED and d.relaunch and d.job_reason == INTERRUPTED
        assert d.not_before is None
    else:
        assert d.job_state is JobState.FAILED and not d.relaunch


@pytest.mark.parametrize("code", [0, 1, None])
def test_every_disposition_ends_the_attempt_in_a_real_state(code: int | None) -> None:
    d = decide(rec(code))
    assert d.attempt_state in TERMINAL | {JobState.QUEUED}
