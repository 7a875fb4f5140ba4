"""``ddpq.core.deps``: waiting on jobs and on whole sweeps."""

from __future__ import annotations

from ddpq.core.deps import SweepStanding, dependency_verdict, settle_change, waiting_place
from ddpq.core.states import JobState

S, F, Q, H, C = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.QUEUED,
    JobState.HELD,
    JobState.CANCELLED,
)


def test_a_sweep_is_ready_only_when_every_member_succeeded() -> None:
    assert dependency_verdict({}, {3: SweepStanding(4, 4)}).ready
    assert not dependency_verdict({}, {3: SweepStanding(4, 3)}).ready
    assert not dependency_verdict({1: S}, {3: SweepStanding(4, 3)}).ready
    assert not dependency_verdict({1: Q}, {3: SweepStanding(4, 4)}).ready


def test_one_failed_member_dooms_whoever_waits_on_the_sweep() -> None:
    verdict = dependency_verdict({}, {3: SweepStanding(4, 2, (17, F))})
    assert (verdict.doomed_by, verdict.doomed_state, verdict.doomed_sweep) == (17, F, 3)
    assert verdict.doomed_reason() == "dependency sweep 3: its job 17 failed"
    # A failed job is named first, as before sweeps existed.
    both = dependency_verdict({5: C}, {3: SweepStanding(4, 2, (17, F))})
    assert both.doomed_reason() == "dependency 5 cancelled"


def test_where_a_waiting_job_belongs() -> None:
    running = {3: SweepStanding(4, 1)}
    assert waiting_place({1: Q}, running, False) == (
        H,
        "waiting for job 1 to succeed; waiting for every job of sweep 3 to succeed",
    )
    assert waiting_place({}, {3: SweepStanding(2, 2)}, True) == (H, "held by user")
    assert waiting_place({1: S}, {3: SweepStanding(2, 2)}, False) == (
        Q,
        "dependencies met, released",
    )
    assert waiting_place({}, {3: SweepStanding(2, 1, (8, F))}, True)[0] is C


def test_settle_change_moves_only_what_must_move() -> None:
    assert settle_change(H, "held by user", (H, "held by user")) is None
    assert settle_change(Q, "waiting in line", (Q, "dependencies met, released")) is None
    assert settle_change(H, "x", (Q, "dependencies met, released")) == (
        Q,
        "dependencies met, released",
    )
    assert settle_change(Q, "", (H, "held by user")) == (H, "held by user")
    assert settle_change(H, "held by user", (C, "dependency 1 failed")) == (
        C,
        "dependency 1 failed",
    )
