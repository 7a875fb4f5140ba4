"""Properties and examples for ``ddpq.core.retention.plan``: never a job that has not
finished, the budget met whenever the finished jobs' folders can meet it, oldest first,
checkpoints before logs, rows only by age and never the newest one."""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpq.core.retention import JobFolder, Plan, Policy, What, is_finished, plan
from ddpq.core.states import TERMINAL, JobState

NOW = 1_000_000.0
DAY = 86400.0
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# The strategies a draw uses, made once: Hypothesis validates each new strategy object when
# it is first drawn from, so one made inside a draw costs that on every example (a third of
# these tests' CPU). Where a bound depends on the example, one per bound.
states = st.sampled_from(list(JobState))
# A job requeued for a retry still carries its last attempt's end: only its state says it
# is not finished.
finished_if_terminal = {terminal: st.booleans() | st.just(terminal) for terminal in (False, True)}
exists_mostly = st.booleans() | st.just(True)


@functools.cache
def distinct_ids(count: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, 10_000), min_size=count, max_size=count, unique=True)


@st.composite
def job_folders(draw: st.DrawFn) -> list[JobFolder]:
    count = draw(st.integers(0, 12))
    jobs = []
    for job_id in draw(distinct_ids(count)):
        state = draw(states)
        finished = draw(finished_if_terminal[state in TERMINAL])
        exists = draw(exists_mostly)
        jobs.append(
            JobFolder(
                job_id,
                state,
                NOW - draw(st.floats(0, 90 * DAY)) if finished else None,
                draw(st.integers(0, 10**9)) if exists else 0,
                draw(st.integers(0, 10**7)) if exists else 0,
                exists,
            )
        )
    return jobs


policies = st.builds(
    Policy,
    st.none() | st.floats(1, 60 * DAY),
    st.none() | st.integers(0, 5 * 10**9),
    st.booleans(),
)


def after(jobs: list[JobFolder], p: Plan) -> int:
    """What the folders hold once the plan's removals are made, from the jobs themselves."""
    left = {j.job_id: [j.checkpoint_bytes, j.record_bytes] for j in jobs}
    for r in p.removals:
        if r.what is What.CHECKPOINTS:
            left[r.job_id][0] = 0
        elif r.what is What.FOLDER:
            left[r.job_id] = [0, 0]
    return sum(a + b for a, b in left.values())


@SETTINGS
@given(job_folders(), policies, st.booleans())
def test_never_a_job_that_has_not_finished(
    jobs: list[JobFolder], policy: Policy, newest_is_max: bool
) -> None:
    newest = max((j.job_id for j in jobs), default=None) if newest_is_max else None
    p = plan(jobs, policy, NOW, newest_id=newest)
    by_id = {j.job_id: j for j in jobs}
    for r in p.removals:
        assert is_finished(by_id[r.job_id]), r
        assert by_id[r.job_id].state in TERMINAL
        if r.what is What.ROW:
            assert policy.prune_rows and r.job_id != newest
    assert p.left_bytes == after(jobs, p)


@SETTINGS
@given(job_folders(), policies)
def test_the_budget_is_met_when_it_can_be(jobs: list[JobFolder], policy: Policy) -> None:
    p = plan(jobs, policy, NOW)
    if policy.budget_bytes is None:
        assert not p.over_budget
        assert all(r.why.startswith("finished more than") for r in p.removals)
        return
    untouchable = sum(j.total_bytes for j in jobs if not is_finished(j))
    if untouchable <= policy.budget_bytes:
        assert p.left_bytes <= policy.budget_bytes and not p.over_budget
    else:  # everything finished goes, and it is still not enough
        assert p.over_budget and p.left_bytes == untouchable


