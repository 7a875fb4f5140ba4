"""Sweeps through the real worker loop and store, with the fake executor (no process).

The cap (``%K``) as the worker applies it pass after pass, a member's env reaching its
launch, a sweep's cancel stopping its running members, and a job waiting on a sweep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.store import jobs as job_store
from ddpq.store import sweeps as sweep_store
from tests.worker.rig import Rig, make_rig

Q, R, S, F, C = (
    JobState.QUEUED,
    JobState.RUNNING,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    # Ports enough that no owner's port budget (a quarter of the range) is what holds
    # members back: only their sweep's cap may.
    r = make_rig(tmp_path / "home", fake_gpus=4, port_range=(29600, 29699))
    yield r
    r.close()


def sweep(rig: Rig, n: int, max_running: int | None = None, gpus: int = 1) -> list[int]:
    """A sweep of ``n`` members through the store, as the API creates one; their ids."""
    job = JobSpec(name="s", owner="alice", command=["true"], cwd="/", gpus=gpus)
    members = [sweep_store.NewMember(i, f"s-{i}", ["true"], {"i": str(i)}) for i in range(n)]
    spec = sweep_store.NewSweep(job, {}, {}, f"0-{n - 1}", max_running, members)
    with rig.api.write() as s:
        sweep_id = sweep_store.create_sweep(s, spec, rig.clock()).id
    with rig.api.read() as s:
        return [m.id for m in sweep_store.members(s, sweep_id)]


def running(rig: Rig, ids: list[int]) -> list[int]:
    return [i for i in ids if rig.job(i).state in (JobState.STARTING, R)]


def test_the_worker_never_runs_more_members_than_the_cap(rig: Rig) -> None:
    ids = sweep(rig, 7, max_running=2)
    other = rig.submit(gpus=1, owner="bob")  # not in the sweep: the cap does not hold it back
    rig.step()
    assert running(rig, ids) == ids[:2]
    assert rig.job(other).state is R  # 3 of 4 GPUs busy: the cap keeps the 4th free
    sweep_id = _sweep_of(rig, ids[0])
    assert {rig.job(i).reason for i in ids[2:]} == {
        f"sweep {sweep_id} runs 2 members at once, its cap"
    }
    done = 0
    while done < len(ids):
        now = running(rig, ids)
        assert len(now) <= 2
        rig.host.finish(now[0], 0)
        done += 1
        rig.step()  # recorded, and the next member leased, in the same pass
    assert [rig.job(i).state for i in ids] == [S] * 7


def _sweep_of(rig: Rig, job_id: int) -> int:
    with rig.api.read() as s:
        sweep_id = job_store.get_job(s, job_id).sweep_id
    assert sweep_id is not None
    return sweep_id


def test_a_member_is_launched_with_its_sweep_variables(rig: Rig) -> None:
    ids = sweep(rig, 2)
    rig.step()
    launched = rig.host.attempt_of(ids[1]).launch
    sweep_id = _sweep_of(rig, ids[1])
    assert launched.spec.env["DDPQ_SWEEP_ID"] == str(sweep_id)
    assert launched.spec.env["DDPQ_SWEEP_INDEX"] == "1"
    assert json.loads(launched.spec.env["DDPQ_SWEEP_PARAMS"]) == {"i": "1"}


def test_cancelling_a_sweep_stops_its_running_members_and_ends_the_rest(rig: Rig) -> None:
    ids = sweep(rig, 6, max_running=2)
    rig.step()
    with rig.api.write() as s:
        acted = sweep_store.cancel_sweep(s, _sweep_of(rig, ids[0]), rig.clock())
    assert (acted.changed, acted.stopping) == (4, 2)
    rig.step()  # stops sent; the fake ends them with SIGTERM at once
    rig.step()
    assert [rig.job(i).state for i in ids] == [C] * 6
    assert [rig.host.attempt_of(i).stops for i in ids[:2]] == [1, 1]
    assert rig.host.running() == []


def test_a_job_after_a_sweep_starts_once_all_of_it_succeeded(rig: Rig) -> None:
    ids = sweep(rig, 3)
    sweep_id = _sweep_of(rig, ids[0])
    waiter = rig.submit(after_sweeps=(sweep_id,))
    rig.step()
    for i in ids[:2]:
        rig.host.finish(i, 0)
    rig.step()
    assert rig.job(waiter).state is JobState.HELD
    rig.host.finish(ids[2], 0)
    rig.step()  # the last member's end releases the waiter, which starts in that pass
    assert rig.job(waiter).state is R


def test_a_job_after_a_sweep_is_cancelled_when_a_member_fails(rig: Rig) -> None:
    ids = sweep(rig, 3)
    sweep_id = _sweep_of(rig, ids[0])
    waiter = rig.submit(after_sweeps=(sweep_id,))
    rig.step()
    rig.host.finish(ids[1], 3)
    rig.step()
    view = rig.job(waiter)
    assert (
        view.state is C and view.reason == f"dependency sweep {sweep_id}: its job {ids[1]} failed"
    )


def test_every_running_members_progress_is_recorded_in_one_pass(rig: Rig) -> None:
    """Several running jobs with new progress in the same pass (a sweep's members do that
    all the time): all of them recorded. One statement for all; it failed whenever there
    were two or more, so no member of a sweep ever had its final metrics."""
    ids = sweep(rig, 3)
    rig.step()
    for i, job_id in enumerate(ids):
        folder = rig.job(job_id).job_dir
        assert folder is not None
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "test_acc": i}) + "\n")
    rig.clock.advance(5.0)
    rig.step()
    assert [rig.job(i).progress for i in ids] == [{"epoch": 1, "test_acc": i} for i in range(3)]
