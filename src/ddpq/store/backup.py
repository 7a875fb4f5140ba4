"""An online, consistent copy of the database, with SQLite's backup API.

Safe while the daemon runs: the copy is made in one step (``pages=-1``), which is one read
transaction on the source, so it is the database as of one moment. In WAL mode a reader
neither waits for the writers nor stops them (they go on appending to the WAL meanwhile).
A copy of the file with ``cp`` is not that: it may take half of a transaction, and it
misses whatever still sits in ``ddpq.db-wal``.

The copy is one self-contained file (rollback journal, not WAL: no ``-wal`` file beside it
to lose), made 0600 (it holds token hashes and every job's ``--env``), checked with
``PRAGMA quick_check`` and fsynced before this returns. Restore it by stopping the daemon
and putting it in place as ``ddpq.db`` (docs/admin.md).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote


class BackupFailed(Exception):
    """The copy could not be made; the message says why (the partial file is removed)."""


def backup_database(source: Path, dest: Path) -> int:
    """Copy the database ``source`` into the new file ``dest``; its size in bytes.

    ``dest`` must not exist (FileExistsError: never overwritten, not even through a link).
    """
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    try:
        _copy(source, dest)
        with open(dest, "rb") as f:
            os.fsync(f.fileno())
        _fsync_folder(dest.parent)
        return dest.stat().st_size
    except BaseException:
        for leftover in (dest, dest.with_name(dest.name + "-journal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        raise


def _copy(source: Path, dest: Path) -> None:
    # mode=rw: the source must exist (a plain connect would create an empty database).
    uri = f"file:{quote(str(source.resolve()))}?mode=rw"
    try:
        src = sqlite3.connect(uri, uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise BackupFailed(f"cannot open {source}: {exc}") from None
    try:
        dst = sqlite3.connect(dest, timeout=30)
        try:
            src.backup(dst)  # pages=-1: all of it in one step, one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")
            (verdict,) = dst.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise BackupFailed(f"the copy does not check out: {verdict}")
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise BackupFailed(f"cannot copy {source}: {exc}") from None
    finally:
        src.close()


def _fsync_folder(folder: Path) -> None:
    """The new file's name on disk too, not only its content."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
