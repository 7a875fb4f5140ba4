"""``GET /v1/history`` and ``store.history``: finished jobs newest first, filtered, paged by
a cursor; elapsed summed over attempts, the peak the highest; every page one walk down an
end-time index (the plan is read), and what a caller may not ask refused with 422."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.dialects import sqlite

from ddpq.core.states import JobState
from ddpq.store import history
from ddpq.store.db import Database
from ddpq.store.models import Attempt, Job
from tests.inprocess import lent_client

FINISHED = [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT]
T0 = 1_700_000_000.0
HEADERS = {"X-Ddpq-User": "alice"}


def add_job(
    db: Database,
    *,
    owner: str = "alice",
    name: str = "j",
    state: JobState = JobState.SUCCEEDED,
    ended_at: float | None = T0,
    runs: tuple[tuple[float, float | None, int | None], ...] = (),
) -> int:
    """A job row as the worker leaves it, with an attempt (start, end, peak) per run."""
    with db.write() as s:
        job = Job(
            name=name,
            owner=owner,
            command=["true"],
            cwd="/",
            env={},
            gpus=1,
            state=state,
            reason=f"{state.value} here",
            submitted_at=T0 - 1000,
            started_at=runs[-1][0] if runs else None,
            ended_at=ended_at,
            exit_code=0 if state is JobState.SUCCEEDED else 1,
            attempt=len(runs),
            cpus=2,
        )
        s.add(job)
        s.flush()
        for number, (start, end, peak) in enumerate(runs, 1):
            s.add(
                Attempt(
                    job_id=job.id,
                    number=number,
                    gpus=[number - 1],
                    started_at=start,
                    ended_at=end,
                    peak_ram_bytes=peak,
                    ram_bytes=1 << 30,
                    cores=[0, 1],
                )
            )
        return job.id


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with lent_client(tmp_path) as c:
        yield c


@pytest.fixture
def db(tmp_path: Path, api: TestClient) -> Database:
    return Database(tmp_path / "ddpq.db")


def page(api: TestClient, **params: Any) -> dict[str, Any]:
    r = api.get("/v1/history", params=params, headers=HEADERS)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def ids(data: dict[str, Any]) -> list[int]:
    return [row["id"] for row in data["items"]]


def test_finished_jobs_newest_first_and_unfinished_ones_never(
    api: TestClient, db: Database
) -> None:
    old = add_job(db, ended_at=T0)
    new = add_job(db, ended_at=T0 + 10, state=JobState.FAILED)
    same_end = add_job(db, ended_at=T0 + 10, state=JobState.CANCELLED)
    # A job requeued after an attempt keeps that attempt's end: still not history.
    add_job(db, ended_at=T0 + 20, state=JobState.QUEUED)
    add_job(db, ended_at=None, state=JobState.RUNNING)
    assert ids(page(api)) == [same_end, new, old]  # a tie on the end: the higher id first


def test_filters_by_owner_state_name_and_window(api: TestClient, db: Database) -> None:
    a = add_job(db, owner="alice", name="lr-0.1", ended_at=T0)
    b = add_job(db, owner="bob", name="lr-0.2", ended_at=T0 + 100, state=JobState.FAILED)
    c = add_job(db, owner="alice", name="eval", ended_at=T0 + 200, state=JobState.TIMED_OUT)
    assert ids(page(api, user="bob")) == [b]
    assert ids(page(api, mine="true")) == [c, a]  # the caller is alice
    assert ids(page(api, state=["failed", "timed_out"])) == [c, b]
    assert ids(page(api, name="lr-*")) == [b, a]
    assert ids(page(api, name="eval")) == [c]
    assert ids(page(api, name="lr-")) == []  # no glob character: the exact name
    # [since, until): the bounds in ISO 8601 (UTC without an offset) or UNIX seconds.
    assert ids(page(api, since=T0 + 100)) == [c, b]
    assert ids(page(api, since=T0 + 100, until=T0 + 200)) == [b]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(T0 + 100))
    assert ids(page(api, since=iso)) == [c, b]
    assert ids(page(api, since=iso + "+01:00")) == [c, b, a]  # an hour earlier


def test_pages_follow_each_other_without_gaps_or_repeats(api: TestClient, db: Database) -> None:
    made = [add_job(db, ended_at=T0 + (i // 3)) for i in range(25)]  # ties within pages
    seen: list[int] = []
    after = None
    while True:
        data = page(api, limit=4, **({"after": after} if after else {}))
        seen += ids(data)
        after = data["next"]
        if after is None:
            break
        assert len(data["items"]) == 4
    assert seen == sorted(made, key=lambda i: (-(T0 + (i - made[0]) // 3), -i))
    assert len(set(seen)) == 25


def test_a_full_last_page_says_nothing_follows(api: TestClient, db: Database) -> None:
    for _ in range(4):
        add_job(db)
    assert page(api, limit=4)["next"] is None
    assert page(api, limit=3)["next"] is not None


def test_elapsed_sums_the_attempts_and_the_peak_is_the_highest(
    api: TestClient, db: Database
) -> None:
    job = add_job(
        db,
        ended_at=T0 + 1000,
        # Ran 100 s, waited in the queue 500 s, ran 50 s, then 30 s with no end recorded.
        runs=((T0, T0 + 100, 5 << 20), (T0 + 600, T0 + 650, 9 << 20), (T0 + 970, None, None)),
    )
    never_ran = add_job(db, state=JobState.CANCELLED, ended_at=T0 + 2000)
    rows = {row["id"]: row for row in page(api)["items"]}
    row = rows[job]
    assert row["elapsed_s"] == pytest.approx(180.0)
    assert row["attempts"] == 3
    assert row["peak_mem"] == 9 << 20
    assert row["gpu_ids"] == [2]  # the last attempt's
    assert row["cores"] == 2 and row["mem"] == 1 << 30
    assert row["started_at"].startswith(time.strftime("%Y-%m-%dT%H:%M", time.gmtime(T0)))
    assert rows[never_ran]["elapsed_s"] == 0
    assert rows[never_ran]["started_at"] is None and rows[never_ran]["peak_mem"] is None
    assert rows[never_ran]["cores"] == 2  # as asked: it never held any


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"state": "queued"}, "not a finished state"),
        ({"state": "bogus"}, "state"),
        ({"after": "bogus"}, "after"),
        ({"after": "nan:1"}, "after"),
        ({"after": "1.5:-1"}, "after"),
        ({"after": "1.5:99999999999999999999999"}, "after"),
        ({"since": "yesterday"}, "since"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"name": "x" * 129}, "name"),
        ({"user": "u" * 65}, "user"),
    ],
)
def test_what_cannot_be_asked_is_422_with_the_reason(
    api: TestClient, params: dict[str, Any], says: str
) -> None:
    r = api.get("/v1/history", params=params, headers=HEADERS)
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]


def plan(db_path: Path, filters: history.Filters, after: history.Cursor | None = None) -> str:
    sql = history.statement(filters, 100, after).compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    with sqlite3.connect(db_path) as conn:
        return " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        (history.Filters(), "ix_jobs_ended"),
        (history.Filters(states=[JobState.FAILED]), "ix_jobs_ended"),
        (history.Filters(since=T0, until=T0 + 10, name="lr-*"), "ix_jobs_ended"),
        (history.Filters(owner="alice"), "ix_jobs_owner_ended"),
        (history.Filters(owner="alice", states=FINISHED[:2], since=T0), "ix_jobs_owner_ended"),
    ],
)
def test_every_page_walks_an_end_time_index_and_sorts_nothing(
    tmp_path: Path, db: Database, filters: history.Filters, index: str
) -> None:
    for after in (None, history.Cursor(T0, 5)):
        shown = plan(tmp_path / "ddpq.db", filters, after)
        assert f"USING INDEX {index}" in shown, shown
        assert "TEMP B-TREE" not in shown, shown  # no sort of every finished job


def vm_steps(db_path: Path, filters: history.Filters, limit: int) -> tuple[int, int]:
    """Rows a page returns and SQLite's virtual-machine instructions to make it (counted in
    hundreds by a progress handler): a cost that no other load on the machine changes."""
    sql = history.statement(filters, limit).compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    with sqlite3.connect(db_path) as conn:
        conn.set_progress_handler(count, 100)
        rows = conn.execute(str(sql)).fetchall()
    return len(rows), steps[0] * 100


def test_a_page_of_a_long_history_costs_a_page(tmp_path: Path, db: Database) -> None:
    path = tmp_path / "ddpq.db"
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO jobs (name, owner, command, cwd, env, launcher, gpus, priority,"
            " max_retries, attempt, port_retries, preemptible, preempt_signal, preemptions,"
            " nodes, relaunches, user_hold, state, reason, submitted_at, ended_at,"
            " gpu_mem_auto, oom_requeues, interactive)"
            " VALUES ('j', ?, '[]', '/', '{}', 'plain', 0, 0, 0, 0, 0, 0, 'USR1', 0, 1, 0, 0,"
            " ?, '', 0, ?, 0, 0, 0)",
            [(f"u{i % 7}", FINISHED[i % 4].value, T0 + i) for i in range(500)],
        )
    small = {f: vm_steps(path, f, 50) for f in (history.Filters(), history.Filters(owner="u3"))}
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO jobs (name, owner, command, cwd, env, launcher, gpus, priority,"
            " max_retries, attempt, port_retries, preemptible, preempt_signal, preemptions,"
            " nodes, relaunches, user_hold, state, reason, submitted_at, ended_at,"
            " gpu_mem_auto, oom_requeues, interactive)"
            " VALUES ('j', ?, '[]', '/', '{}', 'plain', 0, 0, 0, 0, 0, 0, 'USR1', 0, 1, 0, 0,"
            " ?, '', 0, ?, 0, 0, 0)",
            [(f"u{i % 7}", FINISHED[i % 4].value, T0 - 1 - i) for i in range(15_000)],
        )
    for f, (rows, steps) in small.items():
        big_rows, big_steps = vm_steps(path, f, 50)
        # 30 times the history, the same page: the same work, give or take the B-tree's depth.
        assert rows == big_rows == 50
        assert big_steps < 2 * steps + 2_000, (f, steps, big_steps)


def test_the_index_migration_keeps_the_jobs_both_ways(tmp_path: Path) -> None:
    from alembic import command

    from ddpq.store.db import alembic_config

    path = tmp_path / "migrating.db"
    command.upgrade(alembic_config(path), "0022t")
    row = (
        "INSERT INTO jobs (name, owner, command, cwd, env, launcher, gpus, priority,"
        " max_retries, attempt, port_retries, user_hold, state, reason, submitted_at, ended_at)"
        " VALUES ('j', 'alice', '[]', '/', '{}', 'plain', 0, 0, 0, 1, 0, 0, 'failed', '', 1, 2)"
    )
    with sqlite3.connect(path) as conn:
        conn.execute(row)

    def indexes() -> set[str]:
        with sqlite3.connect(path) as conn:
            found = {r[1] for r in conn.execute("PRAGMA index_list(jobs)")}
            assert conn.execute("SELECT state, ended_at FROM jobs").fetchall() == [("failed", 2.0)]
        return found

    assert not {"ix_jobs_ended", "ix_jobs_owner_ended"} & indexes()
    command.upgrade(alembic_config(path), "0023h")
    assert {"ix_jobs_ended", "ix_jobs_owner_ended"} <= indexes()
    command.downgrade(alembic_config(path), "0022t")
    assert not {"ix_jobs_ended", "ix_jobs_owner_ended"} & indexes()


def test_with_auth_the_history_needs_a_caller(tmp_path: Path) -> None:
    with lent_client(tmp_path / "authed", auth=True) as c:
        r = c.get("/v1/history")
        assert r.status_code == 401, r.text
        doc = c.get("/openapi.json").json()
    schema = doc["paths"]["/v1/history"]["get"]["responses"]["200"]["content"]
    assert schema["application/json"]["schema"] == {"$ref": "#/components/schemas/HistoryPage"}
