"""Job states and the transitions allowed between them.

Every state change in ddpq goes through :func:`check_transition`, so a bug that
tries to, say, move a finished job back to running fails loudly instead of
silently rewriting history.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    # How an attempt ends when ddpq preempts it; the job itself goes back to the queue.
    PREEMPTED = "preempted"


TERMINAL: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT}
)
# States in which a job holds leases and (maybe) processes.
ACTIVE: frozenset[JobState] = frozenset({JobState.STARTING, JobState.RUNNING})
# The end of an attempt, never a job's state: the job goes back to the queue.
ATTEMPT_ONLY: frozenset[JobState] = frozenset({JobState.PREEMPTED})
# States in which a job waits for the scheduler.
WAITING: frozenset[JobState] = frozenset({JobState.QUEUED, JobState.HELD})

_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.HELD, JobState.CANCELLED}),
    JobState.HELD: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    # starting -> queued: the launch was interrupted before any process ran.
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}
    ),
    # running -> queued: a retry, or a rendezvous port clash requeued on a new port.
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMED_OUT,
            JobState.QUEUED,
        }
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMED_OUT: frozenset(),
    JobState.PREEMPTED: frozenset(),  # never a job's state, only an attempt's end
}


class InvalidTransition(ValueError):
    pass


def can_transition(old: JobState, new: JobState) -> bool:
    return new in _ALLOWED[old]


def check_transition(old: JobState, new: JobState) -> None:
    if not can_transition(old, new):
        raise InvalidTransition(f"a job cannot go from {old.value} to {new.value}")
