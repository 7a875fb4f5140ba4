"""A durable write is on the disk before it returns, and is synced after the write lock is
free (store.db.sync_log): the worker's writes do not wait behind the API's fsync."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from ddpq.store import db as db_module
from ddpq.store.db import Database
from tests.test_write_gate import DEADLINE_S, path  # noqa: F401 (path: a database, one table)

Opener = Callable[..., Database]


@pytest.fixture
def opened(path: Path) -> Iterator[Opener]:  # noqa: F811
    """Databases on ``path`` (durable, as the API's, unless told), closed after the test."""
    made: list[Database] = []

    def open_one(durable: bool = True) -> Database:
        made.append(Database(path, durable=durable))
        return made[-1]

    yield open_one
    for db in made:
        db.dispose()


def synced_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file fdatasync'ed from now on, by the path its descriptor names."""
    synced: list[str] = []
    real = os.fdatasync

    def noting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", noting)
    return synced


def count(db: Database) -> int:
    with db.read() as s:
        return int(s.execute(text("SELECT count(*) FROM t")).scalar_one())


def failing_sync(_fd: int) -> None:
    raise OSError(5, "Input/output error")


@pytest.mark.parametrize("durable", [True, False])
def test_every_connection_commits_without_a_sync_under_the_lock(
    opened: Opener, durable: bool
) -> None:
    db = opened(durable=durable)
    with db.write() as s:
        assert s.execute(text("PRAGMA synchronous")).scalar_one() == 1  # NORMAL
    with db.read() as s:
        assert s.execute(text("PRAGMA synchronous")).scalar_one() == 1


def test_a_durable_write_syncs_the_log_before_it_returns(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = synced_files(monkeypatch)
    db = opened()
    with db.write() as s:
        s.execute(text("INSERT INTO t VALUES (1)"))
        assert synced == []  # not while the lock is held
    assert synced == [f"{db.path}-wal"]


def test_the_workers_writes_and_a_rolled_back_write_sync_nothing(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = synced_files(monkeypatch)
    worker, api = opened(durable=False), opened()
    with worker.write() as s:
        s.execute(text("INSERT INTO t VALUES (1)"))
    with pytest.raises(RuntimeError), api.write() as s:
        s.execute(text("INSERT INTO t VALUES (2)"))
        raise RuntimeError("refused half-way")
    assert synced == []
    assert count(api) == 1


def test_another_writer_goes_on_while_a_durable_write_syncs(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sync is held until another thread of this process has written: were it made
    # under the lock (inside the gate, as SQLite's synchronous=FULL does), that thread
    # would wait at the gate and the sync would never be let go.
    api, worker = opened(), opened(durable=False)
    other_wrote = threading.Event()
    real_sync = db_module.sync_log

    def held_sync(log_of: db_module.Log) -> None:
        def write() -> None:
            with worker.write() as s:
                s.execute(text("INSERT INTO t VALUES (2)"))
            other_wrote.set()

        threading.Thread(target=write, daemon=True).start()
        assert other_wrote.wait(DEADLINE_S), "the other writer waited for the sync"
        real_sync(log_of)

    monkeypatch.setattr(db_module, "sync_log", held_sync)
    with api.write() as s:
        s.execute(text("INSERT INTO t VALUES (1)"))
    assert count(api) == 2


def test_a_failed_sync_is_raised_though_the_commit_stands(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fdatasync", failing_sync)
    db = opened()
    with pytest.raises(db_module.LogNotSynced, match="Input/output") as raised, db.write() as s:
        s.execute(text("INSERT INTO t VALUES (1)"))
    assert count(db) == 1  # made, but nobody was told it is on the disk
    # The API answers it as SQLite's own I/O error: 503 and one line, no traceback.
    assert db_module.storage_fault(raised.value) == (
        "ddpq's database cannot be read or written (I/O error)"
    )
    # Not any I/O error: one reading a job's log, say, is no fault of the database.
    assert db_module.storage_fault(OSError(5, "Input/output error")) is None


def test_with_no_log_left_the_database_itself_is_synced(
    path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The last connection to close checkpoints the log into the database and removes it.
    assert not path.with_name(path.name + "-wal").exists()
    synced = synced_files(monkeypatch)
    db_module.sync_log(db_module.Log(path))
    assert synced == [str(path)]


def test_the_log_is_kept_open_between_syncs_and_a_new_log_is_opened_anew(
    opened: Opener,
    path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kept open: Linux tells each open file of a failed write-back, so a descriptor open
    # since the first sync hears of one a checkpoint's own sync was told of first.
    wal = f"{path}-wal"
    opens: list[str] = []
    real_open = os.open

    def noting(file: str, flags: int, *args: int) -> int:
        opens.append(str(file))
        return real_open(file, flags, *args)

    monkeypatch.setattr(os, "open", noting)
    synced = synced_files(monkeypatch)
    api = opened()
    for value in range(3):
        with api.write() as s:
            s.execute(text(f"INSERT INTO t VALUES ({value})"))
    assert opens.count(wal) == 1 and synced == [wal] * 3
    # Every connection closed: SQLite checkpoints the log and removes it; the next write
    # starts a new one, and the sync reaches that one, not the removed file still open.
    api.write_engine.dispose()
    api.read_engine.dispose()
    assert not Path(wal).exists()
    with api.write() as s:
        s.execute(text("INSERT INTO t VALUES (9)"))
    assert opens.count(wal) == 2 and synced[-1] == wal  # not "<path>-wal (deleted)"
    assert count(api) == 4


def test_a_database_reached_through_a_link_syncs_the_real_log(
    path: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SQLite names the log after the file the link leads to: a sync of "<link>-wal" would
    # find no file, and sync nothing of the log.
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "state.db"
    link.symlink_to(path)
    synced = synced_files(monkeypatch)
    db = Database(link)
    try:
        with db.write() as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
    finally:
        db.dispose()
    assert synced == [f"{path}-wal"]


def test_a_submission_whose_sync_fails_is_a_503_naming_the_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.inprocess import lent_client

    with lent_client(tmp_path / "home") as api:
        monkeypatch.setattr(os, "fdatasync", failing_sync)
        r = api.post("/v1/jobs", json={"command": ["true"], "gpus": 0})
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "unavailable" and "I/O error" in r.json()["detail"]
