"""The store on a real SQLite file: transitions, leases, dependencies, durability rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from ddpq.core.spec import JobSpec
from ddpq.core.states import InvalidTransition, JobState
from ddpq.store import jobs, leases, settling, transitions
from ddpq.store.db import Database
from tests.template_db import migrated

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def db(tmp_path: Path) -> Database:
    migrated(tmp_path / "ddpq.db")
    return Database(tmp_path / "ddpq.db")


def new(db: Database, **kw: object) -> int:
    spec = JobSpec(name="j", owner="alice", command=["true"], cwd="/", gpus=1, **kw)  # type: ignore[arg-type]
    with db.write() as s:
        return jobs.create_job(s, spec, 100.0).id


def test_sqlite_is_wal_with_foreign_keys(db: Database) -> None:
    with db.read() as s:
        assert s.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert s.connection().exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_a_gpu_or_port_cannot_be_leased_twice(db: Database) -> None:
    a, b = new(db), new(db)
    with db.write() as s:
        leases.acquire(s, a, [0, 1], 29600, 1.0)
    with pytest.raises(IntegrityError), db.write() as s:
        leases.acquire(s, b, [1], 29601, 2.0)
    with pytest.raises(IntegrityError), db.write() as s:
        leases.acquire(s, b, [2], 29600, 2.0)
    with db.write() as s:  # once released, the same GPU and port can be leased again
        leases.release(s, a, 3.0)
        leases.acquire(s, b, [1], 29600, 3.0)
    with db.read() as s:
        assert leases.by_job(leases.live(s)) == {b: ([1], 29600)}


def test_every_transition_is_recorded_and_checked(db: Database) -> None:
    job_id = new(db)
    with db.write() as s:
        job = jobs.get_job(s, job_id)
        transitions.move_job(s, job, JobState.STARTING, "leased", 101.0)
        transitions.move_job(s, job, JobState.RUNNING, "started", 102.0)
        settling.finish(s, job, JobState.SUCCEEDED, "exit code 0", 103.0)
    with pytest.raises(InvalidTransition), db.write() as s:
        transitions.move_job(s, jobs.get_job(s, job_id), JobState.RUNNING, "again", 104.0)
    with db.read() as s:
        events = [(e.to_state, e.at) for e in jobs.events_of(s, job_id)]
    assert events == [
        ("queued", 100.0),
        ("starting", 101.0),
        ("running", 102.0),
        ("succeeded", 103.0),
    ]


def test_dependencies_hold_release_and_cascade(db: Database) -> None:
    first = new(db)
    second = new(db, after=(first,))
    third = new(db, after=(second,))
    with db.read() as s:
        assert jobs.get_job(s, second).state == "held"
        assert "waiting for job" in jobs.get_job(s, second).reason
    with db.write() as s:  # first fails: second and then third are cancelled, with reasons
        job = jobs.get_job(s, first)
        transitions.move_job(s, job, JobState.STARTING, "", 101.0)
        transitions.move_job(s, job, JobState.RUNNING, "", 101.0)
        settling.finish(s, job, JobState.FAILED, "exit code 1", 102.0)
    with db.read() as s:
        assert (jobs.get_job(s, second).state, jobs.get_job(s, second).reason) == (
            "cancelled",
            f"dependency {first} failed",
        )
        assert jobs.get_job(s, third).reason == f"dependency {second} cancelled"


def test_succeeded_dependency_releases_and_user_hold_wins(db: Database) -> None:
    first = new(db)
    second = new(db, after=(first,), hold=True)
    with db.write() as s:
        job = jobs.get_job(s, first)
        transitions.move_job(s, job, JobState.STARTING, "", 101.0)
        transitions.move_job(s, job, JobState.RUNNING, "", 101.0)
        settling.finish(s, job, JobState.SUCCEEDED, "exit code 0", 102.0)
    with db.read() as s:
        assert jobs.get_job(s, second).state == "held"
        assert jobs.get_job(s, second).reason == "held by user"
    with db.write() as s:
        jobs.set_hold(s, jobs.get_job(s, second), False, 103.0)
    with db.read() as s:
        assert jobs.get_job(s, second).state == "queued"


def test_unknown_dependency_is_refused(db: Database) -> None:
    with pytest.raises(jobs.UnknownJob):
        new(db, after=(999,))


def test_migrations_upgrade_head_and_check_on_a_fresh_file(tmp_path: Path) -> None:
    env = {**os.environ, "DDPQ_DB": str(tmp_path / "fresh.db")}
    alembic = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini")]
    up = subprocess.run(
        [*alembic, "upgrade", "head"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr
    check = subprocess.run([*alembic, "check"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    assert "No new upgrade operations detected" in check.stdout + check.stderr


def test_concurrent_migrations_on_a_fresh_file(tmp_path: Path) -> None:
    """`ddpq server` and `ddpq worker` started together both migrate the same new file."""
    code = (
        "import sys; from pathlib import Path; from ddpq.store.db import migrate; "
        "migrate(Path(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "ddpq.db")],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
