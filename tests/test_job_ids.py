"""Job ids are never handed out twice, also after a backup is restored the documented way
(docs/admin.md), and a job's folder is new to it (issue 21, item 3)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

from alembic import command

from ddpq.config import Settings
from ddpq.daemon.job_ids import MARK_FILE, keep_job_ids_unique
from ddpq.jobdir import STALE
from ddpq.schemas import JobSubmit
from ddpq.store.db import alembic_config, migrate
from tests.helpers import Daemon, wait_done
from tests.template_db import migrated
from tests.test_backup import admin
from tests.test_migrations import _insert_job


def _new_id(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        return _insert_job(conn, "queued")


def test_ids_start_above_every_folder_and_the_written_mark(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    migrated(settings.db_path)
    assert _new_id(settings.db_path) == 1
    (settings.jobs_dir / "40").mkdir(parents=True)
    (settings.jobs_dir / STALE / "55-20261202T050000-abcdef").mkdir(parents=True)
    (settings.jobs_dir / "not-a-job-9999").mkdir()
    assert keep_job_ids_unique(settings) == 55
    assert _new_id(settings.db_path) == 56
    (settings.home / MARK_FILE).write_text("70\n")  # as a daemon stopped before wrote it
    assert keep_job_ids_unique(settings) == 70
    assert _new_id(settings.db_path) == 71
    assert (settings.home / MARK_FILE).read_text() == "70\n"
    assert keep_job_ids_unique(settings) == 71  # at the next start or stop
    assert (settings.home / MARK_FILE).read_text() == "71\n"


def test_the_newest_jobs_id_is_not_reused_once_its_row_is_deleted(tmp_path: Path) -> None:
    db = tmp_path / "ddpq.db"
    command.upgrade(alembic_config(db), "0010n")
    first = _new_id(db)
    newest = _new_id(db)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM jobs WHERE id = ?", (newest,))
    migrate(db)  # AUTOINCREMENT from here on; the rows and their ids kept
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM jobs")] == [first]
        assert (
            "AUTOINCREMENT"
            in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
        )
    third = _new_id(db)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM jobs WHERE id = ?", (third,))
    assert _new_id(db) == third + 1  # never the deleted newest job's id again
    command.downgrade(alembic_config(db), "0010n")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert (
            "AUTOINCREMENT"
            not in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
        )
        assert (
            "CHECK"
            in conn.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
        )
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (2,)


def _restore(home: Path, copy: Path) -> None:
    """docs/admin.md's restore: the database and its side files aside, the copy in place."""
    aside = home / "before-restore"
    aside.mkdir()
    for name in ("ddpq.db", "ddpq.db-wal", "ddpq.db-shm"):
        if (home / name).exists():
            shutil.move(home / name, aside / name)
    shutil.copyfile(copy, home / "ddpq.db")
    os.chmod(home / "ddpq.db", 0o600)


def test_a_restored_backup_hands_out_new_ids_and_new_folders(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "1", "--grace", "1s")
    with d.client() as c:
        kept = c.submit(JobSubmit(command=["sh", "-c", "echo before-the-backup"]))
        wait_done(c, kept.id)
        copy = tmp_path / "copy.db"
        assert admin("backup", str(copy), "--home", str(d.home)).returncode == 0
        later = [c.submit(JobSubmit(command=["sh", "-c", "echo after-the-backup"])) for _ in "ab"]
        for job in later:
            wait_done(c, job.id)
    d.stop()
    # Retention removed the newest folder meanwhile: only the mark the daemon wrote as it
    # stopped still knows its id.
    shutil.rmtree(d.home / "jobs" / str(later[-1].id))
    _restore(d.home, copy)
    r = make_daemon("--fake-gpus", "1", "--grace", "1s", home=d.home)
    with r.client() as c:
        assert [j.id for j in c.list_all()] == [kept.id]
        new = c.submit(JobSubmit(command=["sh", "-c", "echo the-new-job"]))
        assert new.id == later[-1].id + 1
        wait_done(c, new.id)
        log = c.log_tail(new.id).decode()
    assert "the-new-job" in log and "after-the-backup" not in log
    # Its folder holds its own records alone.
    assert set(os.listdir(d.home / "jobs" / str(new.id))) <= {"exit.json", "output.log"}
    # The earlier user's folder is as it was.
    earlier = (d.home / "jobs" / str(later[0].id) / "output.log").read_text()
    assert "after-the-backup" in earlier
    assert stat.S_IMODE(os.stat(d.home / "jobs").st_mode) == 0o711
