"""Idle reclaim in process: the worker looks at the GPUs of running jobs (a sampler the test
controls), warns an idle session in its terminal, ends it as ``idle`` after the grace, and
leaves batch jobs running whatever their GPUs do (it only says since when they are idle)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ddpq.core.interactive import GpuUse
from ddpq.core.rules import StopRequest
from ddpq.core.states import JobState
from ddpq.store import idle as idle_store
from ddpq.store import jobs as job_store
from tests.worker.rig import Rig, make_rig

IDLE_S, GRACE_S = 60.0, 30.0


class Gpus:
    """What the sampler finds: each GPU's utilisation and memory, as the test sets them."""

    def __init__(self) -> None:
        self.util: dict[int, int | None] = {}
        self.memory: dict[int, int] = {}
        self.failing = False
        self.asked: list[list[int]] = []

    def __call__(self, indices: Sequence[int]) -> dict[int, GpuUse] | None:
        self.asked.append(list(indices))
        if self.failing:
            return None
        return {i: GpuUse(self.util.get(i, 0), self.memory.get(i, 0)) for i in indices}


@pytest.fixture
def gpus() -> Gpus:
    return Gpus()


@pytest.fixture
def rig(tmp_path: Path, gpus: Gpus) -> Iterator[Rig]:
    r = make_rig(tmp_path / "home", gpu_use=gpus, idle_grace_s=GRACE_S)
    yield r
    r.close()


def session(rig: Rig, idle_s: float | None = IDLE_S, gpus: int = 1) -> int:
    return rig.submit(interactive=True, idle_s=idle_s, gpus=gpus, command=["bash"])


def wait(rig: Rig, seconds: float, step: float = 5.0) -> None:
    """Let ``seconds`` pass in looks ``step`` apart (the sampler's cadence is 1-5 s)."""
    t = 0.0
    while t < seconds:
        rig.clock.advance(step)
        rig.step()
        t += step


def told(rig: Rig, job: int) -> list[str]:
    return rig.host.attempt_of(job).told


def test_an_idle_session_is_warned_then_ended_as_idle_with_its_gpu_time_kept(
    rig: Rig, gpus: Gpus
) -> None:
    job = session(rig)
    rig.step()
    assert rig.job(job).state is JobState.RUNNING
    assert rig.host.attempt_of(job).launch.spec.interactive
    wait(rig, IDLE_S - 5)
    assert told(rig, job) == [] and rig.job(job).stop_request is None
    wait(rig, 10)
    (warning,) = told(rig, job)
    assert "idle for 1m00s" in warning and "ended in 30s" in warning
    wait(rig, GRACE_S - 10)
    assert rig.job(job).stop_request is None  # still within the grace
    wait(rig, 15)
    view = rig.job(job)
    assert view.state is JobState.TIMED_OUT
    assert view.reason.startswith("idle: its GPUs were unused for 1m00s (SIGTERM")
    assert view.attempts[0][1] is JobState.TIMED_OUT
    assert told(rig, job)[-1] == "ddpq: ending the session (idle: its GPUs were unused for 1m00s)"
    history = [why for _, _, why in view.events]
    assert any(h.startswith("warned in its terminal") for h in history)
    assert "idle: its GPUs were unused for 1m00s; stopping it" in history
    with rig.api.read() as s:
        ended = job_store.get_job(s, job)
        assert ended.stop_request == StopRequest.IDLE.value
        assert idle_store.reclaimed(s) == 1
        (attempt,) = job_store.attempts_of(s, job)
    # Its GPU-seconds are those of any attempt: from its start to its end.
    assert (
        attempt.ended_at is not None and attempt.ended_at - attempt.started_at >= IDLE_S + GRACE_S
    )
    assert view.gpus == []  # its GPU is free again


def test_a_session_whose_gpus_compute_is_never_reclaimed(rig: Rig, gpus: Gpus) -> None:
    job = session(rig)
    gpus.util[0] = 35
    rig.step()
    wait(rig, 10 * (IDLE_S + GRACE_S))
    view = rig.job(job)
    assert view.state is JobState.RUNNING and view.stop_request is None
    assert told(rig, job) == []
    assert gpus.asked  # it was looked at, all along


