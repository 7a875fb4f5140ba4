"""The queue as one screen shows it (``GET /v1/queue``, what ``ddpq ls`` draws)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ddpq.core.states import JobState
from ddpq.schemas.jobs import JobOut
from ddpq.schemas.sweeps import SweepOut


class HiddenOut(BaseModel):
    owner: str
    counts: dict[JobState, int] = Field(description="their matching jobs not shown, by state")


class QueueView(BaseModel):
    """At most ``limit`` jobs and ``limit`` sweeps, oldest first, and counts of the rest.
    When the whole listing would pass ``limit`` rows and no user was asked for, only the
    caller's own rows are listed (``only_owner``) and everyone else's jobs are counted."""

    jobs: list[JobOut] = Field(description="one row each: not in a sweep, or every job if expanded")
    sweeps: list[SweepOut] = Field(description="each sweep with a matching job, as one row")
    total: int = Field(description="matching jobs, shown or not")
    only_owner: str | None = Field(description="only this owner's rows are listed")
    hidden: list[HiddenOut] = Field(description="matching jobs in no row or sweep shown")
    limit: int
