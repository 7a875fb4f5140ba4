"""The worker's stop phase: cancels, time limits and preemptions sent to running jobs.

Each stop is sent once, when it is recorded (``stop_sent_at``); the executor turns it into
a kill after the grace period, and past that ends by force an attempt whose shim has not
(one its job stopped or hung). After a restart that deadline is gone with the old
process, so the stops already sent are sent again to the jobs adopted (``resend``): a
second signal changes nothing for a shim that heard the first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

from ddpq.core.rules import StopRequest, stop_due
from ddpq.executors.base import Executor
from ddpq.store import attempts as attempt_store
from ddpq.store import supervision
from ddpq.store.db import Database

log = logging.getLogger("ddpq.worker")


class Stopping:
    def __init__(
        self, db: Database, executor: Callable[[], Executor], clock: Callable[[], float]
    ) -> None:
        """``executor``: the worker's, asked at each use (a test may swap it)."""
        self.db = db
        self.executor = executor
        self.clock = clock
        # Stops sent whose sending could not be recorded yet (a full disk): not sent again.
        self._unrecorded: dict[int, StopRequest] = {}

    def enforce(self, waiting: Container[int]) -> None:
        """Cancels asked for through the API, and time limits: signal each job once.
        ``waiting``: started jobs still waiting in a cluster's queue (no time limit yet)."""
        now = self.clock()
        with self.db.read() as s:
            running = supervision.running_for_supervision(s)
        due = []
        for j in running:
            asked = StopRequest(j.stop_request) if j.stop_request else None
            limit = None if j.id in waiting else j.time_limit_s
            why = stop_due(asked, j.stop_sent_at, j.started_at, limit, now)
            if why is not None:
                due.append((j.id, why))
        if not due:
            return
        try:
            with self.db.write() as s:
                sent = [(i, why) for i, why in due if attempt_store.mark_stop_sent(s, i, why, now)]
        except Exception:
            # Not recorded (a full disk, say): the stop is sent all the same, once; it is
            # recorded by a later pass, which does not send it again.
            for job_id, why in due:
                if job_id not in self._unrecorded:
                    self._unrecorded[job_id] = why
                    self.send(job_id, why)
            raise
        for job_id, why in sent:
            if self._unrecorded.pop(job_id, None) is None:
                self.send(job_id, why)
        for job_id, _ in due:
            self._unrecorded.pop(job_id, None)  # recorded, or the job is not running

    def resend(self, adopted: Container[int]) -> None:
        """The stops recorded as sent before this process started, sent again to those of
        the ``adopted`` jobs that still run."""
        with self.db.read() as s:
            stopping = [j for j in supervision.running_for_supervision(s) if j.stop_sent_at]
        for j in stopping:
            if j.id in adopted:
                self.send(j.id, StopRequest(j.stop_request or StopRequest.CANCEL))

    def send(self, job_id: int, why: StopRequest) -> None:
        preempt = why is StopRequest.PREEMPT
        if self.executor().stop(job_id, preempt=preempt):
            log.info(
                "job %s: %s, %s", job_id, why.value, "preempting it" if preempt else "stopping it"
            )

    def forget(self, job_id: int) -> None:
        """The job has ended: nothing of its stop is kept."""
        self._unrecorded.pop(job_id, None)
