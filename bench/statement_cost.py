"""What one of the worker's reads costs through SQLAlchemy, beside the same SQL through the
DB-API connection underneath, in this process (no daemon).

    python bench/statement_cost.py [--runs 3000]

On a migrated database with no running job, each read is a read transaction and one
statement: the running jobs the worker's stop phase reads every pass
(``store.supervision.running_for_supervision``) through the session (the ORM's layer), on
the session's connection as the store reads it now (``store.columns.flushed``), then the
same SQL text on the same connection's DB-API cursor. It prints the interpreter's CPU per
read (``time.thread_time``) for each, and for an empty read transaction. The differences
are what each layer adds to each statement a pass runs (``bench/statement_count.py``
counts them).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine import machine_line, python_c_pass_ms

from ddpq.config import Settings
from ddpq.core.states import JobState
from ddpq.store.columns import flushed
from ddpq.store.db import Database, migrate
from ddpq.store.supervision import _SUPERVISED

SAME_SQL = (
    "SELECT id, owner, started_at, time_limit_s, stop_request, stop_sent_at, priority,"
    " submitted_at, preemptible, preemptions, gpus, gpus_max, resize_to FROM jobs"
    " WHERE state IN (?)"
)


def per_call_ms(call: Callable[[], object], runs: int) -> float:
    for _ in range(runs // 10):  # warm: caches, the first of everything
        call()
    start = time.thread_time()
    for _ in range(runs):
        call()
    return (time.thread_time() - start) / runs * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddpq-statement-cost-"))
    try:
        settings = Settings(home=home)
        migrate(settings.db_path)
        db = Database(settings.db_path)

        def empty() -> None:
            with db.read():
                pass

        def through_sqlalchemy() -> None:
            with db.read() as s:
                s.execute(_SUPERVISED, {"states": [JobState.RUNNING]}).all()

        def through_the_connection() -> None:
            with db.read() as s:
                found = flushed(s).execute(_SUPERVISED, {"states": [JobState.RUNNING]})
                found.all()

        def through_dbapi() -> None:
            with db.read() as s:
                cursor = s.connection().connection.dbapi_connection.cursor()  # type: ignore[union-attr]
                cursor.execute(SAME_SQL, (JobState.RUNNING.value,)).fetchall()

        reads = [
            ("an empty read transaction", empty),
            ("the stop phase's read, through SQLAlchemy's ORM", through_sqlalchemy),
            ("the same, on the session's connection (store.columns)", through_the_connection),
            ("the same SQL, through the DB-API cursor", through_dbapi),
        ]
        rows = [(name, per_call_ms(read, args.runs)) for name, read in reads]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(machine_line())
    print(f"python -c pass: {python_c_pass_ms():.1f} ms; {args.runs} reads each")
    print("| read | interpreter CPU per read |")
    print("|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.3f} ms |")


if __name__ == "__main__":
    main()
