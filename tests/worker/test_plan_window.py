"""The planning window: a pass reads the first jobs of each shape, not a whole flood.

A pass over 10,000 alike queued jobs read and ranked all of them, several times a
second, with the API waiting on the interpreter lock meanwhile (bench/cpu_flood.py).
Now each pass reads at most ``window`` of the jobs alike in all the planner reads that
never ran; these tests hold that the jobs it leaves out change nothing it decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from ddpq.core.policy import Policy
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs as job_store
from ddpq.store import sweeps as sweep_store
from ddpq.worker.scheduling import BEHIND_ALIKE, PLAN_WINDOW, WINDOWED
from tests.worker.rig import Rig, make_rig

Q, R = JobState.QUEUED, JobState.RUNNING


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", fake_gpus=2, port_range=(29600, 29699))
    r.worker.scheduler.window = 3
    yield r
    r.close()


def planned(rig: Rig, window: int | None) -> list[int]:
    with rig.api.read() as s:
        return sorted(job.id for job, _ in job_store.queued_for_planning(s, window=window))


def test_a_pass_reads_the_first_jobs_of_each_shape_and_every_retry(rig: Rig) -> None:
    alike = [rig.submit(gpus=1) for _ in range(6)]
    bigger = [rig.submit(gpus=2) for _ in range(4)]  # another shape: its own window
    bobs = [rig.submit(gpus=1, owner="bob") for _ in range(2)]
    assert planned(rig, None) == sorted(alike + bigger + bobs)
    assert planned(rig, 3) == sorted(alike[:3] + bigger[:3] + bobs)
    assert planned(rig, 1) == sorted([alike[0], bigger[0], bobs[0]])


def test_a_retried_job_is_read_beyond_the_window(rig: Rig) -> None:
    first = rig.submit(gpus=2, max_retries=1)
    rig.step()
    later = [rig.submit(gpus=2, max_retries=1) for _ in range(3)]
    rig.host.finish(first, 1)
    rig.step()  # requeued behind its back-off, and the next one started
    assert rig.job(first).state is Q and rig.job(first).attempt == 1
    assert rig.job(later[0]).state is R
    assert planned(rig, 1) == sorted([first, later[1]])


@pytest.mark.parametrize("policy", [Policy.FAIRSHARE, Policy.SRPT_PROGRESS])
def test_jobs_past_the_window_say_why_and_start_in_the_order_a_full_pass_gives(
    tmp_path: Path, policy: Policy
) -> None:
    orders = []
    for window in (None, 3):
        r = make_rig(tmp_path / f"home-{window}", fake_gpus=2, policy=policy)
        r.worker.scheduler.window = window
        try:
            ids = [r.submit(gpus=1, owner=o) for o in ["alice"] * 7 + ["bob"] * 2]
            r.step()
            reasons = {r.job(i).reason for i in ids[5:7]}
            assert reasons == ({BEHIND_ALIKE} if window else {r.job(ids[2]).reason})
            assert r.job(ids[2]).reason not in ("", BEHIND_ALIKE)
            started: list[int] = []
            while len(started) < len(ids):
                running = r.host.running()
                started += [i for i in running if i not in started]
                for i in running:
                    r.host.finish(i, 0)
                r.step()
            orders.append([i - ids[0] for i in started])
        finally:
            r.close()
    assert orders[0] == orders[1]


def test_a_capped_sweep_past_its_window_does_not_hold_back_a_later_job(rig: Rig) -> None:
    job = JobSpec(name="s", owner="alice", command=["true"], cwd="/", gpus=1)
    members = [sweep_store.NewMember(i, f"s-{i}", ["true"], {}) for i in range(10)]
    with rig.api.write() as s:
        sweep_store.create_sweep(s, sweep_store.NewSweep(job, {}, {}, "0-9", 1, members), 0.0)
    later = rig.submit(gpus=1)  # alike but for its sweep: another shape
    rig.step()
    assert rig.job(later).state is R
    assert len(rig.host.running()) == 2


def test_a_pass_that_starts_a_whole_window_passes_again_at_once(tmp_path: Path) -> None:
    r = make_rig(tmp_path / "home", fake_gpus=4, port_range=(29600, 29699))
    r.worker.scheduler.window = 2
    try:
        ids = [r.submit(gpus=1) for _ in range(5)]
        r.step()
        assert r.host.running() == ids[:2] and r.worker._pass_again
        r.step()
        assert r.host.running() == ids[:4] and r.worker._pass_again
        r.step()
        assert r.host.running() == ids[:4] and not r.worker._pass_again
    finally:
        r.close()


def test_the_window_is_on_by_default_where_alike_jobs_rank_by_submission(
    tmp_path: Path,
) -> None:
    assert frozenset(Policy) == WINDOWED  # today, every policy
    for policy in (Policy.LAS, Policy.SRPT_PROGRESS):
        r = make_rig(tmp_path / policy.value, policy=policy)
        try:
            assert r.worker.scheduler.window == PLAN_WINDOW
        finally:
            r.close()


def test_every_column_the_planner_reads_is_part_of_a_jobs_shape() -> None:
    """A column the planner reads that two alike jobs may differ in would let a job past
    the window start where the first of its shape cannot: it belongs in the shape (and in
    the index ``ix_jobs_plan_shape``, by a migration)."""
    own = {"id", "submitted_at", "reason", "not_before", "oom_requeues", "resize_to"}  # per job
    # An elastic job's most says how many GPUs it takes, never whether it can start: that
    # is its least, ``gpus`` (``core.scheduler.elastic.choose_sized`` falls back to it).
    how_many = {"gpus_max"}
    shape = {column.key for column in job_store._SHAPE}
    assert {column.key for column in job_store._PLANNED} - own - how_many <= shape
    # not_before, oom_requeues, resize_to: only a job that ran has them
    assert "attempt" in shape


def test_the_jobs_past_the_window_are_found_by_their_own_index(rig: Rig) -> None:
    """Telling them why they wait walks the index of jobs not told yet, not the queue."""
    plans: list[str] = []

    def explain(conn: Any, cursor: Any, sql: str, params: Any, *args: Any) -> None:
        if sql.startswith("UPDATE jobs INDEXED BY"):
            plans.extend(str(row) for row in cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params))

    ids = [rig.submit(gpus=1) for _ in range(6)]
    event.listen(rig.worker.db.write_engine, "before_cursor_execute", explain)
    rig.step()
    event.remove(rig.worker.db.write_engine, "before_cursor_execute", explain)
    assert any("ix_jobs_unplanned" in plan for plan in plans)
    assert rig.job(ids[5]).reason == BEHIND_ALIKE
