"""The store's side of sharing GPUs by memory, limits and reservations: the lease table's own
guards (whatever the Python above does), migration 0012m both ways on rows, peaks, limits."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.exc import IntegrityError

from ddpq.core.limits import EVERYONE, Limit
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs as job_store
from ddpq.store import leases
from ddpq.store import limits as limit_store
from ddpq.store import memory as memory_store
from ddpq.store.db import Database, alembic_config, migrate
from ddpq.store.models import Attempt
from tests.template_db import migrated
from tests.test_migrations import _insert_job

G = 1 << 30
TRIGGERS = {
    "tr_leases_whole_gpu_alone",
    "tr_leases_share_not_on_whole",
    "tr_leases_share_fits",
    "tr_leases_only_released",
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    path = tmp_path / "ddpq.db"
    migrated(path)
    with sqlite3.connect(path) as conn:
        for gpu in range(2):  # two GPUs of 16 GiB, as the worker publishes them
            conn.execute(
                'INSERT INTO devices ("index", uuid, name, fake, memory_total_mb, '
                "memory_used_mb, external, external_processes, updated_at) "
                "VALUES (?, 'u', 'g', 1, 16384, 0, 0, '[]', 1.0)",
                (gpu,),
            )
    d = Database(path)
    yield d
    d.dispose()


def jobs(db: Database, n: int) -> list[int]:
    with db.write() as s:
        spec = JobSpec(name="j", owner="alice", command=["true"], cwd="/", gpus=1)
        return [job_store.create_job(s, spec, 1.0).id for _ in range(n)]


def lease(db: Database, job: int, gpu: int, mem: int | None = None, cap: int | None = None) -> None:
    with db.write() as s:
        leases.acquire_many(s, [leases.Wanted(job, [gpu], None, mem, cap)], 1.0)


def refused(
    db: Database, job: int, gpu: int, mem: int | None = None, cap: int | None = None
) -> str:
    with pytest.raises(IntegrityError) as caught:
        lease(db, job, gpu, mem, cap)
    return str(caught.value.orig)


def test_a_gpu_is_held_whole_or_shared_never_both(db: Database) -> None:
    a, b, c, d = jobs(db, 4)
    lease(db, a, 0)
    assert "holds whole" in refused(db, b, 0, 5 * G)
    assert "UNIQUE" in refused(db, b, 0)  # whole and whole: the unique index, as before
    lease(db, b, 1, 5 * G)
    lease(db, c, 1, 5 * G)
    assert "jobs share" in refused(db, d, 1)
    assert "UNIQUE" in refused(db, b, 1, 1 * G)  # one job, one share of a GPU
    with db.read() as s:
        live = leases.live(s)
        assert leases.by_job(live) == {a: ([0], None), b: ([1], None), c: ([1], None)}
        assert leases.shares(live) == {b: (5 * G, None), c: (5 * G, None)}
    with db.write() as s:
        leases.release(s, b, 2.0)
        leases.release(s, c, 2.0)
    lease(db, d, 1)  # shared no more: it may be held whole


def test_shares_never_pass_the_gpus_memory_nor_a_share_cap(db: Database) -> None:
    a, b, c, d, e = jobs(db, 5)
    lease(db, a, 0, 10 * G)
    assert "memory or a share cap" in refused(db, b, 0, 7 * G)  # 17 GiB on 16
    lease(db, b, 0, 6 * G)  # exactly 16
    lease(db, c, 1, 1 * G, cap=2)
    lease(db, d, 1, 1 * G)
    assert "share cap" in refused(db, e, 1, 1 * G)  # a third on a GPU capped at 2
    with db.write() as s:
        leases.release(s, d, 2.0)
    assert "share cap" in refused(db, e, 1, 1 * G, cap=1)  # its own cap of 1: alone only
    lease(db, e, 1, 1 * G, cap=2)


def test_a_lease_never_changes_but_to_be_released(db: Database) -> None:
    (a,) = jobs(db, 1)
    lease(db, a, 0, 2 * G)
    conn = sqlite3.connect(db.path)
    for change in (
        "SET mem_bytes = 20000000000",
        "SET kind = 'gpu', mem_bytes = NULL",
        "SET resource = 1",
        "SET share_cap = 1",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="never changes"):
            conn.execute(f"UPDATE leases {change} WHERE job_id = {a}")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        conn.execute(
            f"INSERT INTO leases (job_id, kind, resource, acquired_at, mem_bytes) "
            f"VALUES ({a}, 'gpu', 1, 1.0, 100)"
        )
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        conn.execute(
            f"INSERT INTO leases (job_id, kind, resource, acquired_at) VALUES ({a}, 'gpus', 1, 1.0)"
        )
    conn.execute(f"UPDATE leases SET released_at = 5.0 WHERE job_id = {a}")
    with pytest.raises(sqlite3.IntegrityError, match="never changes"):
        conn.execute(f"UPDATE leases SET released_at = NULL WHERE job_id = {a}")
    conn.commit()
    conn.close()


def test_head_has_the_lease_triggers(db: Database) -> None:
    with sqlite3.connect(db.path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    assert names >= TRIGGERS


def test_migration_0012m_both_ways_on_rows(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    command.upgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        old = _insert_job(conn, "succeeded")
        conn.execute(
            "INSERT INTO leases (job_id, kind, resource, acquired_at, released_at) "
            "VALUES (?, 'gpu', 0, 1.0, 2.0), (?, 'gpu', 1, 1.0, NULL)",
            (old, old),
        )
    command.upgrade(alembic_config(path), "0012m")
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT gpu_mem_bytes, gpu_mem_auto, gpu_share, oom_requeues, mem_key FROM jobs"
        ).fetchone()
        assert row == (None, 0, None, 0, None)
        # What 0009c added to jobs is kept across the copy.
        assert conn.execute("SELECT nodes, partition FROM jobs").fetchone() == (1, None)
        assert conn.execute("SELECT gpu_mem_bytes, peak_mem_bytes FROM attempts").fetchall() == [
            (None, None)
        ]
        assert conn.execute("SELECT kind, resource, released_at FROM leases").fetchall() == [
            ("gpu", 0, 2.0),
            ("gpu", 1, None),
        ]
        assert (
            "CHECK" in conn.execute("SELECT sql FROM sqlite_master WHERE name='jobs'").fetchone()[0]
        )
        sharer = _insert_job(conn, "running")
        conn.execute(
            "INSERT INTO leases (job_id, kind, resource, acquired_at, mem_bytes) "
            "VALUES (?, 'gpu_share', 2, 3.0, 1000)",
            (sharer,),
        )
        with pytest.raises(sqlite3.IntegrityError, match="holds whole"):
            conn.execute(
                "INSERT INTO leases (job_id, kind, resource, acquired_at, mem_bytes) "
                "VALUES (?, 'gpu_share', 1, 3.0, 1000)",
                (sharer,),
            )
    with pytest.raises(RuntimeError, match="stop the jobs that share GPUs"):
        command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE leases SET released_at = 4.0 WHERE kind = 'gpu_share'")
    command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        # The ended share is a whole-GPU lease in the history the older schema reads.
        assert conn.execute("SELECT kind, resource FROM leases ORDER BY id").fetchall() == [
            ("gpu", 0),
            ("gpu", 1),
            ("gpu", 2),
        ]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert not {"user_limits", "reservations", *TRIGGERS} & tables
        index = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'uq_leases_live_resource'"
        ).fetchone()[0]
        assert index.endswith("WHERE released_at IS NULL")
        jobs_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='jobs'").fetchone()[0]
        assert "CHECK" in jobs_sql and "nodes" in jobs_sql and "gpu_mem_bytes" not in jobs_sql
    migrate(path)  # and up again


def test_peaks_rise_only_on_the_running_attempt_and_listings_read_the_latest(
    db: Database,
) -> None:
    a, b = jobs(db, 2)
    with db.write() as s:
        for job, state in ((a, JobState.RUNNING), (b, JobState.SUCCEEDED)):
            job_store.get_job(s, job).attempt = 1
            s.add(Attempt(job_id=job, number=1, gpus=[0], port=None, started_at=1.0))
            if state is JobState.SUCCEEDED:
                s.flush()
                s.query(Attempt).filter_by(job_id=job).update({"ended_at": 2.0})
    with db.write() as s:
        memory_store.record_peaks(s, {a: 3 * G, b: 9 * G})
    with db.write() as s:
        memory_store.record_peaks(s, {a: 2 * G})  # lower: kept at 3 GiB
    with db.read() as s:
        assert memory_store.latest_peaks(s, [a, b]) == {a: 3 * G}  # b had ended


def test_auto_learns_from_the_last_success_and_what_followed(db: Database) -> None:
    def ran(
        name: str, state: JobState, peak: int | None, ended: float, owner: str = "alice"
    ) -> None:
        with db.write() as s:
            spec = JobSpec(
                name=name, owner=owner, command=["x"], cwd="/", gpus=1, mem_key=f"name:{name}"
            )
            job = job_store.create_job(s, spec, 1.0)
            s.add(
                Attempt(
                    job_id=job.id,
                    number=1,
                    gpus=[0],
                    port=None,
                    started_at=1.0,
                    ended_at=ended,
                    state=state,
                    peak_mem_bytes=peak,
                )
            )

    ran("train", JobState.SUCCEEDED, 4 * G, 10.0)
    ran("train", JobState.FAILED, 6 * G, 11.0)  # since the last success: counts
    ran("train", JobState.SUCCEEDED, 3 * G, 5.0)  # before it: does not
    ran("train", JobState.SUCCEEDED, 20 * G, 12.0, owner="bob")  # another owner's
    ran("new", JobState.FAILED, 2 * G, 3.0)  # never succeeded
    with db.write() as s:
        waiting = []
        for name in ("train", "new", "other"):
            spec = JobSpec(
                name=name,
                owner="alice",
                command=["x"],
                cwd="/",
                gpus=1,
                gpu_mem_auto=True,
                mem_key=memory_store.mem_key(name, ["x"]),
            )
            waiting.append(job_store.create_job(s, spec, 20.0).id)
        assert sorted(job_store.auto_memory_jobs(s)) == sorted(waiting)
        measured = memory_store.measured_for(s, waiting)
    assert measured == {waiting[0]: [6 * G, 4 * G], waiting[1]: None, waiting[2]: None}
    assert memory_store.mem_key(None, ["python", "a.py"]) != memory_store.mem_key(
        None, ["python", "b.py"]
    )
    assert memory_store.mem_key("exp", ["python", "a.py"]) == "name:exp"


def test_limits_and_reservations(db: Database) -> None:
    with db.write() as s:
        assert limit_store.set_limit(s, "alice", {"gpus": 4, "jobs": 10}, 1.0) == Limit(4, 10)
        assert limit_store.set_limit(s, "alice", {"jobs": None}, 1.0) == Limit(4, None)
        assert limit_store.set_limit(s, EVERYONE, {"jobs": 2}, 1.0) == Limit(None, 2)
        assert limit_store.set_limit(s, "bob", {"gpus": None}, 1.0) is None
        with pytest.raises(ValueError, match="0 or more"):
            limit_store.set_limit(s, "bob", {"gpus": -1}, 1.0)
    with db.read() as s:
        limits = limit_store.limits(s)
    assert limits.of("alice") == Limit(4, 2) and limits.of("carol") == Limit(None, 2)
    with db.write() as s:
        assert limit_store.clear_limit(s, "alice") and not limit_store.clear_limit(s, "alice")
        r = limit_store.add_reservation(
            s, "alice", 2, 100.0, 200.0, by="root", now=50.0, total_gpus=2
        ).reservation
        with pytest.raises(limit_store.ReservationRefused, match="keep 3 GPUs at once"):
            limit_store.add_reservation(
                s, "bob", 1, 150.0, 250.0, by="root", now=50.0, total_gpus=2
            )
        limit_store.add_reservation(s, "bob", 2, 200.0, 250.0, by="root", now=50.0, total_gpus=2)
        for start, end, why in (
            (10.0, 5.0, "ends before"),
            (10.0, 20.0, "over already"),
            (100.0, 1e300, "between the years 1 and 9999"),
            (-1e300, 200.0, "between the years 1 and 9999"),
        ):
            with pytest.raises(limit_store.ReservationRefused, match=why):
                limit_store.add_reservation(
                    s, "bob", 1, start, end, by="root", now=50.0, total_gpus=2
                )
    with db.read() as s:
        assert [x.user for x in limit_store.open_reservations(s, 150.0)] == ["alice", "bob"]
        assert [x.user for x in limit_store.open_reservations(s, 210.0)] == ["bob"]
    with db.write() as s:
        assert limit_store.delete_reservation(s, r.id) == r
        with pytest.raises(LookupError):
            limit_store.delete_reservation(s, r.id)
