"""Sweeps in the store, on a real SQLite file: members written in bulk as create_job would
write each, waiting on a sweep, and cancel, hold and release of a whole sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpq.core import sweeps as core_sweeps
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs, settling, sweeps, transitions
from ddpq.store.db import Database
from ddpq.store.dependencies import UnknownSweep
from tests.template_db import migrated

Q, H, R, S, F, C = (
    JobState.QUEUED,
    JobState.HELD,
    JobState.RUNNING,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    migrated(tmp_path / "ddpq.db")
    return Database(tmp_path / "ddpq.db")


def spec(**kw: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "name": "j",
        "owner": "alice",
        "command": ["true"],
        "cwd": "/",
        "gpus": 1,
    }
    return JobSpec(**{**fields, **kw})


def new_job(db: Database, **kw: Any) -> int:
    with db.write() as s:
        return jobs.create_job(s, spec(**kw), 100.0).id


def new_sweep(db: Database, n: int, max_running: int | None = None, **kw: Any) -> int:
    members = [sweeps.NewMember(i, f"s-{i}", ["echo", str(i)], {"i": str(i)}) for i in range(n)]
    new = sweeps.NewSweep(
        spec(name="s", **kw), {}, {"i": [str(i) for i in range(n)]}, None, max_running, members
    )
    with db.write() as s:
        return sweeps.create_sweep(s, new, 100.0).id


def members(db: Database, sweep_id: int) -> list[sweeps.MemberRow]:
    with db.read() as s:
        return sweeps.members(s, sweep_id)


def states(db: Database, sweep_id: int) -> list[JobState]:
    return [m.state for m in members(db, sweep_id)]


def end(db: Database, job_id: int, state: JobState) -> None:
    """A job runs and ends as ``state`` (settling whoever waits on it)."""
    with db.write() as s:
        job = jobs.get_job(s, job_id)
        transitions.move_job(s, job, JobState.STARTING, "", 101.0)
        transitions.move_job(s, job, R, "", 101.0)
        settling.finish(s, job, state, "exit", 102.0)


def job(db: Database, job_id: int) -> tuple[JobState, str]:
    with db.read() as s:
        j = jobs.get_job(s, job_id)
        return j.state, j.reason


def test_members_are_written_whole_with_their_environment_and_history(db: Database) -> None:
    sweep_id = new_sweep(db, 3, env={"A": "1"})
    rows = members(db, sweep_id)
    assert [(m.index, m.name, m.params, m.state) for m in rows] == [
        (i, f"s-{i}", {"i": str(i)}, Q) for i in range(3)
    ]
    with db.read() as s:
        j = jobs.get_job(s, rows[2].id)
        assert j.command == ["echo", "2"] and j.sweep_id == sweep_id
        assert j.env == {
            "A": "1",
            "DDPQ_SWEEP_ID": str(sweep_id),
            "DDPQ_SWEEP_INDEX": "2",
            "DDPQ_SWEEP_PARAMS": json.dumps({"i": "2"}, separators=(",", ":")),
        }
        assert [(e.to_state, e.reason) for e in jobs.events_of(s, j.id)] == [(Q, "submitted")]
        assert sweeps.counts(s, [sweep_id]) == {sweep_id: {Q: 3}}


def test_members_after_a_job_are_held_then_released_or_cancelled_together(db: Database) -> None:
    first = new_job(db)
    released = new_sweep(db, 4, after=(first,))
    assert set(states(db, released)) == {H}
    assert members(db, released)[0].reason == f"waiting for job {first} to succeed"
    end(db, first, S)
    assert set(states(db, released)) == {Q}
    failing = new_job(db)
    doomed = new_sweep(db, 3, after=(failing,))
    ids = [m.id for m in members(db, doomed)]
    on_member = new_job(db, after=(ids[1],))  # the next level: settled after the members
    on_both = new_job(db, after=(failing, ids[2]))  # doomed by the first level already
    end(db, failing, F)
    assert {(m.state, m.reason) for m in members(db, doomed)} == {
        (C, f"dependency {failing} failed")
    }
    assert job(db, on_member) == (C, f"dependency {ids[1]} cancelled")
    assert job(db, on_both) == (C, f"dependency {failing} failed")
    with db.read() as s:
        for job_id in [*ids, on_both]:  # each ended once, in order
            assert [(e.from_state, e.to_state) for e in jobs.events_of(s, job_id)] == [
                (None, Q),
                (Q, H),
                (H, C),
            ]
    # A sweep after a job that already failed is cancelled at once, as a job would be.
    late = new_sweep(db, 2, after=(failing,))
    assert set(states(db, late)) == {C}


def test_a_job_after_a_sweep_waits_for_every_member_and_dies_with_any(db: Database) -> None:
    sweep_id = new_sweep(db, 3)
    waiter = new_job(db, after_sweeps=(sweep_id,))
    assert job(db, waiter) == (H, f"waiting for every job of sweep {sweep_id} to succeed")
    ids = [m.id for m in members(db, sweep_id)]
    end(db, ids[0], S)
    end(db, ids[1], S)
    assert job(db, waiter)[0] is H
    end(db, ids[2], S)
    assert job(db, waiter) == (Q, "dependencies met, released")

    other = new_sweep(db, 3)
    waiter = new_job(db, after_sweeps=(other,))
    chained = new_job(db, after=(waiter,))
    ids = [m.id for m in members(db, other)]
    end(db, ids[1], F)
    assert job(db, waiter) == (C, f"dependency sweep {other}: its job {ids[1]} failed")
    assert job(db, chained) == (C, f"dependency {waiter} cancelled")
    with pytest.raises(UnknownSweep), db.write() as s:
        jobs.create_job(s, spec(after_sweeps=(999,)), 100.0)


def test_cancel_ends_waiting_members_stops_running_ones_and_settles_dependents(
    db: Database,
) -> None:
    sweep_id = new_sweep(db, 4)
    ids = [m.id for m in members(db, sweep_id)]
    end(db, ids[0], S)
    with db.write() as s:  # one runs
        running = jobs.get_job(s, ids[1])
        transitions.move_job(s, running, JobState.STARTING, "", 101.0)
        transitions.move_job(s, running, R, "", 101.0)
    waiter = new_job(db, after_sweeps=(sweep_id,))
    with db.write() as s:
        acted = sweeps.cancel_sweep(s, sweep_id, 103.0)
    assert (acted.changed, acted.stopping) == (2, 1)
    assert states(db, sweep_id) == [S, R, C, C]
    with db.read() as s:
        assert jobs.get_job(s, ids[1]).stop_request == "cancel"
        assert [e.to_state for e in jobs.events_of(s, ids[2])] == [Q, C]
    assert job(db, waiter)[0] is C
    with db.write() as s:  # again: nothing more to do
        assert sweeps.cancel_sweep(s, sweep_id, 104.0) == sweeps.Acted(0, 0)


def test_hold_and_release_keep_a_dependency_hold(db: Database) -> None:
    first = new_job(db)
    plain = new_sweep(db, 3)
    after = new_sweep(db, 2, after=(first,))
    end(db, members(db, plain)[0].id, S)
    with db.write() as s:
        assert sweeps.set_sweep_hold(s, plain, True, 103.0) == sweeps.Acted(2, untouched=1)
        sweeps.set_sweep_hold(s, after, True, 103.0)
    assert states(db, plain) == [S, H, H]
    assert {m.reason for m in members(db, after)} == {
        f"held by user; waiting for job {first} to succeed"
    }
    with db.write() as s:
        sweeps.set_sweep_hold(s, plain, False, 104.0)
        sweeps.set_sweep_hold(s, after, False, 104.0)
    assert states(db, plain) == [S, Q, Q]
    assert {(m.state, m.reason) for m in members(db, after)} == {
        (H, f"waiting for job {first} to succeed")
    }
    end(db, first, S)
    assert set(states(db, after)) == {Q}
    with db.read() as s:
        events = [(e.from_state, e.to_state) for e in jobs.events_of(s, members(db, plain)[1].id)]
    assert events == [(None, Q), (Q, H), (H, Q)]


def test_caps_count_the_members_holding_leases(db: Database) -> None:
    capped = new_sweep(db, 4, max_running=2)
    free = new_sweep(db, 2)
    ids = [m.id for m in members(db, capped)]
    with db.write() as s:
        transitions.move_job(s, jobs.get_job(s, ids[0]), JobState.STARTING, "", 101.0)
    with db.read() as s:
        caps = sweeps.caps(s, {capped, free})
        queued = {q.id: q.sweep_id for q, _ in jobs.queued_for_planning(s)}
    assert (caps.cap, caps.running) == ({capped: 2}, {capped: 1})
    assert queued == {ids[1]: capped, ids[2]: capped, ids[3]: capped} | {
        m.id: free for m in members(db, free)
    }


def test_a_thousand_members_in_one_transaction(db: Database) -> None:
    sweep_id = new_sweep(db, 1000, after=(new_job(db),))
    with db.read() as s:
        assert sweeps.counts(s, [sweep_id]) == {sweep_id: {H: 1000}}
        assert sum(1 for _ in jobs.jobs_in(s, [H])) == 1000
    rows = members(db, sweep_id)
    assert [m.index for m in rows] == list(range(1000))
    assert len({m.id for m in rows}) == 1000


def test_member_names_from_core_fit_the_store() -> None:
    # The store takes names as given: core.sweeps makes them fit the job name column.
    name = core_sweeps.member_name("x" * 64, core_sweeps.Member(2**31 - 1, {"p": "v" * 100}))
    assert len(name) <= 64
