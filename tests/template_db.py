"""A migrated database for tests, made once per test process and copied where needed.

Alembic brings a fresh file to the newest schema in about half a second on this machine;
hundreds of tests (in-process APIs, worker rigs, store tests and every daemon they start)
need one. Each test process migrates one template, once, and each test gets a copy of its
file: the same schema and rows ``migrate`` would make, for a file copy's cost. The tests of
the migrations themselves (``test_migrations.py``, ``test_upgrade.py``) still migrate.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from ddpq.store.db import migrate


@functools.cache
def _template() -> Path:
    """The process's template (cached: migrated once); removed by ``remove_template``."""
    folder = Path(tempfile.mkdtemp(prefix="ddpq-template-db-"))
    path = folder / "ddpq.db"
    migrate(path)
    # Everything into the main file (WAL mode is a property of the file and is kept), so
    # that one file is the whole database.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def migrated(path: Path) -> Path:
    """``migrate(path)``, for a test: a fresh file is a copy of the template; a file that
    exists already is migrated for real (it may hold an older schema)."""
    if path.exists():
        migrate(path)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(_template(), "rb") as template:
        shutil.copyfileobj(template, out)
    return path


def remove_template() -> None:
    """At the session's end: remove the template if one was made."""
    if _template.cache_info().currsize:
        shutil.rmtree(_template().parent, ignore_errors=True)
        _template.cache_clear()


__all__ = ["migrated", "remove_template"]
