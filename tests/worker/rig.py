"""An in-process worker on a real SQLite file, with the fake executor and a hand-moved clock.

Nothing here starts a process: the tests say when each attempt ends (``rig.host``), move
the clock (``rig.clock``), run single passes (``rig.step()``) and read the store back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpq.config import Settings
from ddpq.core.gpus import Gpu
from ddpq.core.spec import JobSpec
from ddpq.core.states import JobState
from ddpq.executors.fake import FakeExecutor, FakeHost
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store.db import Database
from ddpq.worker.idle import Sampler
from ddpq.worker.loop import Worker
from tests.template_db import migrated


class Clock:
    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += seconds


@dataclass(frozen=True)
class JobView:
    """A job as the store has it, with its attempts, events and live leases."""

    id: int
    state: JobState
    reason: str
    attempt: int
    port_retries: int
    not_before: float | None
    stop_request: str | None
    job_dir: str | None
    progress: dict[str, Any] | None
    attempts: list[tuple[int, JobState | None, str, str | None]]  # number, state, reason, handle
    events: list[tuple[JobState | None, JobState, str]]
    gpus: list[int]
    port: int | None


@dataclass
class Rig:
    settings: Settings
    clock: Clock
    host: FakeHost
    api: Database  # the API's side of the database: submissions, cancels
    worker: Worker
    retired: list[Worker] = field(default_factory=list)
    look: Callable[[], list[Gpu]] | None = None  # the GPUs as NVML would show them
    gpu_use: Sampler | None = None  # what the worker's look at the GPUs' use finds

    def submit(self, **kw: Any) -> int:
        fields: dict[str, Any] = {
            "name": "j",
            "owner": "alice",
            "command": ["true"],
            "cwd": "/",
            "gpus": 1,
        }
        fields.update(kw)
        with self.api.write() as s:
            return job_store.create_job(s, JobSpec(**fields), self.clock()).id

    def cancel(self, job_id: int) -> None:
        with self.api.write() as s:
            job_store.cancel(s, job_store.get_job(s, job_id), self.clock())

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.worker.step()

    def job(self, job_id: int) -> JobView:
        with self.api.read() as s:
            j = job_store.get_job(s, job_id)
            leases = lease_store.by_job(lease_store.live(s, [job_id])).get(job_id, ([], None))
            return JobView(
                id=j.id,
                state=j.state,
                reason=j.reason,
                attempt=j.attempt,
                port_retries=j.port_retries,
                not_before=j.not_before,
                stop_request=j.stop_request,
                job_dir=j.job_dir,
                progress=j.progress,
                attempts=[
                    (a.number, a.state, a.reason, a.handle)
                    for a in job_store.attempts_of(s, job_id)
                ],
                events=[(e.from_state, e.to_state, e.reason) for e in job_store.events_of(s, j.id)],
                gpus=sorted(leases[0]),
                port=leases[1],
            )

    def restart(self) -> Worker:
        """The worker dies (its executor with it) and a new one starts on the same host:
        the attempts it started keep "running" there."""
        self.worker.close()
        self.retired.append(self.worker)
        self.worker = new_worker(self.settings, self.host, self.clock, self.look, self.gpu_use)
        return self.worker

    def close(self) -> None:
        self.worker.close()
        self.api.dispose()


def new_worker(
    settings: Settings,
    host: FakeHost,
    clock: Clock,
    look: Callable[[], list[Gpu]] | None = None,
    gpu_use: Sampler | None = None,
) -> Worker:
    worker = Worker(
        settings, FakeExecutor(host), clock=clock, listen=False, look=look, gpu_use=gpu_use
    )
    worker.scheduler.ports.port_free = lambda port: True  # no real sockets: a pure pass
    worker.reconcile()
    return worker


def make_rig(
    home: Path,
    look: Callable[[], list[Gpu]] | None = None,
    gpu_use: Sampler | None = None,
    **settings: Any,
) -> Rig:
    options: dict[str, Any] = {
        "home": home,
        "fake_gpus": 2,
        "grace_s": 1.0,
        "port_range": (29600, 29609),
    }
    options.update(settings)
    cfg = Settings(**options)
    migrated(cfg.db_path)
    clock = Clock()
    host = FakeHost(clock=clock)
    worker = new_worker(cfg, host, clock, look, gpu_use)
    return Rig(cfg, clock, host, Database(cfg.db_path), worker, look=look, gpu_use=gpu_use)
