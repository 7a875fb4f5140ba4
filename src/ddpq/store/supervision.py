"""What the worker reads of running jobs every pass, columns only: their times and stop
requests (supervision), and what the preemption and elastic rules weigh."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ddpq.core.states import JobState
from ddpq.store.columns import flushed
from ddpq.store.models import Job


@dataclass(frozen=True)
class RunningView:
    id: int
    owner: str
    started_at: float | None
    time_limit_s: float | None
    stop_request: str | None
    stop_sent_at: float | None
    # For the preemption rule (core.preempt):
    priority: int = 0
    submitted_at: float = 0.0
    preemptible: bool = False
    preemptions: int = 0
    # Elastic (core.scheduler.elastic): its least and most GPUs, and the size a resize
    # asked for is taking it to (None: none asked).
    gpus: int = 0
    gpus_max: int | None = None
    resize_to: int | None = None


def running_for_supervision(
    session: Session, states: Iterable[JobState] = (JobState.RUNNING,)
) -> list[RunningView]:
    """Timing and stop fields of the jobs in ``states``, columns only (read every pass)."""
    found = flushed(session).execute(_SUPERVISED, {"states": list(states)})
    return [RunningView(*tuple(row)) for row in found]


_SUPERVISED = select(  # built once: read twice every pass
    Job.id,
    Job.owner,
    Job.started_at,
    Job.time_limit_s,
    Job.stop_request,
    Job.stop_sent_at,
    Job.priority,
    Job.submitted_at,
    Job.preemptible,
    Job.preemptions,
    Job.gpus,
    Job.gpus_max,
    Job.resize_to,
).where(Job.state.in_(bindparam("states", expanding=True)))
