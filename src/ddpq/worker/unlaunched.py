"""Launches that failed, kept until their recording has committed.

The worker records them in the transaction after the launches; one that rolls back (a full
disk) would otherwise leave their jobs starting, holding their leases, for good: nothing
watches a job the executor never started. Kept, they are recorded by the next
transaction that commits, the next pass's first.
"""

from __future__ import annotations

from ddpq.core.disposition import INTERRUPTED, PUT_OFF_S
from ddpq.core.states import JobState
from ddpq.core.untrusted import clean_text
from ddpq.executors.base import LaunchFailed
from ddpq.store import unlaunched as unlaunched_store
from ddpq.store.db import Session


class Unlaunched:
    def __init__(self) -> None:
        self.pending: list[tuple[int, int, LaunchFailed]] = []  # job, attempt, why
        # After a launch put off for a full disk, no job is launched for PUT_OFF_S: each
        # pass would otherwise lease the GPUs to the next job of a long queue, fail its
        # launch and requeue it, everyone's jobs waiting behind a queue of doomed launches.
        self.paused_until = 0.0

    def add(self, job_id: int, attempt: int, why: LaunchFailed) -> None:
        self.pending.append((job_id, attempt, why))

    def record(self, s: Session, now: float) -> None:
        """Each, in ``s``: queued again if nothing of it ran, else failed."""
        for job_id, attempt, why in self.pending:
            if not unlaunched_store.still_starting(s, job_id, attempt):
                # Recorded already: by a commit that then failed to sync (LogNotSynced is
                # raised after it), whose pass the next one takes up again.
                continue
            reason = clean_text(str(why), 1000)
            if why.put_off:  # no room for it on the host: it waits, no retry used
                unlaunched_store.requeue_unlaunched(s, job_id, reason, now, put_off=True)
                self.paused_until = max(self.paused_until, now + PUT_OFF_S)
            elif why.interrupted:  # nothing of it ran: queued again, no retry used
                unlaunched_store.requeue_unlaunched(s, job_id, f"{INTERRUPTED} ({reason})", now)
            else:
                unlaunched_store.end_unlaunched(s, job_id, JobState.FAILED, reason, now)

    def committed(self) -> None:
        self.pending.clear()
