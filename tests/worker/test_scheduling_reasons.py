"""The reasons the worker writes come from the pass that decided (one derivation): what a
job's own pass used up is said in that pass, and who holds the ports is named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpq.core.states import JobState
from ddpq.portholders import Holder
from tests.worker.rig import Rig, make_rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", fake_gpus=4)  # 10 ports: 2 per user
    yield r
    r.close()


def test_a_port_budget_spent_in_the_pass_is_the_reason_at_once(rig: Rig) -> None:
    assert rig.settings.ports_per_user == 2
    jobs = [rig.submit() for _ in range(3)]
    big = rig.submit(owner="bob", gpus=4)
    rig.step()
    assert [rig.job(j).state for j in jobs[:2]] == [JobState.RUNNING] * 2
    third = rig.job(jobs[2])
    assert third.state is JobState.QUEUED
    assert third.reason == "alice holds 2 rendezvous ports, the most one user may hold at once"
    assert rig.job(big).reason == "waiting for 4 free GPUs (next in line)"


def test_a_job_whose_port_is_busy_is_told_who_holds_it(rig: Rig) -> None:
    rig.worker.scheduler.ports.port_free = lambda port: False  # every test-bind fails
    rig.worker.scheduler.ports.look = lambda ports: {
        p: [Holder(port=p, uid=0, listening=True, pid=42, comm="nginx")] for p in ports
    }
    job = rig.submit()
    behind = rig.submit(gpus=0, launcher="torchrun")
    rig.step()  # placed, but every port fails its test-bind: they cool down
    rig.clock.advance(1.0)
    rig.step()  # no port is left to plan with: the port gate stops them
    for j in (job, behind):
        view = rig.job(j)
        assert view.state is JobState.QUEUED
        assert view.reason.startswith("no free rendezvous port: "), view.reason
        assert "nginx" in view.reason, view.reason
