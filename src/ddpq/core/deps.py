"""Job dependencies (``--after ID``, ``--after SWEEP``): may a job waiting on others start?"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddpq.core.states import TERMINAL, JobState


@dataclass(frozen=True)
class SweepStanding:
    """What a job waiting on a sweep needs to know of it: all of it must succeed."""

    members: int
    succeeded: int
    # The first member (by id) that ended without success, and how it ended.
    failed_member: tuple[int, JobState] | None = None

    @property
    def ready(self) -> bool:
        return self.succeeded == self.members


@dataclass(frozen=True)
class Verdict:
    ready: bool  # every dependency succeeded
    doomed_by: int | None = None  # a dependency that ended without success
    doomed_state: JobState | None = None
    doomed_sweep: int | None = None  # the sweep doomed_by belongs to, when it is one

    def doomed_reason(self) -> str:
        """Why the waiting job is cancelled, in words (only when ``doomed_by`` is set)."""
        state = self.doomed_state.value if self.doomed_state else "ended"
        if self.doomed_sweep is not None:
            return f"dependency sweep {self.doomed_sweep}: its job {self.doomed_by} {state}"
        return f"dependency {self.doomed_by} {state}"


def dependency_verdict(
    deps: Mapping[int, JobState], sweeps: Mapping[int, SweepStanding] | None = None
) -> Verdict:
    """Ready when every job and every member of every sweep succeeded; doomed as soon as
    one of them ended otherwise (jobs are looked at first, then sweeps, each by id)."""
    for dep_id, state in sorted(deps.items()):
        if state in TERMINAL and state is not JobState.SUCCEEDED:
            return Verdict(ready=False, doomed_by=dep_id, doomed_state=state)
    sweeps = sweeps or {}
    for sweep_id, standing in sorted(sweeps.items()):
        if standing.failed_member is not None:
            member, state = standing.failed_member
            return Verdict(False, doomed_by=member, doomed_state=state, doomed_sweep=sweep_id)
    ready = all(s is JobState.SUCCEEDED for s in deps.values())
    return Verdict(ready=ready and all(s.ready for s in sweeps.values()))


def waiting_reason(deps: Iterable[int], user_hold: bool, sweeps: Iterable[int] = ()) -> str:
    parts = []
    if user_hold:
        parts.append("held by user")
    ids = sorted(deps)
    if ids:
        parts.append("waiting for job " + ", ".join(str(i) for i in ids) + " to succeed")
    sweep_ids = sorted(sweeps)
    if sweep_ids:
        parts.append(
            "waiting for every job of sweep " + ", ".join(str(i) for i in sweep_ids) + " to succeed"
        )
    return "; ".join(parts)


RELEASED = "dependencies met, released"


def waiting_place(
    deps: Mapping[int, JobState],
    sweeps: Mapping[int, SweepStanding],
    user_hold: bool,
) -> tuple[JobState, str]:
    """Where a waiting job belongs, with its reason: cancelled (a dependency failed), held
    (a hold, or dependencies to wait for) or queued (``RELEASED``; a job that was queued
    already keeps its own reason)."""
    verdict = dependency_verdict(deps, sweeps)
    if verdict.doomed_by is not None:
        return JobState.CANCELLED, verdict.doomed_reason()
    if user_hold or not verdict.ready:
        pending = [d for d, s in deps.items() if s is not JobState.SUCCEEDED]
        pending_sweeps = [i for i, s in sweeps.items() if not s.ready]
        return JobState.HELD, waiting_reason(pending, user_hold, pending_sweeps)
    return JobState.QUEUED, RELEASED


def settle_change(
    current: JobState, reason: str, place: tuple[JobState, str]
) -> tuple[JobState, str] | None:
    """The state change (with its reason) that moves a waiting job in ``current`` to where
    ``waiting_place`` says it belongs; None when it is there already. A queued job that is
    where it belongs keeps its reason (the planner's: why it waits for GPUs)."""
    state, why = place
    if state is JobState.QUEUED:
        return place if current is JobState.HELD else None
    if state is current and why == reason:
        return None
    return place
