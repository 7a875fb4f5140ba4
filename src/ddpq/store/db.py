"""Engines, sessions and migrations for the SQLite state file.

Two engines on one file: ``write`` sessions open with ``BEGIN IMMEDIATE`` so a
read-then-write transaction takes the write lock up front (no lost updates, no
``database is locked`` half-way through); ``read`` sessions use a plain
deferred ``BEGIN`` so readers never queue behind the writer (WAL mode).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError

# Re-exported: the worker and the server annotate with it without importing SQLAlchemy.
from sqlalchemy.orm import Session as Session
from sqlalchemy.orm import sessionmaker

from ddpq.core.out_of_room import out_of_room
from ddpq.store.headroom import Reserve
from ddpq.store.schema_version import is_current
from ddpq.store.write_gate import gate_for

T = TypeVar("T")


def make_engine(path: Path, *, immediate: bool) -> Engine:
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": 30, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event decide how transactions start.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        # Commits are not synced under the write lock; a durable Database syncs the log
        # after letting the lock go (Database.write, sync_log).
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


class Database:
    """Sessions on one SQLite file.

    ``durable=True`` (the API's): a write returns only once its commit is on the disk, so
    a submission the API acknowledged survives even a power cut. The worker's own
    bookkeeping uses ``durable=False``: in WAL mode a commit that is not synced still
    survives any crash of the process, and after a power cut there are no processes left
    to be wrong about; the restarted worker reconciles. It saves an fsync per state change.

    Every connection commits with ``synchronous=NORMAL`` (no fsync under the lock), and a
    durable write syncs the write-ahead log once the lock is free (``sync_log``). SQLite's
    ``FULL`` syncs before it lets the lock go: under a burst of submissions that sync took
    ~2.5 ms a commit, and the worker's writes and the next submission's waited behind it
    (bench/RESULTS.md, "The log synced after the lock"). Unlike ``FULL``, another
    connection can read a commit in the moment before its sync: the worker may lease a job
    whose submission a power cut then takes back, with nothing of it left running (and its
    folder's id never handed out again, ``daemon.job_ids``).
    """

    def __init__(self, path: Path, *, durable: bool = True, reserve: Reserve | None = None) -> None:
        self.path = path
        # Room kept on the database's disk for the writes that must happen (store.headroom).
        self.reserve = reserve
        self.durable = durable
        # SQLite names the log after the database file with its links resolved (an absolute
        # name): the file sync_log must reach, whatever link or folder ``path`` went through.
        self._log = Log(Path(os.path.realpath(path)))
        self.write_engine = make_engine(path, immediate=True)
        self.read_engine = make_engine(path, immediate=False)
        self._write = sessionmaker(self.write_engine, expire_on_commit=False)
        self._read = sessionmaker(self.read_engine, expire_on_commit=False)
        self._gate = gate_for(path)  # writers wait to be woken, not polling (store.write_gate)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One ``BEGIN IMMEDIATE`` transaction; committed when the block ends."""
        with self._gate.held(), self._write() as session, session.begin():
            yield session
        if self.durable:  # committed: on the disk before the caller is told so
            sync_log(self._log)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    def making_room(self, work: Callable[[], T]) -> T:
        """``work`` (a write that must happen: a cancel, a hold, a job's end), done again
        each time the disk was full and a part of the reserve could be given back. The
        jobs are held still meanwhile (a job that keeps writing would take what is given
        back before this write), and what the write left is taken back before they run."""
        try:
            return work()
        except Exception as exc:
            if not is_disk_full(exc) or self.reserve is None:
                raise
            full: Exception = exc
        reserve = self.reserve
        with reserve.jobs_paused():
            try:
                while reserve.give_back():
                    try:
                        return work()
                    except Exception as exc:
                        if not is_disk_full(exc):
                            raise
                        full = exc
                raise full
            finally:
                reserve.reclaim()

    def shortage(self) -> str | None:
        """Why new work is refused now (the disk is short of the reserve's room), or None."""
        return self.reserve.shortage() if self.reserve is not None else None

    def dispose(self) -> None:
        self.write_engine.dispose()
        self.read_engine.dispose()
        self._log.close()


SQLITE_FULL = 13
_WHEN_COMMITTED = "ddpq.when_committed"


def when_committed(session: Session, then: Callable[[], None]) -> None:
    """Call ``then`` once ``session``'s transaction has committed (not at a savepoint's
    release), never if it rolls back: for what may be said only of a write that stays. For
    a session of one transaction, as ``Database.write`` gives."""
    pending = session.info.get(_WHEN_COMMITTED)
    if pending is None:
        pending = session.info[_WHEN_COMMITTED] = []
        event.listen(session, "after_commit", _committed)
    pending.append(then)


def _committed(session: Session) -> None:
    if session.in_nested_transaction():  # a savepoint released: its transaction goes on
        return
    for then in session.info.pop(_WHEN_COMMITTED, []):
        then()


class Log:
    """The write-ahead log of the database file at ``path`` (its links resolved, as SQLite
    names the log), kept open from one sync to the next.

    Kept open because Linux tells of a failed write-back of a file once to each open file
    description that was open when it failed (and to one opened later only if nobody was
    told yet). SQLite's checkpoints sync the log through their own descriptor: one opened
    anew for each sync would miss a failure a checkpoint had already been told of, and the
    API would acknowledge a commit that is not on the disk. A new log (SQLite removes it
    when its last connection closes, and starts another) is opened anew."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._kept: int | None = None
        self._lock = threading.Lock()  # the API's threads sync at the same time

    def descriptor(self) -> int:
        """A descriptor to sync, the caller's to close: the kept log's (a duplicate, which
        shares what it has been told), or with no log left the database file's own."""
        with self._lock:
            try:
                now = os.stat(f"{self.path}-wal")
                if self._kept is not None:
                    kept = os.fstat(self._kept)
                    if (kept.st_dev, kept.st_ino) != (now.st_dev, now.st_ino):
                        self._drop()
                if self._kept is None:
                    self._kept = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
                return os.dup(self._kept)
            except FileNotFoundError:
                self._drop()
                return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._kept is not None:
            os.close(self._kept)
            self._kept = None


def sync_log(log: Log) -> None:
    """Put every commit made so far to the database on the disk: fsync its write-ahead
    log, as ``synchronous=FULL`` does at each commit, but after the write lock is free. A
    commit's frames are in the log before its lock is let go, and a recovery keeps the
    log's frames up to the first torn one, so once the file is synced, this commit and
    every one before it survive a power cut. A checkpoint that moved them into the
    database meanwhile synced the log before it and the database after it; with no log
    left (the last connection closed it after a checkpoint, synced) they are in the
    database, which is synced once more here all the same. A new log's name is on the
    disk before its first frame: SQLite syncs its folder with its header, under ``NORMAL``
    as under ``FULL``. An error of the sync is raised: the commit is made, but nobody may
    be told that it is on the disk.

    This holds only while no connection to the file runs with ``synchronous=OFF``, whose
    checkpoints sync nothing (``make_engine`` sets ``NORMAL`` on every one)."""
    try:
        fd = log.descriptor()
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise LogNotSynced(exc.errno, f"cannot sync {log.path}'s log: {exc.strerror}") from exc


class LogNotSynced(OSError):
    """``sync_log`` failed: the commit is made, but it is not known to be on the disk (a
    storage fault, ``storage_fault``; its errno is the sync's own)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the account's quota) is full."""
    if isinstance(exc, OSError):
        return out_of_room(exc)
    cause = getattr(exc, "orig", exc)  # SQLAlchemy wraps sqlite3's error
    if not isinstance(cause, sqlite3.Error):
        return False
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) == SQLITE_FULL:
        return True
    return "disk is full" in str(cause)


def storage_fault(exc: BaseException) -> str | None:
    """What is wrong with the storage, in words, if ``exc`` is a storage fault; else None.

    These are conditions of the machine (a full disk, a read-only file), not bugs:
    callers report them plainly (503, one log line) instead of as a traceback.
    """
    if is_disk_full(exc):
        return "the disk holding ddpq's state is full"
    if isinstance(exc, OperationalError | sqlite3.OperationalError):
        text = str(exc).lower()
    elif isinstance(exc, OSError) and exc.errno == errno.EROFS:
        text = "readonly"
    elif isinstance(exc, LogNotSynced):
        text = "disk i/o error"
    else:
        return None
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

    path.parent.mkdir(parents=True, exist_ok=True)
    # `ddpq server` and `ddpq worker` may start together on a fresh folder: one
    # migrates while the other waits, instead of both creating the same tables.
    with open(path.with_name(path.name + ".migrate-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_current(path, migrations_dir() / "versions"):
            return  # the usual start: nothing to migrate, and no second spent finding so
        from alembic import command

        # WAL is a property of the file: set it once before Alembic connects.
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
        command.upgrade(alembic_config(path), "head")
