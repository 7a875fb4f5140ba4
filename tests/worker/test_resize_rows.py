"""Which running rows the worker treats as resizable elastic jobs (worker/resize.py)."""

from __future__ import annotations

from ddpq.core.limits import Limit, Limits
from ddpq.store.supervision import RunningView
from ddpq.worker.resize import least, owner_room, resizable


def row(job_id: int, *, gpus_max: int | None, preemptible: bool) -> RunningView:
    return RunningView(
        job_id, "ann", 0.0, None, None, None, preemptible=preemptible, gpus=2, gpus_max=gpus_max
    )


def test_only_preemptible_elastic_jobs_are_lenders_or_resized() -> None:
    # A shrink counted on a job the preemption signal never reaches would never come, and
    # the job waiting for it would wait every pass.
    active = [
        row(1, gpus_max=4, preemptible=True),
        row(2, gpus_max=4, preemptible=False),
        row(3, gpus_max=None, preemptible=True),
    ]
    held = {1: ([0, 1, 2], None), 2: ([3, 4, 5], None), 3: ([6], None)}
    assert least(active) == {1: 2}
    assert [(r.id, r.held) for r in resizable(active, held, 100.0)] == [(1, 3)]


def test_an_owners_room_counts_a_shared_gpu_once() -> None:
    active = [row(1, gpus_max=4, preemptible=True), row(2, gpus_max=None, preemptible=True)]
    held = {1: ([0, 1], None), 2: ([1], None)}  # job 2 shares GPU 1 by memory
    limits = Limits({"ann": Limit(gpus=4)})
    assert owner_room(limits, active, held) == {"ann": 2}
