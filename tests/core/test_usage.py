"""``ddpq.core.usage``: outside use's sightings and credits, who an account is, and the usage
report, against figures worked out by hand (and properties any grouping must keep)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.names import NAME_RE, UNIX_NAME
from ddpq.core.states import JobState
from ddpq.core.usage import (
    MAX_ACCOUNT_ROWS,
    MAX_ACCOUNTS_PER_GPU,
    MAX_CREDIT_S,
    OTHER,
    UNKNOWN,
    By,
    Finished,
    FirstStart,
    JobSpan,
    OutsideSpan,
    Sighting,
    account_label,
    attribute,
    credit,
    parse_since,
    percentile,
    report,
    sightings,
)

H = 3600.0
T = 1_000_000.0
STATES = {
    JobState.SUCCEEDED: 0,
    JobState.FAILED: 0,
    JobState.CANCELLED: 0,
    JobState.TIMED_OUT: 0,
}


def gpu(index: int, *owners: tuple[int, int | None, str | None]) -> Gpu:
    procs = tuple(GpuProcess(pid, 100, uid=uid, account=name) for pid, uid, name in owners)
    return Gpu(index, f"GPU-{index}", "g", 1000, 0, procs, False)


# ---- sightings, credits, attribution --------------------------------------------------


def test_an_account_is_seen_once_per_gpu_whatever_its_processes() -> None:
    gpus = [
        gpu(0, (1, 1000, "alice"), (2, 1000, "alice"), (3, 1001, "bob"), (4, None, None)),
        gpu(1, (5, 1000, "alice")),
        gpu(2),
    ]
    assert sightings(gpus) == [
        Sighting(1000, "alice", 0),
        Sighting(1001, "bob", 0),
        Sighting(None, None, 0),
        Sighting(1000, "alice", 1),
    ]


def test_accounts_past_the_bound_on_one_gpu_are_seen_as_unknown() -> None:
    many = [(pid, 100_000 + pid, None) for pid in range(1, MAX_ACCOUNTS_PER_GPU + 10)]
    seen = sightings([gpu(0, *many)])
    assert len(seen) == MAX_ACCOUNTS_PER_GPU + 1
    assert seen[-1] == Sighting(None, None, 0)
    assert {s.uid for s in seen[:-1]} == {100_000 + pid for pid in range(1, 17)}


def test_a_sample_stands_for_the_time_since_the_last_one_within_a_bound() -> None:
    assert credit(T, None, 5.0) == 5.0  # the first: the sampling interval
    assert credit(T + 7, T, 5.0) == 7.0
    assert credit(T + 3600, T, 5.0) == MAX_CREDIT_S  # NVML was blind meanwhile
    assert credit(T - 10, T, 5.0) == 5.0  # a clock stepped back


def test_account_labels_never_look_like_an_account() -> None:
    assert account_label(1000, "alice") == "alice"
    assert account_label(1234, None) == "uid 1234"
    assert account_label(None, None) == UNKNOWN
    for label in ("uid 1234", UNKNOWN, OTHER):  # no account, nor ddpq user, has such a name
        assert not UNIX_NAME.match(label) and not NAME_RE.match(label)


def test_an_account_is_its_one_mapped_user_or_without_auth_the_user_of_its_name() -> None:
    mapped = {"robert": ["bob"], "lab": ["carol", "dave"], "alice": ["alice"]}
    accounts = ["robert", "lab", "alice", "erin", "uid 1234", UNKNOWN]
    assert attribute(accounts, mapped, names_are_users=False) == {"robert": "bob", "alice": "alice"}
    # Without --auth a user is whoever their login name says; "lab" stays ambiguous.
    assert attribute(accounts, mapped, names_are_users=True) == {
        "robert": "bob",
        "alice": "alice",
        "erin": "erin",
    }


@pytest.mark.parametrize("text", ["", "0", "-1d", "abc", "nan", "inf", "1e400", "3651d", "1w"])
def test_since_must_be_a_duration_within_ten_years(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


def test_since_reads_durations() -> None:
    assert parse_since("30d") == 30 * 86400
    assert parse_since("1d12h") == 36 * H
    assert parse_since("3650d") == 3650 * 86400


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([20.0, 10.0], 0.5) == 15.0
    assert percentile([60.0, 600.0, 120.0], 0.9) == pytest.approx(504.0)


# ---- the report, by hand ----------------------------------------------------------------


def test_by_user_figures_worked_out_by_hand() -> None:
    since, now = T, T + 10 * H
    jobs = [
        JobSpan("alice", 2, T - H, T + H),  # half before the window: 2 GPUs x 1 h
        JobSpan("alice", 1, T + 2 * H, None),  # running: 8 h to now
        JobSpan("bob", 4, T + H, T + 1.5 * H),  # 4 x 0.5 h
        JobSpan("bob", 0, T, T + 5 * H),  # no GPU: no GPU time
        JobSpan("carol", 1, T - 5 * H, T - H),  # before the window
    ]
    outside = [
        OutsideSpan(1000, "alice", T + H, T + 3 * H),  # 2 h, alice's own name
        OutsideSpan(1001, "robert", T + 9 * H, T + 11 * H),  # bob's account: 1 h to now
        OutsideSpan(2000, None, T, T + 0.5 * H),  # a uid with no account
        OutsideSpan(None, None, T - H, T + 0.25 * H),  # unknown
    ]
    finished = [
        Finished("alice", JobState.SUCCEEDED, T + H),
        Finished("alice", JobState.FAILED, T + 2 * H),
        Finished("bob", JobState.CANCELLED, T + 1.5 * H),
        Finished("carol", JobState.TIMED_OUT, T - 1),  # before
        Finished("carol", JobState.SUCCEEDED, T + 11 * H),  # after now
    ]
    firsts = [
        FirstStart("alice", T + 2 * H, 60.0),
        FirstStart("alice", T + 3 * H, 120.0),
        FirstStart("alice", T + 4 * H, 600.0),
        FirstStart("bob", T + H, 30.0),
        FirstStart("carol", T - H, 999.0),  # before
    ]
    people = {"alice": "alice", "robert": "bob"}
    r = report(jobs, outside, finished, firsts, people, since, now, By.USER)
    got = {(row.kind, row.key): row for row in r.rows}
    assert [(row.kind, row.key) for row in r.rows] == [
        ("user", "alice"),
        ("user", "bob"),
        ("account", "uid 2000"),
        ("account", UNKNOWN),
    ]
    alice, bob = got[("user", "alice")], got[("user", "bob")]
    assert (alice.gpu_hours_jobs, alice.gpu_hours_outside) == (10.0, 2.0)
    assert alice.jobs == {**STATES, JobState.SUCCEEDED: 1, JobState.FAILED: 1}
    assert (alice.jobs_started, alice.wait_p50_s) == (3, 120.0)
    assert alice.wait_p90_s == pytest.approx(504.0)  # 120 + 0.8 x (600 - 120)
    assert (bob.gpu_hours_jobs, bob.gpu_hours_outside) == (2.0, 1.0)
    assert bob.jobs == {**STATES, JobState.CANCELLED: 1}
    assert (bob.jobs_started, bob.wait_p50_s, bob.wait_p90_s) == (1, 30.0, 30.0)
    assert got[("account", "uid 2000")].gpu_hours_outside == 0.5
    assert got[("account", UNKNOWN)].gpu_hours_outside == 0.25
    total = r.total
    assert (total.gpu_hours_jobs, total.gpu_hours_outside) == (12.0, 3.75)
    assert total.jobs == {
        **STATES,
        JobState.SUCCEEDED: 1,
        JobState.FAILED: 1,
        JobState.CANCELLED: 1,
    }
    assert (total.jobs_started, total.wait_p50_s) == (4, 90.0)
    assert total.wait_p90_s == pytest.approx(456.0)  # [30, 60, 120, 600] at 2.7


def midnight(year: int, month: int, day: int) -> float:
    return datetime(year, month, day, tzinfo=UTC).timestamp()


def test_by_day_cuts_at_utc_midnight() -> None:
    d = midnight(2026, 11, 30)
    jobs = [JobSpan("alice", 1, d - 2 * H, d + 2 * H), JobSpan("bob", 2, d + 23 * H, d + 25 * H)]
    outside = [OutsideSpan(1000, "alice", d + 30 * H, d + 40 * H)]
    finished = [Finished("alice", JobState.SUCCEEDED, d + H)]
    firsts = [FirstStart("alice", d - H, 60.0)]
    r = report(jobs, outside, finished, firsts, {}, d - 12 * H, d + 36 * H, By.DAY)
    rows = {row.key: row for row in r.rows}
    assert list(rows) == ["2026-11-29", "2026-11-30", "2026-12-01"]
    assert {k: (v.gpu_hours_jobs, v.gpu_hours_outside) for k, v in rows.items()} == {
        "2026-11-29": (2.0, 0.0),
        "2026-11-30": (4.0, 0.0),  # alice's 2 h, bob's 2 GPUs x 1 h
        "2026-12-01": (2.0, 6.0),  # outside use up to now
    }
    assert rows["2026-11-30"].jobs[JobState.SUCCEEDED] == 1
    assert rows["2026-11-29"].wait_p50_s == 60.0
    assert all(row.kind == "day" for row in r.rows)


def test_by_month_cuts_at_the_new_year() -> None:
    ny = midnight(2027, 1, 1)
    r = report([JobSpan("a", 1, ny - H, ny + H)], [], [], [], {}, ny - 86400, ny + 86400, By.MONTH)
    assert [(row.key, row.gpu_hours_jobs) for row in r.rows] == [("2026-12", 1.0), ("2027-01", 1.0)]


def test_accounts_of_no_user_are_bounded_the_least_summed_as_other() -> None:
    outside = [OutsideSpan(5000 + i, None, T, T + (i + 1)) for i in range(MAX_ACCOUNT_ROWS + 50)]
    r = report([], outside, [], [], {}, T, T + H, By.USER)
    assert len(r.rows) == MAX_ACCOUNT_ROWS
    assert r.rows[-1].key == OTHER
    # The 51 that used least (1..51 s) are summed; nothing is lost from the total.
    assert r.rows[-1].gpu_hours_outside == pytest.approx(sum(range(1, 52)) / H)
    assert sum(row.gpu_hours_outside for row in r.rows) == pytest.approx(r.total.gpu_hours_outside)


# ---- properties ---------------------------------------------------------------------------

times = st.floats(T - 3 * 86400, T + 3 * 86400, allow_nan=False)
job_spans = st.builds(
    lambda owner, n, a, b, running: JobSpan(owner, n, min(a, b), None if running else max(a, b)),
    st.sampled_from(["alice", "bob", "carol"]),
    st.integers(0, 8),
    times,
    times,
    st.booleans(),
)
outside_spans = st.builds(
    lambda uid, a, b: OutsideSpan(uid, None, min(a, b), max(a, b)),
    st.one_of(st.none(), st.integers(1000, 1003)),
    times,
    times,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(job_spans, max_size=20),
    st.lists(outside_spans, max_size=20),
    st.floats(60.0, 4 * 86400.0),
)
def test_every_grouping_adds_up_to_the_same_total_within_the_window(
    jobs: list[JobSpan], outside: list[OutsideSpan], window: float
) -> None:
    now = T + 86400
    since = now - window
    totals = []
    for by in By:
        r = report(jobs, outside, [], [], {}, since, now, by)
        assert math.isclose(
            sum(row.gpu_hours_jobs for row in r.rows), r.total.gpu_hours_jobs, abs_tol=1e-9
        )
        assert math.isclose(
            sum(row.gpu_hours_outside for row in r.rows), r.total.gpu_hours_outside, abs_tol=1e-9
        )
        totals.append((r.total.gpu_hours_jobs, r.total.gpu_hours_outside))
    for jobs_h, outside_h in totals[1:]:
        assert math.isclose(jobs_h, totals[0][0], abs_tol=1e-9)
        assert math.isclose(outside_h, totals[0][1], abs_tol=1e-9)
    # No span counts for more than the window.
    assert totals[0][0] <= sum(j.gpus for j in jobs) * window / H + 1e-9
    assert totals[0][1] <= len(outside) * window / H + 1e-9


GIB = 1 << 30


def test_memory_reserved_against_measured_worked_out_by_hand() -> None:
    """Sharing attempts' reservations and peaks in GiB-hours (GPUs x hours x GiB), the
    peaks only of the attempts that reserved, so that the two compare; the highest peak of
    any attempt; nothing reserved or measured: null, not 0."""
    jobs = [
        JobSpan("alice", 2, T, T + 3 * H, mem_bytes=4 * GIB, peak_bytes=3 * GIB),  # 24 / 18
        JobSpan("alice", 1, T, T + H, mem_bytes=6 * GIB),  # 6 reserved, never measured
        JobSpan("alice", 4, T, T + H, peak_bytes=20 * GIB),  # whole GPUs: its peak only
        JobSpan("bob", 1, T, T + H),  # nothing known
        # Half of it in the window: 1 GPU x 0.5 h x 8 GiB reserved, 2 GiB measured.
        JobSpan("carol", 1, T - H / 2, T + H / 2, mem_bytes=8 * GIB, peak_bytes=2 * GIB),
    ]
    r = report(jobs, [], [], [], {}, T, T + 10 * H, By.USER)
    rows = {row.key: row for row in r.rows}
    alice, bob, carol = rows["alice"], rows["bob"], rows["carol"]
    assert (alice.mem_reserved_gib_h, alice.mem_used_gib_h) == (30.0, 18.0)
    assert alice.mem_used_peak_gib == 20.0
    assert (bob.mem_reserved_gib_h, bob.mem_used_gib_h, bob.mem_used_peak_gib) == (None,) * 3
    assert (carol.mem_reserved_gib_h, carol.mem_used_gib_h) == (4.0, 1.0)
    total = r.total
    assert (total.mem_reserved_gib_h, total.mem_used_gib_h) == (34.0, 19.0)
    assert total.mem_used_peak_gib == 20.0
    by_day = report(jobs, [], [], [], {}, T, T + 10 * H, By.DAY)
    assert sum(row.mem_reserved_gib_h or 0.0 for row in by_day.rows) == 34.0
