"""Engines, sessions and migrations for the SQLite state file.

Two engines on one file: ``write`` sessions open with ``BEGIN IMMEDIATE`` so a
read-then-write transaction takes the write lock up front (no lost updates, no
``database is locked`` half-way through); ``read`` sessions use a plain
deferred ``BEGIN`` so readers never queue behind the writer (WAL mode).
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError

# Re-exported: the worker and the server annotate with it without importing SQLAlchemy.
from sqlalchemy.orm import Session as Session
from sqlalchemy.orm import sessionmaker


def make_engine(path: Path, *, immediate: bool, durable: bool = True) -> Engine:
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": 30, "check_same_thread": False},
    )
    sync = "FULL" if durable else "NORMAL"

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA synchronous={sync}")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


class Database:
    """Sessions on one SQLite file.

    ``durable=True`` (the API's): every commit is fsynced (``synchronous=FULL``), so a
    submission the API acknowledged survives even a power cut. The worker's own
    bookkeeping uses ``durable=False`` (``NORMAL``): in WAL mode that still survives any
    crash of the process, and after a power cut there are no processes left to be wrong
    about; the restarted worker reconciles. It saves an fsync per state change.
    """

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.write_engine = make_engine(path, immediate=True, durable=durable)
        self.read_engine = make_engine(path, immediate=False, durable=durable)
        self._write = sessionmaker(self.write_engine, expire_on_commit=False)
        self._read = sessionmaker(self.read_engine, expire_on_commit=False)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One ``BEGIN IMMEDIATE`` transaction; committed when the block ends."""
        with self._write() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.write_engine.dispose()
        self.read_engine.dispose()


def storage_fault(exc: BaseException) -> str | None:
    """What is wrong with the storage, in words, if ``exc`` is a storage fault; else None.

    These are conditions of the machine (a full disk, a read-only file), not bugs:
    callers report them plainly (503, one log line) instead of as a traceback.
    """
    if isinstance(exc, OperationalError | sqlite3.OperationalError):
        text = str(exc).lower()
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
        text = {errno.EROFS: "readonly"}.get(exc.errno, "disk is full")
    else:
        return None
    if "disk is full" in text or "database or disk is full" in text:
        return "the disk holding ddpq's state is full"
    if "readonly" in text or "read-only" in text:
        return "ddpq's database is read-only"
    if "locked" in text or "busy" in text:
        return "ddpq's database is busy (locked by another process for too long)"
    if "disk i/o error" in text or "unable to open" in text:
        return "ddpq's database cannot be read or written (I/O error)"
    return None


def migrations_dir() -> Path:
    """Where the Alembic scripts are: inside an installed wheel, or the repo's top."""
    packaged = Path(__file__).resolve().parent.parent / "migrations"
    if (packaged / "env.py").exists():
        return packaged
    repo = Path(__file__).resolve().parents[3] / "migrations"
    if (repo / "env.py").exists():
        return repo
    raise RuntimeError(f"ddpq's migrations are missing (looked in {packaged} and {repo})")


def alembic_config(path: Path) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{path}")
    return cfg


def migrate(path: Path) -> None:
    """Bring the database file to the newest schema (creating it if needed)."""
    import fcntl

    from alembic import command

    path.parent.mkdir(parents=True, exist_ok=True)
    # `ddpq server` and `ddpq worker` may start together on a fresh folder: one
    # migrates while the other waits, instead of both creating the same tables.
    with open(path.with_name(path.name + ".migrate-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # WAL is a property of the file: set it once before Alembic connects.
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        command.upgrade(alembic_config(path), "head")
