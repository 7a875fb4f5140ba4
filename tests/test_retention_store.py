"""Retention on a real store, in process: the janitor's pass (what it removes, the rows it
deletes, the counters it keeps), its thread, its metrics, and migration 0005r both ways."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from alembic import command
from prometheus_client.parser import text_string_to_metric_families

from ddpq.config import Settings
from ddpq.core.states import JobState
from ddpq.daemon.janitor import Janitor
from ddpq.executors.base import LOST
from ddpq.server.metrics import render
from ddpq.store import retention as store
from ddpq.store import stats
from ddpq.store.db import Database, alembic_config, migrate
from tests.helpers import wait_for
from tests.template_db import migrated

NOW = 1_000_000_000.0
DAY = 86400.0


def add_job(db: Path, state: JobState, ended_ago: float | None = None, gpus: str = "[]") -> int:
    """A job row as the daemon leaves one, with an attempt if it ever ran."""
    ended = None if ended_ago is None else NOW - ended_ago
    with sqlite3.connect(db) as conn:
        cur = conn.execute(
            "INSERT INTO jobs (name, owner, command, cwd, env, launcher, gpus, priority, "
            "max_retries, attempt, port_retries, relaunches, user_hold, state, reason, "
            "submitted_at, started_at, ended_at) VALUES ('j', 'alice', '[\"true\"]', '/', "
            "'{}', 'plain', 0, 0, 0, 1, 0, 0, 0, ?, '', ?, ?, ?)",
            (state.value, NOW - 100 * DAY, NOW - 100 * DAY, ended),
        )
        job_id = cur.lastrowid
        assert job_id is not None
        conn.execute(
            "INSERT INTO attempts (job_id, number, gpus, started_at, ended_at, reason) "
            "VALUES (?, 1, ?, ?, ?, '')",
            (job_id, gpus, NOW - 100 * DAY, ended),
        )
        conn.execute(
            "INSERT INTO job_events (job_id, at, to_state, reason) VALUES (?, ?, ?, '')",
            (job_id, NOW - 100 * DAY, state.value),
        )
    return job_id


def fill(settings: Settings, job_id: int, checkpoint: int, log: int = 1000) -> Path:
    folder = settings.jobs_dir / str(job_id)
    (folder / "ckpt").mkdir(parents=True)
    (folder / "ckpt" / "last.pt").write_bytes(b"c" * checkpoint)
    (folder / "output.log").write_bytes(b"l" * log)
    return folder


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = Settings(home=tmp_path / "home", keep_finished_s=30 * DAY, prune_rows=True)
    s.jobs_dir.mkdir(parents=True)
    migrated(s.db_path)
    return s


def janitor(settings: Settings, **changes: object) -> Janitor:
    return Janitor(settings.model_copy(update=changes), clock=lambda: NOW)


def job_ids(settings: Settings) -> set[int]:
    with sqlite3.connect(settings.db_path) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM jobs")}


def test_a_pass_removes_old_finished_jobs_and_their_rows_but_nothing_alive(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    old = add_job(settings.db_path, JobState.SUCCEEDED, ended_ago=40 * DAY)
    old_gone = add_job(settings.db_path, JobState.FAILED, ended_ago=50 * DAY)  # no folder left
    young = add_job(settings.db_path, JobState.CANCELLED, ended_ago=DAY)
    running = add_job(settings.db_path, JobState.RUNNING)
    queued = add_job(settings.db_path, JobState.QUEUED)
    held = add_job(settings.db_path, JobState.HELD)
    newest = add_job(settings.db_path, JobState.TIMED_OUT, ended_ago=60 * DAY)
    for job_id in (old, young, running, queued, held, newest):
        fill(settings, job_id, 40_000)

    j = janitor(settings)
    dry = j.prune(dry_run=True)
    assert {r.job_id for r in dry.plan.removals} == {old, old_gone, newest}
    assert (settings.jobs_dir / str(old)).exists() and job_ids(settings) >= {old, old_gone}

    with caplog.at_level(logging.INFO, logger="ddpq.janitor"):
        report = j.step()
    assert report is not None and not report.dry_run
    left = sorted(p.name for p in settings.jobs_dir.iterdir())
    assert left == sorted(str(i) for i in (young, running, queued, held))
    # The newest row stays (SQLite would hand its id out again); its folder went.
    assert job_ids(settings) == {young, running, queued, held, newest}
    assert report.rows == 2 and report.logs[0] == 2 and report.checkpoints[0] == 2
    assert report.checkpoints[1] >= 80_000
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ddpq.janitor"]
    assert line.startswith("retention: removed checkpoints of 2 jobs") and "2 job rows" in line

    db = Database(settings.db_path)
    with db.read() as s:
        totals = store.removed_totals(s)
        assert totals[store.ROWS] == (2, 0)
        assert totals[store.LOGS][0] == 2 and totals[store.CHECKPOINTS][0] == 2
        last = store.last_pass(s)
        assert last is not None and last[0] == NOW and last[1] == report.folder_bytes
    db.dispose()
    # A second pass finds nothing more, and says nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ddpq.janitor"):
        again = j.step()
    assert again is not None and not again.removed_anything
    assert not [r for r in caplog.records if r.name == "ddpq.janitor"]
    j.db.dispose()


def test_the_budget_takes_checkpoints_oldest_first_and_never_a_running_jobs(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    older = add_job(settings.db_path, JobState.SUCCEEDED, ended_ago=3 * DAY)
    newer = add_job(settings.db_path, JobState.SUCCEEDED, ended_ago=2 * DAY)
    running = add_job(settings.db_path, JobState.RUNNING)
    for job_id in (older, newer):
        fill(settings, job_id, 200_000)
    fill(settings, running, 300_000)
    # Room for the running job and one finished job's checkpoints, not two.
    j = janitor(settings, keep_finished_s=None, jobs_budget_bytes=620_000)
    report = j.prune()
    assert [(r.job_id, r.what.value) for r in report.plan.removals] == [(older, "checkpoints")]
    assert not (settings.jobs_dir / str(older) / "ckpt").exists()
    assert (settings.jobs_dir / str(older) / "output.log").exists()
    assert (settings.jobs_dir / str(newer) / "ckpt" / "last.pt").exists()
    assert report.folder_bytes <= 620_000 and not report.plan.over_budget

    # A budget the running job alone breaks: every finished folder goes, the running one
    # stays, and a warning says why the budget is not met (once, not every pass).
    tight = janitor(settings, keep_finished_s=None, jobs_budget_bytes=1024)
    with caplog.at_level(logging.INFO, logger="ddpq.janitor"):
        tight.step()
        tight.step()
    assert sorted(p.name for p in settings.jobs_dir.iterdir()) == [str(running)]
    assert (settings.jobs_dir / str(running) / "ckpt" / "last.pt").stat().st_size == 300_000
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "jobs that have not finished" in warnings[0].getMessage()
    j.db.dispose()
    tight.db.dispose()


def test_the_janitor_thread_looks_again_every_period_and_stops(settings: Settings) -> None:
    j = Janitor(settings.model_copy(update={"prune_every_s": 0.05}), clock=lambda: NOW)
    thread = threading.Thread(target=j.run)
    thread.start()
    try:
        late = add_job(settings.db_path, JobState.SUCCEEDED, ended_ago=40 * DAY)
        add_job(settings.db_path, JobState.QUEUED)  # the newest, so that late's row may go
        folder = fill(settings, late, 1000)
        wait_for(lambda: not folder.exists() and late not in job_ids(settings), 10, "a pass")
    finally:
        j.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_metrics_report_the_counters_and_gpus_held_by_lost_jobs(settings: Settings) -> None:
    lost = add_job(settings.db_path, JobState.FAILED, ended_ago=DAY, gpus="[1, 2]")
    add_job(settings.db_path, JobState.SUCCEEDED, ended_ago=DAY, gpus="[2]")  # later, on 2
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("UPDATE attempts SET reason = ? WHERE job_id = ?", (LOST, lost))
        for index, external in ((0, 1), (1, 1), (2, 1), (3, 0)):
            conn.execute(
                'INSERT INTO devices ("index", uuid, name, fake, memory_total_mb, '
                "memory_used_mb, external, external_processes, updated_at) "
                "VALUES (?, 'GPU-x', 'fake', 1, 100, 50, ?, '[]', 0)",
                (index, external),
            )
    db = Database(settings.db_path)
    with db.write() as s:
        # GPU 1: outside use after a lost job. GPU 2 was used by a later job that ended
        # well; GPU 0 by no job at all: ordinary outside use, both.
        assert stats.gpus_held_by_lost_jobs(s) == 1
        store.add_removed(s, {store.CHECKPOINTS: (3, 3000), store.LOGS: (1, 10)})
        store.add_removed(s, {store.CHECKPOINTS: (1, 1000), store.ROWS: (2, 0)})
        store.record_pass(s, NOW, 12345)
    with db.read() as s:
        text = render(s, NOW)[0].decode()
    db.dispose()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("ddpq_gpus_held_by_lost_jobs", ())] == 1
    removed = "ddpq_retention_removed_jobs_total"
    assert samples[(removed, (("what", "checkpoints"),))] == 4
    assert samples[(removed, (("what", "logs"),))] == 1
    assert samples[(removed, (("what", "rows"),))] == 2
    assert samples[("ddpq_retention_removed_bytes_total", (("what", "checkpoints"),))] == 4000
    assert ("ddpq_retention_removed_bytes_total", (("what", "rows"),)) not in samples
    assert samples[("ddpq_job_folders_bytes", ())] == 12345
    assert samples[("ddpq_retention_last_pass_timestamp_seconds", ())] == NOW


def test_a_lost_attempts_reason_is_what_the_metric_looks_for() -> None:
    assert LOST.startswith(stats.LOST_PREFIX)


def test_migration_0005r_both_ways_on_a_database_with_rows(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    command.upgrade(alembic_config(path), "0004")
    job = add_job(path, JobState.SUCCEEDED, ended_ago=DAY)
    command.upgrade(alembic_config(path), "0005r")
    db = Database(path)
    with db.write() as s:
        store.add_removed(s, {store.LOGS: (1, 100)})
        store.record_pass(s, NOW, 5)
    db.dispose()
    command.downgrade(alembic_config(path), "0004")
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert not tables & {"retention_totals", "retention_pass"}
        assert conn.execute("SELECT id, state FROM jobs").fetchall() == [(job, "succeeded")]
    migrate(path)  # and up again, empty
    db = Database(path)
    with db.read() as s:
        assert store.removed_totals(s) == dict.fromkeys(store.KINDS, (0, 0))
        assert store.last_pass(s) is None
    db.dispose()
