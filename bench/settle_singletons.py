"""What a job's end costs its owner's singletons: `settle_dependents_many` for one ended
job whose owner has N ended jobs of its name and one held singleton after them (the
query that finds it, and the one that finds the singleton's earlier unended jobs).

    PYTHONPATH=src python bench/settle_singletons.py 100 20000

Prints, for each N, the median and 90th percentile of 200 calls (each in its own write
transaction) and the slowest statement of one call.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from ddpq.core.spec import JobSpec
from ddpq.store import jobs, settling
from ddpq.store.db import Database, migrate


def filled(path: Path, n: int) -> Database:
    migrate(path)
    db = Database(path)
    spec = JobSpec(name="train", owner="alice", command=["true"], cwd="/", gpus=0)
    with db.write() as s:
        for _ in range(n):
            jobs.create_job(s, spec, 1.0)
        s.execute(text("UPDATE jobs SET state = 'succeeded'"))
    with db.write() as s:  # held by its owner, so every end asks about it again
        jobs.create_job(s, JobSpec(**{**spec.__dict__, "hold": True, "singleton": True}), 2.0)
    return db


def slowest_statement(db: Database) -> tuple[float, str]:
    seen: list[tuple[float, str]] = []
    with db.write() as s:
        conn = s.connection()
        started: dict[str, float] = {}

        def before(*_: Any) -> None:
            started["t"] = time.perf_counter()

        def after(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
            seen.append((time.perf_counter() - started["t"], " ".join(statement.split())[:90]))

        event.listen(conn, "before_cursor_execute", before)
        event.listen(conn, "after_cursor_execute", after)
        settling.settle_dependents_many(s, [1], 3.0)
    return max(seen)


def main(sizes: list[int]) -> None:
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            db = filled(Path(folder) / "ddpq.db", n)
            times = []
            for job_id in range(1, 201):
                with db.write() as s:
                    t = time.perf_counter()
                    settling.settle_dependents_many(s, [job_id], 3.0)
                    times.append(time.perf_counter() - t)
            times.sort()
            worst, statement = slowest_statement(db)
            db.dispose()
        print(
            f"N={n}: p50 {times[100] * 1e3:.1f} ms, p90 {times[180] * 1e3:.1f} ms; "
            f"slowest statement {worst * 1e3:.2f} ms: {statement}"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 20000])
