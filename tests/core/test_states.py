"""Job state transitions (ddpq.core.states)."""

from __future__ import annotations

import itertools

import pytest

from ddpq.core.states import (
    ACTIVE,
    ATTEMPT_ONLY,
    TERMINAL,
    WAITING,
    InvalidTransition,
    JobState,
    can_transition,
    check_transition,
)

S = JobState
ALLOWED = {
    (S.QUEUED, S.STARTING),
    (S.QUEUED, S.HELD),
    (S.QUEUED, S.CANCELLED),
    (S.HELD, S.QUEUED),
    (S.HELD, S.CANCELLED),
    (S.STARTING, S.RUNNING),
    (S.STARTING, S.QUEUED),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.CANCELLED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.TIMED_OUT),
    (S.RUNNING, S.QUEUED),
}
ALL_PAIRS = list(itertools.product(JobState, JobState))


def pair_id(pair: tuple[JobState, JobState]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


@pytest.mark.parametrize("pair", sorted(ALLOWED), ids=pair_id)
def test_allowed_transitions(pair: tuple[JobState, JobState]) -> None:
    old, new = pair
    assert can_transition(old, new)
    check_transition(old, new)  # does not raise


@pytest.mark.parametrize("pair", [p for p in ALL_PAIRS if p not in ALLOWED], ids=pair_id)
def test_forbidden_transitions_raise(pair: tuple[JobState, JobState]) -> None:
    old, new = pair
    assert not can_transition(old, new)
    with pytest.raises(InvalidTransition, match=f"from {old.value} to {new.value}"):
        check_transition(old, new)


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=str)
def test_terminal_states_have_no_way_out(state: JobState) -> None:
    assert not any(can_transition(state, new) for new in JobState)
    for new in JobState:
        with pytest.raises(InvalidTransition):
            check_transition(state, new)


def test_invalid_transition_is_a_value_error() -> None:
    assert issubclass(InvalidTransition, ValueError)
    with pytest.raises(ValueError):
        check_transition(S.SUCCEEDED, S.RUNNING)


def test_no_self_loops() -> None:
    assert not any(can_transition(s, s) for s in JobState)


def test_state_groups() -> None:
    assert {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT} == TERMINAL
    assert {S.STARTING, S.RUNNING} == ACTIVE
    assert {S.QUEUED, S.HELD} == WAITING
    # "preempted" ends attempts only: the job itself goes back to the queue.
    assert (
        set(JobState)
        == TERMINAL | ACTIVE | WAITING | ATTEMPT_ONLY
        == TERMINAL | ACTIVE | WAITING | {S.PREEMPTED}
    )
    assert not (TERMINAL & ACTIVE or TERMINAL & WAITING or ACTIVE & WAITING)


def test_no_job_is_ever_in_the_preempted_state() -> None:
    assert not any(can_transition(old, S.PREEMPTED) for old in JobState)
    assert not any(can_transition(S.PREEMPTED, new) for new in JobState)


def test_a_job_cannot_skip_starting() -> None:
    # Leases are taken in STARTING: a queued job never jumps straight to running.
    assert not can_transition(S.QUEUED, S.RUNNING)
    assert not can_transition(S.HELD, S.STARTING)


@pytest.mark.parametrize("state", sorted(set(JobState) - TERMINAL - ATTEMPT_ONLY), ids=str)
def test_every_live_state_can_be_cancelled(state: JobState) -> None:
    assert can_transition(state, S.CANCELLED)


@pytest.mark.parametrize("state", sorted(set(JobState) - TERMINAL - ATTEMPT_ONLY), ids=str)
def test_every_live_state_can_finish(state: JobState) -> None:
    seen, todo = {state}, [state]
    while todo:
        here = todo.pop()
        for new in JobState:
            if can_transition(here, new) and new not in seen:
                seen.add(new)
                todo.append(new)
    assert seen & TERMINAL
    # Only a job that ran can succeed or time out.
    if state in WAITING | {S.STARTING}:
        assert not can_transition(state, S.SUCCEEDED)
        assert not can_transition(state, S.TIMED_OUT)
