"""The worker's look at the GPUs of running jobs: idle since when, warn, reclaim.

Every few seconds (``core.interactive.sample_every``) it samples the GPUs that running jobs
hold (``worker.gpu_use``), lets ``core.interactive.judge`` decide for each job, and writes
what changed: since when its GPUs are idle (any job: ``ddpq gpus`` and ``/metrics`` show
it), the warning written into an interactive session's terminal, the warning withdrawn when
its GPUs are used again, and, once a session has stayed idle through its limit and the
grace period, a stop (``stop_request = "idle"``) that the worker's stop phase then sends as
it sends a time limit. A look that cannot be had (fake GPUs, NVML failing) judges nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ddpq.config import Settings
from ddpq.core import interactive as rule
from ddpq.core.interactive import GpuUse
from ddpq.core.units import human_duration
from ddpq.executors.base import Executor
from ddpq.store import idle as idle_store
from ddpq.store.db import Database

log = logging.getLogger("ddpq.worker")

Sampler = Callable[[Sequence[int]], dict[int, GpuUse] | None]


class IdleWatch:
    def __init__(self, settings: Settings, executor: Executor, sampler: Sampler) -> None:
        self.settings = settings
        self.executor = executor
        self.sampler = sampler
        self._peaks: dict[int, int] = {}  # job -> the most memory its GPUs held while idle
        self._next_at = float("-inf")

    def look(self, db: Database, now: float) -> None:
        if now < self._next_at:
            return
        with db.read() as s:
            jobs = idle_store.on_gpus(s)
        ids = {j.watch.job_id for j in jobs}
        self._peaks = {i: peak for i, peak in self._peaks.items() if i in ids}
        if not jobs:
            self._next_at = now + rule.SAMPLE_MIN_S  # a job that starts is looked at soon
            return
        sessions = [j.watch.idle_s for j in jobs if j.watch.interactive]
        self._next_at = now + rule.sample_every(sessions)
        uses = self.sampler(sorted({g for j in jobs for g in j.gpus}))
        if not uses:
            return
        grace = self.settings.idle_grace_s
        changed: dict[int, tuple[float | None, float | None]] = {}
        told: list[tuple[int, str, str]] = []  # job, the line for its terminal, its history's
        reclaim: dict[int, str] = {}
        for j in jobs:
            w = j.watch
            if not all(g in uses for g in j.gpus):
                continue
            v = rule.judge(w, [uses[g] for g in j.gpus], self._peaks.get(w.job_id), now, grace)
            self._peaks[w.job_id] = v.peak_mb
            if (v.idle_since, v.warned_at) != (w.idle_since, w.warned_at):
                changed[w.job_id] = (v.idle_since, v.warned_at)
            if v.warn and w.idle_s is not None:
                history = (
                    f"warned in its terminal: its GPUs have been idle for "
                    f"{human_duration(w.idle_s)}; ended in {human_duration(grace)} unless used"
                )
                told.append((w.job_id, rule.warning_text(w.idle_s, grace), history))
            if v.resumed:
                told.append((w.job_id, rule.RESUMED_TEXT, "its GPUs are in use again"))
            if v.reclaim and w.idle_s is not None:
                reclaim[w.job_id] = rule.reclaim_reason(w.idle_s)
        if not (changed or told or reclaim):
            return
        with db.write() as s:
            idle_store.record_idle(s, changed)
            for job_id, _, history in told:
                idle_store.note(s, job_id, history, now)
            stopping = [
                i for i, why in reclaim.items() if idle_store.request_idle_stop(s, i, why, now)
            ]
        for job_id, line, _ in told:
            self.executor.tell(job_id, line)
        for job_id in stopping:
            log.info("job %s: %s; stopping it", job_id, reclaim[job_id])
            self.executor.tell(job_id, f"ddpq: ending the session ({reclaim[job_id]})")
