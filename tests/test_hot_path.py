"""The worker's per-job costs that once grew with the machine's slowness stay small
(bench/RESULTS.md, "the slower kind of machine"). Counted in work done, not timed."""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from ddpq.core.spec import JobSpec
from ddpq.core.states import ACTIVE, JobState
from ddpq.daemon.heap import freeze_startup_objects
from ddpq.daemon.lock_turns import take_short_turns
from ddpq.store import (
    attempts,
    host,
    jobs,
    leases,
    queue,
    settling,
    supervision,
    transitions,
    users,
)
from ddpq.store import limits as limit_store
from ddpq.store.db import Database, Session, migrate


def calls_to(name: str, profile: cProfile.Profile) -> int:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(entry[1] for (_, _, function), entry in stats.items() if function == name)


def test_settling_an_ended_jobs_dependents_builds_no_statement(tmp_path: Path) -> None:
    # Each ended job asks which held jobs wait on it. A query built anew per call (a new
    # alias of the jobs table each time) made SQLAlchemy proxy all of the table's columns
    # again: 40% of recording a job's end, per job, under the worker's write lock.
    migrate(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    try:
        for ended in ([1], [2, 3], [4]):  # the first call may build; none after it
            profile = cProfile.Profile()
            with db.write() as s:
                profile.enable()
                settling.settle_dependents_many(s, ended, 100.0)
                profile.disable()
        assert calls_to("_make_proxy", profile) == 0
        assert calls_to("aliased", profile) == 0
    finally:
        db.dispose()


def test_the_daemons_start_up_objects_are_kept_out_of_full_collections() -> None:
    # A full collection walked every object made at start with the interpreter lock
    # held: 0.4-0.8 s pauses in the middle of a burst here (bench/RESULTS.md).
    module = ModuleType("made_at_start")  # stands for the daemon's modules, tables, routes
    module.cycle = [module]  # type: ignore[attr-defined]
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 0
        assert not gc.is_finalized(module)
        tracked = {id(o) for o in gc.get_objects(generation=2)}
        assert id(module) not in tracked  # frozen: outside every generation a pass walks
    finally:
        gc.unfreeze()  # this test process collects as before


def test_the_statements_of_every_pass_and_submission_are_built_once(tmp_path: Path) -> None:
    # Built anew per call, a statement cost its construction and its cache key each time:
    # the cap's count was a third of a submission's own time, and a pass's reads and a
    # start's UPDATE of twenty columns much of the worker's transaction, which
    # submissions wait behind (bench/RESULTS.md, "the hot path on the slower machine").
    migrate(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    spec = JobSpec(name="j", owner="alice", command=["true"], cwd="/", gpus=1)
    calls: list[Callable[[Session], object]] = [
        lambda s: queue.waiting_of(s, "alice", 10_001),
        lambda s: jobs.queued_for_planning(s, window=256),
        lambda s: jobs.queued_for_planning(s),
        lambda s: supervision.running_for_supervision(s, ACTIVE),
        lambda s: host.ram_held(s),
        lambda s: leases.live(s),
        lambda s: leases.release_many(s, [1, 2], 5.0),
        lambda s: transitions.move_many(s, [started(s, spec)], 5.0, started_at=5.0),
        lambda s: jobs.auto_memory_jobs(s, [1, 2, 3]),
        lambda s: jobs.set_waiting_reasons(s, {1: "waiting for GPUs"}, {}),
        lambda s: attempts.mark_running_many(s, [(running(s, spec), "h")], "local", "", 6.0),
        lambda s: limit_store.limits(s),
        lambda s: limit_store.open_reservations(s, 5.0),
        lambda s: users.unix_accounts(s, {"alice", "bob"}),
    ]
    try:
        for call in calls:
            with db.write() as s:
                call(s)  # the first may build
            profile = cProfile.Profile()
            with db.write() as s:
                profile.enable()
                call(s)
                profile.disable()
            assert calls_to("_generate_cache_key", profile) == 0
            assert calls_to("_get_crud_kv_pairs", profile) == 0
    finally:
        db.dispose()


def running(s: Session, spec: JobSpec) -> int:
    """A new job, moved to starting (as a pass's lease leaves it)."""
    change = started(s, spec)
    transitions.move_many(s, [change], 5.0)
    return change.job_id


def started(s: Session, spec: JobSpec) -> transitions.Change:
    job_id = jobs.create_job(s, spec, 1.0).id
    return transitions.Change(job_id, JobState.QUEUED, JobState.STARTING, "leased", {"attempt": 1})


def test_the_daemons_threads_take_short_turns_at_the_interpreter_lock() -> None:
    # At Python's 5 ms a submission waited for the lock after each of its statements while
    # the worker's pass computed, holding the write gate (bench/lock_turns.py).
    before = sys.getswitchinterval()
    try:
        take_short_turns()
        assert sys.getswitchinterval() <= 0.001
    finally:
        sys.setswitchinterval(before)
