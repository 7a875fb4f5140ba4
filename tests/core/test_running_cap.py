"""The daemon's cap on one user's running jobs (``max_running_per_user``) as the
``running_cap`` gate: those placed in the same pass count, the reason names the cap, and
an admin's ``--jobs`` figure (the user's own or the default) replaces it."""

from __future__ import annotations

import pytest

from ddpq.config import Settings
from ddpq.core.limits import EVERYONE, NO_LIMITS, Limit, Limits
from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler.gates import running_cap
from ddpq.core.scheduler.model import QueuedJob, RunningJob, World
from ddpq.core.scheduler.pipeline import decide
from ddpq.core.scheduler.state import Pass

NOW = 1_000.0


def q(jid: int, owner: str = "alice", gpus: int = 0) -> QueuedJob:
    return QueuedJob(jid, owner, gpus, 0, float(jid))


def held(n: int, owner: str = "alice") -> list[RunningJob]:
    return [RunningJob(100 + i, (), NOW - 1, None, owner) for i in range(n)]


def world(cap: int, running: list[RunningJob], limits: Limits = NO_LIMITS) -> World:
    return World([0, 1], running, list(range(29600, 29610)), NOW, limits=limits, running_cap=cap)


def test_the_defaults_a_lab_would_accept() -> None:
    s = Settings()
    assert s.max_running_per_user == 1000
    assert s.max_queued_per_user == 10_000
    assert World([], [], [], NOW).running_cap == 0  # the pure core caps nothing unless told


@pytest.mark.parametrize(
    ("cap", "runs", "said"),
    [
        (0, 50, None),  # no cap
        (8, 7, None),
        (8, 8, "alice runs 8 jobs, the cap per user"),
        (8, 9, "alice runs 9 jobs, the cap per user"),  # lowered while they ran
        (1, 1, "alice runs 1 job, the cap per user"),
    ],
)
def test_the_gate_says_the_cap(cap: int, runs: int, said: str | None) -> None:
    assert running_cap(q(1), Pass(world(cap, held(runs)))) == said


def test_only_the_owners_own_jobs_count() -> None:
    assert running_cap(q(1, "alice"), Pass(world(2, held(5, "bob")))) is None


@pytest.mark.parametrize(
    "limits",
    [
        Limits({"alice": Limit(jobs=20)}),  # her own figure, larger than the cap
        Limits(default=Limit(jobs=20)),  # the admin's default for everyone
    ],
)
def test_an_admins_jobs_limit_replaces_the_cap(limits: Limits) -> None:
    assert running_cap(q(1), Pass(world(2, held(5), limits))) is None


def test_a_gpu_only_limit_leaves_the_cap_in_force() -> None:
    limits = Limits({"alice": Limit(gpus=4), EVERYONE: Limit(gpus=8)})
    assert running_cap(q(1), Pass(world(2, held(2), limits))) is not None


def test_jobs_placed_in_the_pass_count_and_the_rest_wait_saying_so() -> None:
    queued = [q(i) for i in range(1, 6)] + [q(9, "bob")]
    plan = decide(queued, world(3, held(1)), Order(Policy.FIFO, {}))
    assert sorted(p.job_id for p in plan.placements) == [1, 2, 9]
    for waiting in (3, 4, 5):
        assert plan.reasons[waiting] == "alice runs 3 jobs, the cap per user"
        assert plan.stopped_by[waiting] == "running_cap"