@SETTINGS
@given(job_folders(), policies)
def test_the_budget_takes_the_oldest_first_checkpoints_before_logs_and_no_more_than_needed(
    jobs: list[JobFolder], policy: Policy
) -> None:
    p = plan(jobs, Policy(None, policy.budget_bytes), NOW)
    finished = sorted((j for j in jobs if is_finished(j)), key=lambda j: (j.finished_at, j.job_id))
    cut = {r.job_id for r in p.of(What.CHECKPOINTS)}
    whole = {r.job_id for r in p.of(What.FOLDER)}
    # Oldest first: a job spared is younger than every job trimmed.
    trimmed = [i for i, j in enumerate(finished) if j.job_id in cut]
    with_checkpoints = [i for i, j in enumerate(finished) if j.checkpoint_bytes]
    if trimmed:
        assert with_checkpoints[: len(trimmed)] == trimmed
    removed = [i for i, j in enumerate(finished) if j.job_id in whole]
    existing = [i for i, j in enumerate(finished) if j.exists]
    assert existing[: len(removed)] == removed
    # Logs only once every finished job's checkpoints are gone.
    if whole:
        assert cut == {j.job_id for j in finished if j.checkpoint_bytes}
    # No more than needed: without the last removal, the folders would be over the budget.
    if p.removals:
        assert policy.budget_bytes is not None
        shorter = Plan(p.removals[:-1], p.total_bytes, 0, False)
        assert after(jobs, shorter) > policy.budget_bytes
    elif policy.budget_bytes is not None:
        assert (
            p.total_bytes <= policy.budget_bytes
            or not finished
            or not any(j.total_bytes for j in finished)
        )


@SETTINGS
@given(job_folders(), st.floats(1, 60 * DAY), st.booleans())
def test_by_age_every_old_finished_job_goes_and_no_younger_one(
    jobs: list[JobFolder], keep: float, rows: bool
) -> None:
    p = plan(jobs, Policy(keep, None, rows), NOW)
    old = {
        j.job_id
        for j in jobs
        if is_finished(j) and j.finished_at is not None and j.finished_at <= NOW - keep
    }
    assert {r.job_id for r in p.of(What.FOLDER)} == {
        j for j in old if next(x for x in jobs if x.job_id == j).exists
    }
    assert {r.job_id for r in p.of(What.ROW)} == (old if rows else set())
    # A row goes after its folder.
    order = [(r.job_id, r.what) for r in p.removals]
    for job_id, what in order:
        if what is What.ROW and (job_id, What.FOLDER) in order:
            assert order.index((job_id, What.FOLDER)) < order.index((job_id, What.ROW))


def test_an_example_by_age_and_budget() -> None:
    jobs = [
        JobFolder(1, JobState.SUCCEEDED, NOW - 40 * DAY, 500, 10),  # old: all of it, and row
        JobFolder(2, JobState.FAILED, NOW - 10 * DAY, 300, 10),  # oldest left: checkpoints
        JobFolder(3, JobState.CANCELLED, NOW - 5 * DAY, 300, 10),  # spared: budget met
        JobFolder(4, JobState.RUNNING, None, 900, 10),  # never
        JobFolder(5, JobState.QUEUED, None, 0, 0, exists=False),
    ]
    p = plan(jobs, Policy(30 * DAY, 1300, True), NOW, newest_id=5, age_label="30d")
    assert [(r.job_id, r.what, r.bytes) for r in p.removals] == [
        (
            1,
            What.FOLDER,
            510,
        ),
        (1, What.ROW, 0),
        (2, What.CHECKPOINTS, 300),
    ]
    assert p.removals[0].why == "finished more than 30d ago"
    assert p.removals[2].why == "job folders over the budget"
    assert (p.total_bytes, p.left_bytes, p.over_budget) == (2040, 1230, False)


def test_the_newest_row_stays_so_that_its_id_is_never_given_again() -> None:
    jobs = [JobFolder(9, JobState.SUCCEEDED, NOW - 40 * DAY, 0, 0, exists=False)]
    assert plan(jobs, Policy(DAY, None, True), NOW, newest_id=9).removals == ()
    assert [r.what for r in plan(jobs, Policy(DAY, None, True), NOW, newest_id=10).removals] == [
        What.ROW
    ]


def test_folders_of_no_known_job_count_but_never_go() -> None:
    jobs = [JobFolder(1, JobState.SUCCEEDED, NOW - DAY, 100, 10)]
    p = plan(jobs, Policy(None, 150), NOW, other_bytes=200)
    # Its checkpoints, then (still over) its log: never the 200.
    assert [(r.job_id, r.what) for r in p.removals] == [(1, What.CHECKPOINTS), (1, What.FOLDER)]
    assert (p.left_bytes, p.over_budget) == (200, True)
    # A folder already empty frees nothing: it stays.
    empty = plan(
        [JobFolder(1, JobState.SUCCEEDED, NOW - DAY, 100, 0)],
        Policy(None, 150),
        NOW,
        other_bytes=200,
    )
    assert [(r.job_id, r.what) for r in empty.removals] == [(1, What.CHECKPOINTS)]


