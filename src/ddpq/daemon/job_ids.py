"""Job ids are never handed out twice, also after a database is restored from a backup.

A job's id names its folder (``jobs/<id>``) and is how its owner and everyone else speak
of it. A backup restored the documented way (docs/admin.md) brings back an older database
whose ids would restart below the jobs submitted since: the next job would get an id whose
folder holds another user's log and checkpoints. So at start, and again when it stops,
the daemon lifts the database's id mark (``store.ids``) above

- every job folder it finds (``jobs/<id>``, and those moved aside, ``jobs/.stale/<id>-…``),
- the mark it wrote to ``job-ids`` in the state folder when it last started or stopped
  (a restore replaces ``ddpq.db`` alone; jobs whose folders retention removed meanwhile,
  or that never ran, are covered by it),

then writes the mark back to that file. A job's first attempt never adopts a folder that
is already there either (``ddpq.jobdir.make_folder``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ddpq.config import Settings
from ddpq.jobdir import STALE
from ddpq.store import ids as id_store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.daemon")

MARK_FILE = "job-ids"


def mark_file(settings: Settings) -> Path:
    return settings.home / MARK_FILE


def highest_folder(jobs_dir: Path) -> int:
    """The highest job id that has a folder (or a folder moved aside); 0 if none."""
    names: list[str] = []
    for folder in (jobs_dir, jobs_dir / STALE):
        with contextlib.suppress(OSError):  # none yet, or not ours to list
            names += os.listdir(folder)
    ids = [int(lead) for lead in (n.split("-", 1)[0] for n in names) if lead.isdigit()]
    return max(ids, default=0)


def written_mark(settings: Settings) -> int:
    """The mark in ``job-ids`` (0 if there is none or it is not a number)."""
    try:
        with open(mark_file(settings), "rb") as f:
            text = f.read(64).decode(errors="replace").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def keep_job_ids_unique(settings: Settings) -> int:
    """Lift the database's id mark above every id known outside it, and write it down;
    the mark."""
    floor = max(highest_folder(settings.jobs_dir), written_mark(settings))
    db = Database(settings.db_path)
    try:
        with db.write() as s:
            before = id_store.job_id_mark(s)
            mark = id_store.raise_job_ids(s, floor)
    except Exception as exc:  # a full disk, say: new folders are still never adopted
        log.warning("cannot raise the job id mark to %d: %s", floor, exc)
        return floor
    finally:
        db.dispose()
    if mark > before:
        log.warning(
            "job ids: the database had given ids up to %d, but ids up to %d were handed out "
            "before (a restored backup?): new jobs get ids from %d on",
            before,
            mark,
            mark + 1,
        )
    _write_mark(settings, mark)
    return mark


def _write_mark(settings: Settings, mark: int) -> None:
    path = mark_file(settings)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, f"{mark}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write the job id mark to %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
