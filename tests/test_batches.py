"""Questions about many jobs asked in bounded pieces (``store.batches``): the service and
workloads of a long queue are read whatever SQLite's cap on a statement's variables."""

from __future__ import annotations

from pathlib import Path

from ddpq.core.spec import JobSpec
from ddpq.store import attempts, jobs, progress
from ddpq.store.batches import IDS_PER_STATEMENT, batches
from ddpq.store.db import Database
from tests.template_db import migrated


def test_batches_keep_every_id_in_order_in_bounded_pieces() -> None:
    pieces = list(batches(range(2 * IDS_PER_STATEMENT + 1)))
    assert [len(p) for p in pieces] == [IDS_PER_STATEMENT, IDS_PER_STATEMENT, 1]
    assert [i for p in pieces for i in p] == list(range(2 * IDS_PER_STATEMENT + 1))
    assert list(batches([])) == []


def test_a_queue_longer_than_one_statement_may_name_is_read_whole(tmp_path: Path) -> None:
    db = Database(migrated(tmp_path / "ddpq.db"))
    spec = JobSpec(name="n", owner="alice", command=["true"], cwd="/", gpus=0, mem_key="train")
    with db.write() as s:
        ids = [jobs.create_job(s, spec, 1.0).id for _ in range(3)]
    asked = [*ids, *range(10_000, 10_000 + 3 * IDS_PER_STATEMENT)]  # most are no job
    with db.read() as s:
        assert attempts.attained(s, asked, 5.0) == {}  # none has run
        assert progress.workloads(s, asked) == dict.fromkeys(ids, "train")
    db.dispose()
    assert IDS_PER_STATEMENT < 999  # under the oldest SQLite's cap on variables