@pytest.mark.parametrize("unknown", ["utilisation", "sampler"])
def test_what_cannot_be_known_never_reclaims(rig: Rig, gpus: Gpus, unknown: str) -> None:
    job = session(rig)
    if unknown == "utilisation":
        gpus.util[0] = None  # NVML: not supported on this GPU
    else:
        gpus.failing = True  # NVML fails, or fake GPUs
    rig.step()
    wait(rig, 3 * (IDLE_S + GRACE_S))
    assert rig.job(job).state is JobState.RUNNING and told(rig, job) == []


def test_use_during_the_grace_withdraws_the_warning_and_the_clock_starts_again(
    rig: Rig, gpus: Gpus
) -> None:
    job = session(rig)
    rig.step()
    wait(rig, IDLE_S + 5)
    assert len(told(rig, job)) == 1
    gpus.util[0] = 3
    wait(rig, 5)
    assert told(rig, job)[-1] == "ddpq: its GPUs are in use again; the session goes on"
    with rig.api.read() as s:
        row = job_store.get_job(s, job)
        assert (row.idle_since, row.idle_warned_at) == (None, None)
    gpus.util[0] = 0
    wait(rig, IDLE_S - 5)
    assert len(told(rig, job)) == 2 and rig.job(job).state is JobState.RUNNING
    wait(rig, 10 + GRACE_S + 5)
    assert rig.job(job).state is JobState.TIMED_OUT


def test_memory_growth_counts_as_use_and_steady_memory_does_not(rig: Rig, gpus: Gpus) -> None:
    job = session(rig)
    gpus.memory[0] = 2000  # a model loaded, then nothing runs on it
    rig.step()
    wait(rig, IDLE_S - 10)
    gpus.memory[0] = 6000  # more of it loaded: in use again
    wait(rig, IDLE_S - 10)
    assert told(rig, job) == []
    gpus.memory[0] = 5000  # freed some: not use
    wait(rig, 20)
    assert len(told(rig, job)) == 1


def test_a_batch_job_is_never_reclaimed_but_its_idle_gpus_are_shown(rig: Rig, gpus: Gpus) -> None:
    job = rig.submit(gpus=1, command=["python", "train.py"])
    rig.step()
    started = rig.clock()
    wait(rig, 100 * IDLE_S, step=60.0)
    view = rig.job(job)
    assert view.state is JobState.RUNNING and view.stop_request is None
    with rig.api.read() as s:
        idle = idle_store.idle_now(s)
    assert idle[job].idle_since - started <= 60.0 and not idle[job].interactive
    assert idle[job].gpus == 1
    gpus.util[0] = 90
    wait(rig, 5)
    with rig.api.read() as s:
        assert idle_store.idle_now(s) == {}


def test_a_session_without_a_limit_is_shown_idle_and_never_ended(rig: Rig, gpus: Gpus) -> None:
    job = session(rig, idle_s=None)
    rig.step()
    wait(rig, 50 * IDLE_S, step=60.0)
    assert rig.job(job).state is JobState.RUNNING and told(rig, job) == []
    with rig.api.read() as s:
        assert job in idle_store.idle_now(s)


def test_all_of_a_sessions_gpus_must_be_idle(rig: Rig, gpus: Gpus) -> None:
    job = session(rig, gpus=2)
    gpus.util[1] = 50
    rig.step()
    wait(rig, 3 * (IDLE_S + GRACE_S))
    assert rig.job(job).state is JobState.RUNNING
    assert sorted(gpus.asked[-1]) == [0, 1]


def test_a_cancel_during_the_grace_wins_and_is_not_counted_as_idle(rig: Rig) -> None:
    job = session(rig)
    rig.step()
    wait(rig, IDLE_S + 5)
    rig.cancel(job)
    wait(rig, GRACE_S + 10)
    view = rig.job(job)
    assert view.state is JobState.CANCELLED
    with rig.api.read() as s:
        assert idle_store.reclaimed(s) == 0


def test_a_restarted_worker_keeps_the_idle_clock(rig: Rig) -> None:
    job = session(rig)
    rig.step()
    wait(rig, IDLE_S + 5)  # warned
    rig.restart()
    wait(rig, GRACE_S + 5)
    view = rig.job(job)
    assert view.state is JobState.TIMED_OUT and view.reason.startswith("idle:")
