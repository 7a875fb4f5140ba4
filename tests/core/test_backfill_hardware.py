"""Backfill protects a head that waits for particular GPUs (a link class, a GPU type) as it
protects one that waits for a count: by when the GPUs it can take come back."""

from __future__ import annotations

from ddpq.core.policy import Order, Policy
from ddpq.core.scheduler import Plan, QueuedJob, RunningJob, World, decide
from ddpq.core.topology import Hardware

NOW = 1000.0
EASY = Order(Policy.FAIRSHARE, {})  # fairshare backfills EASY


def pairs4() -> Hardware:
    """Four GPUs: NVLink pairs 0-1 and 2-3, the rest across sockets."""
    return Hardware({(0, 1): "NV12", (2, 3): "NV12"}, "SYS", {}, {})


def job(i: int, gpus: int, limit: float | None = None, **kw: object) -> QueuedJob:
    return QueuedJob(i, "ann", gpus, 0, float(i), time_limit_s=limit, **kw)  # type: ignore[arg-type]


def decided(queued: list[QueuedJob], running: list[RunningJob], order: Order = EASY) -> Plan:
    world = World(range(4), running, list(range(29500, 29510)), NOW, hardware=pairs4())
    return decide(queued, world, order)


# GPU 0 is busy for 100 s more, GPU 2 with no end: a linked pair (0-1) is 100 s away, and the
# free GPUs 1 and 3 are not linked to each other.
RUNNING = [RunningJob(90, (0,), NOW - 10, time_limit_s=110), RunningJob(91, (2,), NOW - 10)]


def test_a_long_job_does_not_take_the_gpu_a_linked_head_waits_for() -> None:
    plan = decided([job(1, 2, gpu_link="NV"), job(2, 1, limit=3600)], RUNNING)
    assert plan.placements == []
    assert plan.stopped_by[1] == "hardware"  # told what it waits for in its own words
    assert "linked by NVLink" in plan.reasons[1]
    assert plan.stopped_by[2] == "backfill"


def test_a_job_that_ends_before_the_linked_gpus_come_back_still_backfills() -> None:
    plan = decided([job(1, 2, gpu_link="NV"), job(2, 1, limit=60)], RUNNING)
    assert [p.job_id for p in plan.placements] == [2]


def test_without_the_requirement_the_head_takes_what_is_free() -> None:
    plan = decided([job(1, 2), job(2, 1, limit=3600)], RUNNING)
    assert [(p.job_id, p.gpus) for p in plan.placements] == [(1, (1, 3))]


def test_a_linked_head_that_can_never_be_bounded_lets_only_gpu_free_jobs_pass() -> None:
    # Neither pair comes back by a known time: no GPU job backfills past it.
    forever = [RunningJob(90, (0,), NOW - 10), RunningJob(91, (2,), NOW - 10)]
    plan = decided([job(1, 2, gpu_link="NV"), job(2, 1, limit=60), job(3, 0)], forever)
    assert [p.job_id for p in plan.placements] == [3]


def test_under_fifo_a_linked_head_stops_the_queue() -> None:
    plan = decided([job(1, 2, gpu_link="NV"), job(2, 1, limit=60)], RUNNING, Order(Policy.FIFO, {}))
    assert plan.placements == []
