"""A sweep's members are written by a fixed number of statements, whatever their number.

Their ids came from ``INSERT ... RETURNING`` in the rows' order, which SQLAlchemy runs on
SQLite as one statement per row: a 10,000-member array held the write lock for 10 s
(bench/cpu_flood.py), every other writer of the daemon waiting behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event

from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs, sweeps
from ddpq.store.db import Database
from tests.template_db import migrated


def test_members_are_written_in_a_few_statements_and_each_has_its_history(
    tmp_path: Path,
) -> None:
    migrated(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    statements: list[str] = []

    def count(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        statements.append(sql)

    job = JobSpec(name="s", owner="alice", command=["true"], cwd="/", gpus=0)
    counts = []
    for n in (3, 300):
        members = [sweeps.NewMember(i, f"s-{i}", ["true"], {"i": str(i)}) for i in range(n)]
        statements.clear()
        event.listen(db.write_engine, "before_cursor_execute", count)
        with db.write() as s:
            sweep = sweeps.create_sweep(s, sweeps.NewSweep(job, {}, {}, "x", None, members), 1.0)
        event.remove(db.write_engine, "before_cursor_execute", count)
        counts.append(len(statements))
        with db.read() as s:
            got = sweeps.members(s, sweep.id)
            assert [m.index for m in got] == list(range(n))
            assert {m.state for m in got} == {JobState.QUEUED}
            assert all(len(jobs.events_of(s, m.id)) == 1 for m in got[:: n // 3])
    assert counts[0] == counts[1] < 12
    db.dispose()
