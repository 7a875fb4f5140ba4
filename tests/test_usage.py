"""``GET /v1/usage`` and the outside-use series of ``/metrics``, on a hand-made history.

The history is written into a migrated database as rows (jobs, their attempts and leases,
intervals of outside use), as the worker would have left them; every figure expected
below is worked out by hand from it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ddpq.core.gpus import Gpu, GpuProcess
from ddpq.core.states import JobState
from ddpq.core.usage import By
from ddpq.server.metrics import MAX_ACCOUNT_SERIES
from ddpq.store import devices as device_store
from ddpq.store import usage as usage_store
from ddpq.store import users as user_store
from ddpq.store.db import Database
from tests.inprocess import lent_client

H = 3600.0
# Midnight UTC five days ago: the whole history lies in the past and within `since=30d`.
B = (int(time.time() // 86400) - 5) * 86400.0


def day(offset: int) -> str:
    return datetime.fromtimestamp(B + offset * 86400, UTC).strftime("%Y-%m-%d")


JOB_COLUMNS = (
    "name, owner, command, cwd, env, launcher, gpus, priority, max_retries, attempt, "
    "port_retries, user_hold, state, reason, submitted_at, started_at, ended_at"
)


def add_job(
    conn: sqlite3.Connection,
    owner: str,
    gpus: list[int],
    submitted: float,
    state: str,
    ended: float | None,
    attempts: list[tuple[float, float | None, str | None]],
    asked: int | None = None,
) -> int:
    """A job, its attempts (start, end, how the attempt ended) and their GPU leases."""
    started = attempts[-1][0] if attempts else None
    cur = conn.execute(
        f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES "
        "('j', ?, '[\"true\"]', '/', '{}', 'plain', ?, 0, 1, ?, 0, 0, ?, '', ?, ?, ?)",
        (
            owner,
            len(gpus) if asked is None else asked,
            len(attempts),
            state,
            submitted,
            started,
            ended,
        ),
    )
    job_id = cur.lastrowid
    assert job_id is not None
    for number, (start, end, how) in enumerate(attempts, 1):
        conn.execute(
            "INSERT INTO attempts (job_id, number, gpus, port, started_at, ended_at, state, "
            "reason) VALUES (?, ?, ?, NULL, ?, ?, ?, '')",
            (job_id, number, str(gpus), start, end, how),
        )
        for g in gpus:
            conn.execute(
                "INSERT INTO leases (job_id, kind, resource, acquired_at, released_at) "
                "VALUES (?, 'gpu', ?, ?, ?)",
                (job_id, g, start, end),
            )
    return job_id


def add_outside(
    conn: sqlite3.Connection, uid: int | None, account: str | None, gpu: int, a: float, b: float
) -> None:
    conn.execute(
        "INSERT INTO outside_use (uid, account, gpu, started_at, ended_at) VALUES (?, ?, ?, ?, ?)",
        (uid, account, gpu, a, b),
    )


def history(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        # alice, 2 GPUs: failed 1-3 h, retried and succeeded 4-5 h: 2 x 2 + 2 x 1 = 6 GPU-h;
        # waited 1 h for its first start.
        add_job(
            conn, "alice", [0, 1], B, "succeeded", B + 5 * H,
            [(B + H, B + 3 * H, "failed"), (B + 4 * H, B + 5 * H, "succeeded")],
        )  # fmt: skip
        # bob, 1 GPU, 2:10 to 26:10 (across midnight: 21:50 then 2:10): 24 GPU-h; waited 10 min.
        add_job(
            conn, "bob", [2], B + 2 * H, "timed_out", B + 26 * H + 600,
            [(B + 2 * H + 600, B + 26 * H + 600, "timed_out")],
        )  # fmt: skip
        # bob, 4 GPUs, cancelled while queued: no GPU time, no start.
        add_job(conn, "bob", [], B + 30 * H, "cancelled", B + 31 * H, [], asked=4)
        # alice, no GPU: cancelled after running; waited 30 s; no GPU time.
        add_job(
            conn, "alice", [], B + H, "cancelled", B + 2 * H,
            [(B + H + 30, B + 2 * H, "cancelled")],
        )  # fmt: skip
        # Outside the queue: alice's notebook 10-12 h; robert (bob's account) 23-25 h;
        # someone /proc would not name, 30-30:30 h.
        add_outside(conn, 1000, "alice", 3, B + 10 * H, B + 12 * H)
        add_outside(conn, 1002, "robert", 3, B + 23 * H, B + 25 * H)
        add_outside(conn, None, None, 2, B + 30 * H, B + 30.5 * H)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def seed(home: Path) -> None:
    history(home / "ddpq.db")
    with Database(home / "ddpq.db").write() as s:
        user_store.add_user(s, "bob", admin=False, unix_user="robert", now=0.0)


@pytest.fixture
def api(home: Path) -> Iterator[TestClient]:
    with lent_client(home, fake_gpus=4) as c:
        seed(home)
        yield c


FINAL = ("succeeded", "failed", "cancelled", "timed_out")


def jobs(**counts: int) -> dict[str, int]:
    return {state: counts.get(state, 0) for state in FINAL}


def row(key: str, kind: str, jobs_h: float, outside_h: float, **rest: Any) -> dict[str, Any]:
    return {
        "key": key,
        "kind": kind,
        "gpu_hours_jobs": pytest.approx(jobs_h, rel=1e-12),
        "gpu_hours_outside": pytest.approx(outside_h, rel=1e-12),
        "mem_reserved_gib_h": None,
        "mem_used_gib_h": None,
        "mem_used_peak_gib": None,
        "core_hours": 0.0,  # these attempts leased no CPU cores
        **rest,
    }


def test_usage_by_user_adds_up_by_hand(api: TestClient) -> None:
    r = api.get("/v1/usage", params={"since": "30d"})
    assert r.status_code == 200, r.text
    report = r.json()
    assert (report["by"], report["outside_use"]) == ("user", "count")
    assert report["rows"] == [
        row(
            "bob", "user", 24.0, 2.0,  # robert's 2 h are bob's: mapped
            jobs=jobs(timed_out=1, cancelled=1), jobs_started=1,
            wait_p50_s=600.0, wait_p90_s=600.0,
        ),
        row(
            "alice", "user", 6.0, 2.0,  # without --auth, account alice is user alice
            jobs=jobs(succeeded=1, cancelled=1), jobs_started=2,
            wait_p50_s=1815.0, wait_p90_s=pytest.approx(3243.0),  # 30 + 0.9 x 3570
        ),
        row(
            "(unknown)", "account", 0.0, 0.5,
            jobs=jobs(), jobs_started=0, wait_p50_s=None, wait_p90_s=None,
        ),
    ]  # fmt: skip
    assert report["total"] == row(
        "total", "total", 30.0, 4.5,
        jobs=jobs(succeeded=1, cancelled=2, timed_out=1), jobs_started=3,
        wait_p50_s=600.0, wait_p90_s=pytest.approx(3000.0),  # [30, 600, 3600] at 1.8
    )  # fmt: skip


def test_usage_by_day_cuts_at_utc_midnight_by_hand(api: TestClient) -> None:
    report = api.get("/v1/usage", params={"since": "30d", "by": "day"}).json()
    assert report["rows"] == [
        row(
            day(0), "day", 6.0 + 21 + 50 / 60, 2.0 + 1.0,
            jobs=jobs(succeeded=1, cancelled=1), jobs_started=3,
            wait_p50_s=600.0, wait_p90_s=pytest.approx(3000.0),
        ),
        row(
            day(1), "day", 2 + 10 / 60, 1.0 + 0.5,
            jobs=jobs(timed_out=1, cancelled=1), jobs_started=0,
            wait_p50_s=None, wait_p90_s=None,
        ),
    ]  # fmt: skip
    by_month = api.get("/v1/usage", params={"since": "30d", "by": "month"}).json()
    months = {r["key"]: r["gpu_hours_jobs"] for r in by_month["rows"]}
    assert set(months) == {day(0)[:7], day(1)[:7]}
    assert sum(months.values()) == pytest.approx(30.0)


def test_a_shorter_window_counts_only_its_part(home: Path, api: TestClient) -> None:
    # 24:00 to 30:00 (fixed times, through the store): bob's last 2:10, robert's last
    # hour, the unknown half hour's first... none (it starts at 30:00 exactly: 0 s).
    with Database(home / "ddpq.db").read() as s:
        r = usage_store.report(s, B + 24 * H, B + 30 * H, By.USER, names_are_users=True)
    ((kind, key, jobs_h, outside_h),) = [
        (x.kind, x.key, x.gpu_hours_jobs, x.gpu_hours_outside) for x in r.rows
    ]
    assert (kind, key, outside_h) == ("user", "bob", 1.0)
    assert jobs_h == pytest.approx(2 + 10 / 60)
    assert r.total.jobs[JobState.TIMED_OUT] == 1 and r.total.jobs_started == 0


def test_a_running_attempt_counts_up_to_now(home: Path, api: TestClient) -> None:
    with sqlite3.connect(home / "ddpq.db") as conn:
        add_job(conn, "carol", [5, 6, 7], B, "running", None, [(B + 100 * H, None, None)])
    with Database(home / "ddpq.db").read() as s:
        r = usage_store.report(s, B, B + 101.5 * H, By.USER, names_are_users=True)
    carol = next(x for x in r.rows if x.key == "carol")
    assert carol.gpu_hours_jobs == pytest.approx(4.5)  # 3 GPUs x 1.5 h


def test_with_auth_every_user_sees_everyones_usage_and_no_token_sees_none(home: Path) -> None:
    with lent_client(home, fake_gpus=4, auth=True) as c:
        seed(home)
        with Database(home / "ddpq.db").write() as s:
            _, token = user_store.add_user(s, "alice", admin=False, unix_user=None, now=0.0)
        assert c.get("/v1/usage").status_code == 401
        r = c.get("/v1/usage", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        keys = [(x["kind"], x["key"]) for x in r.json()["rows"]]
        # With --auth an account is a user's only when mapped: robert is bob's; account
        # alice is no one's (user alice has no account mapped).
        assert keys == [
            ("user", "bob"),
            ("user", "alice"),
            ("account", "alice"),
            ("account", "(unknown)"),
        ]


BAD_SINCE = [
    "", " ", "0", "0s", "-1d", "abc", "nan", "inf", "1e400", "3651d", "1w", "30 d", "１d",
    "30d;", "1d\x00", "x" * 33,
]  # fmt: skip
BAD_BY = ["", "User", "USER", "week", "users", "user ", "user;", "0", "day\x00"]


@pytest.mark.parametrize("since", BAD_SINCE, ids=ascii)
def test_a_since_that_is_no_duration_within_ten_years_is_refused(
    api: TestClient, since: str
) -> None:
    r = api.get("/v1/usage", params={"since": since})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "invalid" and "since" in body["detail"] and "\n" not in body["detail"]


@pytest.mark.parametrize("by", BAD_BY, ids=ascii)
def test_a_by_that_is_not_user_day_or_month_is_refused(api: TestClient, by: str) -> None:
    r = api.get("/v1/usage", params={"by": by})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid" and "by" in r.json()["detail"]


def test_the_defaults_are_thirty_days_by_user(api: TestClient) -> None:
    report = api.get("/v1/usage").json()
    since = datetime.fromisoformat(report["since"]).timestamp()
    until = datetime.fromisoformat(report["until"]).timestamp()
    assert until - since == pytest.approx(30 * 86400, abs=1)
    assert report["by"] == "user" and report["total"]["gpu_hours_jobs"] == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("settings", "counted"),
    [
        ({}, "count"),
        ({"outside_use": "show"}, "show"),
        # Jobs on Slurm: the worker samples no GPU here, so fair share counts none of it.
        ({"executor": "slurm", "outside_use": "count"}, "show"),
    ],
)
def test_the_report_says_whether_outside_use_counts_in_fair_share(
    home: Path, settings: dict[str, Any], counted: str
) -> None:
    with lent_client(home, **settings) as c:
        seed(home)
        report = c.get("/v1/usage").json()
    assert report["outside_use"] == counted
    # History already recorded is reported either way.
    assert report["total"]["gpu_hours_outside"] > 0


# ---- the GPU map and /metrics name the person --------------------------------------------


def test_the_gpu_map_names_the_user_of_an_outside_account(home: Path, api: TestClient) -> None:
    procs = (
        GpuProcess(11, 100, uid=1002, account="robert"),
        GpuProcess(12, 100, uid=4321, account=None),
        GpuProcess(13, 100),
    )
    with Database(home / "ddpq.db").write() as s:
        device_store.replace_all(s, [Gpu(0, "GPU-0", "g", 16384, 300, procs, False)], 1.0)
    (gpu,) = api.get("/v1/devices").json()["items"]
    assert gpu["status"] == "external"
    assert [(p["pid"], p["account"], p["user"]) for p in gpu["external_processes"]] == [
        (11, "robert", "bob"),
        (12, None, None),
        (13, None, None),
    ]
    assert gpu["external_processes"][1]["uid"] == 4321


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(api: TestClient) -> Samples:
    r = api.get("/metrics")
    assert r.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def outside_series(samples: Samples, name: str) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["account"], dict(labels)["user"]): v
        for (n, labels), v in samples.items()
        if n == name
    }


def test_metrics_name_outside_use_per_account_and_user(home: Path, api: TestClient) -> None:
    with Database(home / "ddpq.db").write() as s:
        procs = (GpuProcess(11, 100, uid=1002, account="robert"),)
        device_store.replace_all(s, [Gpu(3, "GPU-3", "g", 16384, 100, procs, False)], 1.0)
    m = scrape(api)
    assert outside_series(m, "ddpq_outside_gpu_seconds_total") == {
        ("alice", "alice"): 2 * H,
        ("robert", "bob"): 2 * H,
        ("(unknown)", ""): 0.5 * H,
    }
    assert outside_series(m, "ddpq_outside_gpus") == {("robert", "bob"): 1.0}


def test_metrics_bound_the_accounts_and_keep_every_series_a_counter(
    home: Path, api: TestClient
) -> None:
    before = outside_series(scrape(api), "ddpq_outside_gpu_seconds_total")
    with sqlite3.connect(home / "ddpq.db") as conn:
        for i in range(2 * MAX_ACCOUNT_SERIES):  # many more accounts, appearing later
            add_outside(conn, 5000 + i, f"u{i}", 0, B + 40 * H + i, B + 40 * H + i + 10)
    after = outside_series(scrape(api), "ddpq_outside_gpu_seconds_total")
    assert len(after) == MAX_ACCOUNT_SERIES + 1
    for key, value in before.items():  # the first ones keep their series, unchanged
        assert after[key] == value
    firsts = {(f"u{i}", f"u{i}"): 10.0 for i in range(MAX_ACCOUNT_SERIES - len(before))}
    assert {k: v for k, v in after.items() if k[0].startswith("u")} == firsts
    rest = 2 * MAX_ACCOUNT_SERIES - len(firsts)
    assert after[("(other)", "")] == 10.0 * rest
    assert sum(after.values()) == sum(before.values()) + 10.0 * 2 * MAX_ACCOUNT_SERIES


def test_many_accounts_are_looked_up_without_exceeding_sqlite(home: Path, api: TestClient) -> None:
    with sqlite3.connect(home / "ddpq.db") as conn:
        conn.executemany(
            "INSERT INTO users (name, token_hash, is_admin, unix_user, created_at) "
            "VALUES (?, ?, 0, ?, 0)",
            [(f"user{i}", f"h{i}", f"acct{i}") for i in range(1200)],
        )
    accounts = {f"acct{i}" for i in range(1200)} | {f"uid {i}" for i in range(40_000)}
    with Database(home / "ddpq.db").read() as s:
        who = usage_store.people(s, accounts, names_are_users=False)
    assert who == {f"acct{i}": f"user{i}" for i in range(1200)}
