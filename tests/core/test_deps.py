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


def test_each_kind_is_met_never_met_or_pending_by_how_the_job_ended() -> None:
    from ddpq.core.deps import Kind, job_met

    ok, any_, notok = Kind.OK, Kind.ANY, Kind.NOTOK
    assert [job_met(ok, s) for s in (S, F, C, Q)] == [True, False, False, None]
    assert [job_met(any_, s) for s in (S, F, C, Q)] == [True, True, True, None]
    assert [job_met(notok, s) for s in (S, F, C, Q)] == [False, True, True, None]


def test_kinds_on_sweeps_wait_for_every_member_to_end() -> None:
    from ddpq.core.deps import Kind, sweep_met

    running = SweepStanding(3, 1, (5, F), ended=2)
    done_badly = SweepStanding(3, 2, (5, F), ended=3)
    all_good = SweepStanding(3, 3, None, ended=3)
    assert sweep_met(Kind.OK, running) is False  # one failure dooms afterok at once
    assert sweep_met(Kind.ANY, running) is None and sweep_met(Kind.NOTOK, running) is None
    assert sweep_met(Kind.ANY, done_badly) and sweep_met(Kind.NOTOK, done_badly)
    assert sweep_met(Kind.NOTOK, all_good) is False and sweep_met(Kind.OK, all_good)


def test_reasons_say_what_each_kind_waits_for_and_why_it_can_never_be_met() -> None:
    from ddpq.core.deps import Kind

    kinds = {1: Kind.ANY, 2: Kind.NOTOK}
    sweeps = {4: SweepStanding(2, 0, None, ended=1)}
    assert waiting_place({1: Q, 2: Q, 3: Q}, sweeps, False, kinds, {4: Kind.ANY}, [9]) == (
        H,
        "waiting for job 3 to succeed; waiting for job 1 to end; waiting for job 2 to end "
        "without success; waiting for every job of sweep 4 to end; "
        "singleton: waiting for job 9 of the same name and user to end",
    )
    assert waiting_place({1: F, 2: C}, {}, False, kinds) == (Q, "dependencies met, released")
    assert waiting_place({2: S}, {}, False, kinds) == (
        C,
        "dependency 2 succeeded; afternotok can never be met",
    )
    good = {4: SweepStanding(2, 2, None, ended=2)}
    assert waiting_place({}, good, False, None, {4: Kind.NOTOK}) == (
        C,
        "dependency sweep 4: every job succeeded; afternotok can never be met",
    )
    # A singleton with nothing earlier left, and nothing else, is released.
    assert waiting_place({}, {}, False, earlier=[]) == (Q, "dependencies met, released")


def test_dependency_text_reads_slurms_forms_and_refuses_the_rest() -> None:
    import pytest

    from ddpq.core.dependency_text import parse, text_of
    from ddpq.core.deps import Kind

    d = parse("afterok:1:2,afterany:s3, afternotok:4,singleton")
    assert d.jobs == {1: Kind.OK, 2: Kind.OK, 4: Kind.NOTOK}
    assert d.sweeps == {3: Kind.ANY} and d.singleton
    assert d.of(Kind.OK) == ((1, 2), ())
    kinds = {k: d.of(k) for k in Kind}
    assert text_of(kinds, True) == "afterok:1:2,afterany:s3,afternotok:4,singleton"
    for bad, says in [
        ("after:3", "not a dependency kind"),
        ("aftercorr:3", "not a dependency kind"),
        ("afterok:x", "not a job id"),
        ("afterok:0", "not a job id"),
        ("afterok:-3", "not a job id"),
        ("afterok:3:", "not a job id"),
        ("afterok", "give the job ids"),
        ("afterok:3,afterany:3", "named as both"),
        ("afterok:1?afterany:2", "not supported"),
        ("", "not a dependency kind"),
        ("afterok:" + ":".join(str(i) for i in range(1, 70)), "at most 64"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse(bad)
