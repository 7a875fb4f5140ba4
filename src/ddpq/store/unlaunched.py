"""Attempts whose job never ran (a launch that failed, was cut short or was put off):
their leases freed, the job requeued or finished."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ddpq.core.disposition import after_interrupted_launch, after_put_off_launch
from ddpq.core.rules import StopRequest
from ddpq.core.states import JobState
from ddpq.store import jobs as job_store
from ddpq.store import leases as lease_store
from ddpq.store import settling, transitions


def still_starting(session: Session, job_id: int, attempt: int) -> bool:
    """Whether ``attempt`` of the job is still the one starting: not yet recorded."""
    job = job_store.get_job(session, job_id)
    return job.state is JobState.STARTING and job.attempt == attempt


def end_unlaunched(session: Session, job_id: int, state: JobState, reason: str, now: float) -> None:
    """End an attempt whose job never ran: free its leases; requeue or finish the job."""
    job = job_store.get_job(session, job_id)
    job_store.end_attempt(
        session, job, exit_code=None, exit_signal=None, state=state, reason=reason, now=now
    )
    lease_store.release(session, job.id, now)
    if state is JobState.QUEUED:
        transitions.move_job(session, job, state, reason, now)
    else:
        settling.finish(session, job, state, reason, now)


def requeue_unlaunched(
    session: Session, job_id: int, reason: str, now: float, *, put_off: bool = False
) -> None:
    """A launch that did not run the job, back to the queue: cut short (the worker went
    away; at most MAX_RELAUNCHES times) or put off (no room; PUT_OFF_S later). A job
    cancelled meanwhile ends cancelled: a cancel is never undone by a restart."""
    job = job_store.get_job(session, job_id)
    stop = StopRequest(job.stop_request) if job.stop_request else None
    if put_off:
        then = after_put_off_launch(stop, reason, now)
        job.not_before = then.not_before
        reason = then.job_reason
    else:
        then = after_interrupted_launch(stop, job.relaunches)
        job.relaunches += then.relaunch
    requeued = then.job_state is JobState.QUEUED
    end_unlaunched(session, job_id, then.job_state, reason if requeued else then.job_reason, now)
