"""What the worker's pass knows ahead: each job's estimated remaining GPU-time, for
``srpt-progress`` (``core.scheduler.policy_progress``), and each queued job's predicted
start, written to ``jobs.predicted_start`` (``core.scheduler.forecast``).

Both are made from the store: the newest progress records of each job and the GPU-time of
recently finished jobs (``store.progress``), and the service each job has had
(``store.attempts.attained``). The history is read at most every ``HISTORY_TTL_S``; the
estimates and the forecast are made at most every ``FORECAST_EVERY_S``, the forecast for
the first ``MAX_FORECAST`` jobs in the policy's order, and only the starts that moved are
written: a flood of queued jobs costs most passes nothing, and one every few seconds a
sort and a few queries over the live jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from ddpq.core import scheduler
from ddpq.core.policy import Backfill, Order
from ddpq.core.scheduler.forecast import MAX_FORECAST, Job, plan_forward
from ddpq.core.scheduler.policy_progress import History, Record, Seen, estimates, over_band
from ddpq.store import attempts as attempt_store
from ddpq.store import progress as progress_store
from ddpq.store.db import Session
from ddpq.store.supervision import RunningView

HISTORY_TTL_S = 60.0
FORECAST_EVERY_S = 2.0
# Each is made again no sooner than this many times what it took last (seconds of work
# measured, the worker's clock waited): at most ~1/COST_FACTOR of the worker's time.
COST_FACTOR = 10.0
# A start that moved less than this is not written again (a pass's own jitter).
MOVED_S = 1.0


@dataclass(frozen=True)
class Known:
    """What the store says of the live jobs this pass: records, workloads, service."""

    records: Mapping[int, Sequence[Record]]
    workloads: Mapping[int, str]
    served: Mapping[int, float]

    @classmethod
    def read(cls, s: Session, ids: Sequence[int], now: float) -> Known:
        return cls(
            progress_store.records_of(s, ids),
            progress_store.workloads(s, ids),
            attempt_store.attained(s, ids, now),
        )

    def seen(self, job_id: int, owner: str, gpus: int, running: bool) -> Seen:
        return Seen(
            job_id,
            owner,
            self.workloads.get(job_id, ""),
            gpus,
            self.served.get(job_id, 0.0),
            running,
            tuple(self.records.get(job_id, ())),
        )


class Foresight:
    """The worker's state for the estimates between passes: the history, the last
    forecast written."""

    def __init__(self, timer: Callable[[], float] | None = None) -> None:
        """``timer``: what measures the work (seconds): a worker's clock of its own
        (``worker.loop.Worker``), else the machine's."""
        self._timer = timer or time.perf_counter
        self._history: tuple[float, History] = (float("-inf"), History())
        self._written: dict[int, float | None] = {}
        self._forecast_at = float("-inf")
        self._first = True
        # How long to wait before the next forecast or estimates at least: COST_FACTOR
        # times what the last took, so that a huge queue spends a bounded share on them.
        self._forecast_for = self._ranked_for = 0.0
        # srpt-progress's last estimates: when, and each job's.
        self._ranked: tuple[float, dict[int, float]] = (float("-inf"), {})

    def history(self, s: Session, now: float) -> History:
        read_at, history = self._history
        if now - read_at >= HISTORY_TTL_S:
            history = History()
            for owner, workload, gpu_s in progress_store.finished(s):
                history.add(owner, workload, gpu_s)
            self._history = (now, history)
        return history

    def srpt_order(
        self,
        s: Session,
        order: Order,
        queued: Sequence[scheduler.QueuedJob],
        running: Sequence[tuple[RunningView, int]],
        now: float,
    ) -> Order:
        """``order`` with the owners over their band, and each live job's estimate, made
        again at most every ``FORECAST_EVERY_S`` (or ``COST_FACTOR`` times their cost; a job
        newer than them ranks as one with no estimate until then: ``NO_ESTIMATE_S``)."""
        # The band every pass (a set of owners: cheap), so that a user whose first job
        # arrives between estimates already ranks ahead of one far over the others' use.
        owners = {q.owner for q in queued} | {r.owner for r, _ in running}
        band = over_band(order.usage, owners)
        ranked_at, remaining = self._ranked
        if now - ranked_at < max(FORECAST_EVERY_S, self._ranked_for):
            return replace(order, remaining=remaining, over_band=band)
        t0 = self._timer()
        known = Known.read(s, [q.id for q in queued] + [r.id for r, _ in running], now)
        # ``estimates`` ranks each (owner, workload, service) without records once.
        jobs = [(q.id, q.owner, q.gpus, False) for q in queued]
        jobs += [(r.id, r.owner, gpus, True) for r, gpus in running]
        guesses = estimates((known.seen(*job) for job in jobs), self.history(s, now), now)
        self._ranked_for = COST_FACTOR * (self._timer() - t0)
        self._ranked = (now, guesses)
        return replace(order, remaining=guesses, over_band=band)

    def forecast(
        self,
        s: Session,
        order: Order,
        total_gpus: int,
        queued: Sequence[scheduler.QueuedJob],
        placements: Sequence[scheduler.Placement],
        running: Sequence[tuple[RunningView, int]],
        now: float,
        unknown: Collection[int] = (),
    ) -> None:
        """Every ``FORECAST_EVERY_S``: predict when each job of ``queued`` that this pass
        does not start (``placements``) starts, and write the starts that moved; the jobs
        ``unknown`` (held back by what the forecast does not model) have none."""
        if now - self._forecast_at < max(FORECAST_EVERY_S, self._forecast_for):
            return
        self._forecast_at, t0 = now, self._timer()
        placed = {p.job_id: len(p.gpus) for p in placements}
        starting = [
            (RunningView(q.id, q.owner, now, q.time_limit_s, None, None), placed[q.id])
            for q in queued
            if q.id in placed
        ]
        waiting = sorted((q for q in queued if q.id not in placed), key=order.key)
        head, ahead = waiting[:MAX_FORECAST], [*running, *starting]
        known = Known.read(s, [q.id for q in head] + [r.id for r, _ in ahead], now)
        starts = plan_forward(
            total_gpus,
            [
                Job(known.seen(r.id, r.owner, g, True), r.time_limit_s, r.started_at or now)
                for r, g in ahead
            ],
            [
                Job(known.seen(q.id, q.owner, q.gpus, False), q.time_limit_s, None, q.not_before)
                for q in head
            ],
            self.history(s, now),
            now,
            in_order=order.backfill is Backfill.NONE,
        )
        starts.update(dict.fromkeys((i for i in unknown if i in starts), None))
        # Beyond the head: unknown, written only where a start was written before.
        starts.update({q.id: None for q in waiting[MAX_FORECAST:] if self._written.get(q.id)})
        # The first forecast writes every start it makes (the rows may hold a former
        # worker's); later ones those that moved, or are new and known.
        before, first = self._written, self._first
        moved = {
            i: t
            for i, t in starts.items()
            if first or (_moved(before[i], t) if i in before else t is not None)
        }
        progress_store.set_predicted(s, moved)
        # Only the jobs still waiting are remembered: one that left the queue (its start
        # cleared by the move, ``store.transitions``) is new again when it comes back.
        self._written, self._first = dict(starts), False
        self._forecast_for = COST_FACTOR * (self._timer() - t0)


def _moved(before: float | None, after: float | None) -> bool:
    if before is None or after is None:
        return before is not after
    return abs(before - after) >= MOVED_S
