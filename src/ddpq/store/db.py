"""Engines, sessions and migrations for the SQLite state file.

Two engines on one file: ``write`` sessions open with ``BEGIN IMMEDIATE`` so a
read-then-write transaction takes the write lock up front (no lost updates, no
``database is locked`` half-way through); ``read`` sessions use a plain
deferred ``BEGIN`` so readers never queue behind the writer (WAL mode).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def _pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event decide how transactions start.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    # FULL: a submission the API acknowledged survives even a power cut.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def make_engine(path: Path, *, immediate: bool) -> Engine:
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": 30, "check_same_thread": False},
    )
    event.listen(engine, "connect", _pragmas)
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.write_engine = make_engine(path, immediate=True)
        self.read_engine = make_engine(path, immediate=False)
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
    from alembic import command

    path.parent.mkdir(parents=True, exist_ok=True)
    # WAL is a property of the file: set it once before Alembic connects.
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    command.upgrade(alembic_config(path), "head")