def folder(job_id: int, owner: str, gb: int, finished: bool = True) -> JobFolder:
    """Job ``job_id`` of ``owner``: ``gb`` of checkpoints and a 1-byte log; finished
    ``job_id`` days ago, or running."""
    state, at = (JobState.SUCCEEDED, NOW - job_id * DAY) if finished else (JobState.RUNNING, None)
    return JobFolder(job_id, state, at, gb * GB, 1, owner=owner)


GB = 1 << 30


def test_one_users_running_folders_never_cost_another_users_files() -> None:
    """bob fills the disk with running jobs' folders (which never go): alice, within an
    equal share of the budget, keeps everything, however old; the budget is said to be
    over instead."""
    jobs = [folder(1, "bob", 300, finished=False), folder(2, "bob", 200, finished=False)]
    jobs += [folder(30, "alice", 40), folder(20, "alice", 40)]
    p = plan(jobs, Policy(None, 500 * GB), NOW)
    assert p.removals == () and p.over_budget


def test_a_row_whose_folder_is_gone_is_no_user_of_the_budget() -> None:
    """Rows pruned by age whose folders are already gone hold nothing: they must not count
    as a user among whom the budget is shared (that would shrink alice's share)."""
    jobs = [folder(1, "bob", 700, finished=False), folder(40, "alice", 400)]
    gone = JobFolder(900, JobState.CANCELLED, NOW - 900 * DAY, exists=False, owner="cat")
    rowless = JobFolder(901, JobState.CANCELLED, NOW - 901 * DAY, exists=False)
    for extra in ([], [gone], [gone, rowless]):
        p = plan([*jobs, *extra], Policy(100 * DAY, 1000 * GB, prune_rows=True), NOW)
        assert p.of(What.CHECKPOINTS) == [] and p.over_budget, extra


def test_the_budget_trims_the_user_holding_the_most_first() -> None:
    """bob writes into his finished folders from his shell: his oldest go, never alice's
    older ones, while he holds more than she does and more than half the budget."""
    jobs = [folder(100, "alice", 100), folder(90, "alice", 100)]
    jobs += [folder(10, "bob", 300), folder(5, "bob", 300), folder(1, "bob", 300)]
    p = plan(jobs, Policy(None, 801 * GB), NOW)
    assert [(r.job_id, r.what) for r in p.removals] == [(10, What.CHECKPOINTS)]
    assert not p.over_budget
    # Both over their share of a small budget: the one holding more, turn by turn.
    p = plan(jobs, Policy(None, 200 * GB), NOW)
    assert [r.job_id for r in p.of(What.CHECKPOINTS)] == [10, 5, 1, 100]
    assert p.left_bytes <= 200 * GB


owners = st.sampled_from(["alice", "bob", "cat"])


@SETTINGS
@given(job_folders(), st.lists(owners, min_size=12, max_size=12), st.integers(0, 5 * 10**9))
def test_under_a_budget_no_user_within_an_equal_share_loses_anything(
    jobs: list[JobFolder], whose: list[str], budget: int
) -> None:
    """Whatever the others hold, a user whose folders hold no more than an equal share of
    the budget keeps every file; each user's removals go oldest first."""
    jobs = [replace(j, owner=o) for j, o in zip(jobs, whose, strict=False)]
    p = plan(jobs, Policy(None, budget), NOW)
    held = {j.owner: 0 for j in jobs}
    for j in jobs:
        held[j.owner] += j.total_bytes
    share = budget / max(1, sum(1 for b in held.values() if b > 0))  # those holding anything
    by_id = {j.job_id: j for j in jobs}
    for owner, total in held.items():
        lost = [by_id[r.job_id] for r in p.removals if by_id[r.job_id].owner == owner]
        if total <= share:
            assert lost == [], owner
        for what in What:
            theirs = [by_id[r.job_id] for r in p.of(what) if by_id[r.job_id].owner == owner]
            assert theirs == sorted(theirs, key=lambda j: (j.finished_at, j.job_id))
