"""Ports go only to jobs that rendezvous, and no owner may hold more than their share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ddpq.core.scheduler import PortBudget, QueuedJob, RunningJob, needs_port, plan, plan_explained


def q(i: int, owner: str = "a", gpus: int = 0, port: bool = True) -> QueuedJob:
    return QueuedJob(i, owner, gpus, 0, float(i), needs_port=port)


def test_which_jobs_need_a_port() -> None:
    assert needs_port(1, "plain") and needs_port(0, "torchrun") and needs_port(2, "torchrun")
    assert not needs_port(0, "plain")


def test_cpu_jobs_start_without_ports_while_gpu_jobs_keep_them() -> None:
    queued = [q(i, port=False) for i in range(1, 51)] + [q(51, gpus=1)]
    placed = plan(queued, [0], [], [29600], {}, 0.0)
    assert len(placed) == 51
    assert [p.port for p in placed if p.job_id != 51] == [None] * 50
    assert next(p.port for p in placed if p.job_id == 51) == 29600


def test_no_free_port_blocks_only_the_jobs_that_need_one() -> None:
    placed = plan([q(1, gpus=1), q(2, port=False)], [0, 1], [], [], {}, 0.0)
    assert [p.job_id for p in placed] == [2]
    why = plan_explained([q(1, gpus=1), q(2, port=False)], [0, 1], [], [], {}, 0.0).reasons
    assert why == {1: "waiting for a free rendezvous port"}


def test_an_owner_over_the_port_budget_waits_and_others_go_ahead() -> None:
    budget = PortBudget(per_owner=2, held={"a": 1})
    queued = [q(1, "a", 1), q(2, "a", 1), q(3, "a", 1), q(4, "b", 1)]
    placed = plan(queued, [0, 1, 2, 3], [], [1, 2, 3, 4], {}, 0.0, budget)
    assert sorted(p.job_id for p in placed) == [1, 4]
    why = plan_explained(queued, [0, 1, 2, 3], [], [1, 2, 3, 4], {}, 0.0, budget).reasons
    assert "the most one user may hold" in why[2] and "the most one user may hold" in why[3]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.booleans()),
        max_size=40,
    ),
    st.integers(1, 5),
    st.integers(0, 12),
)
def test_ports_are_never_shared_nor_over_budget(
    jobs: list[tuple[str, int, bool]], per_owner: int, nports: int
) -> None:
    queued = [q(i + 1, owner, gpus, port or gpus > 0) for i, (owner, gpus, port) in enumerate(jobs)]
    running = [RunningJob(999, (0,), 0.0, None)]
    placed = plan(
        queued, range(8), running, list(range(nports)), {}, 0.0, PortBudget(per_owner, {})
    )
    ports = [p.port for p in placed if p.port is not None]
    assert len(ports) == len(set(ports))
    by_id = {j.id: j for j in queued}
    for p in placed:
        assert (p.port is not None) == by_id[p.job_id].needs_port
    for owner in "abc":
        assert (
            sum(1 for p in placed if p.port is not None and by_id[p.job_id].owner == owner)
            <= per_owner
        )
