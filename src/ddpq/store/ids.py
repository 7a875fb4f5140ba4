"""The job id high-water mark: the highest id ever handed out. Flush, never commit.

The jobs table is AUTOINCREMENT (migration 0021j): SQLite keeps that mark in
``sqlite_sequence`` and gives the next job the mark plus one, even when the newest rows
were deleted. A database restored from a backup carries the backup's mark, below the ids
handed out since; ``raise_job_ids`` lifts it over what the daemon finds outside the
database (``ddpq.daemon.job_ids``), so no id is handed out twice.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def job_id_mark(session: Session) -> int:
    """The highest job id handed out so far (0 if none)."""
    conn = session.connection()
    seq = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'")).scalar()
    top = conn.execute(text("SELECT max(id) FROM jobs")).scalar()
    return max(int(seq or 0), int(top or 0))


def raise_job_ids(session: Session, floor: int) -> int:
    """Make every job id handed out from now on greater than ``floor``; the mark now."""
    mark = job_id_mark(session)
    if floor > mark:
        conn = session.connection()
        updated = conn.execute(
            text("UPDATE sqlite_sequence SET seq = :floor WHERE name = 'jobs'"), {"floor": floor}
        ).rowcount
        if not updated:  # a table no row was ever inserted into has no entry yet
            conn.execute(
                text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :floor)"),
                {"floor": floor},
            )
        mark = floor
    return mark
