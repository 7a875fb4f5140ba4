"""Job dependencies (``--after``, ``--dependency``): may a job waiting on others start?

Each job or sweep a job waits on has a kind, as Slurm's ``--dependency`` has them
(``afterok``: it succeeded, ``afterany``: it ended, ``afternotok``: it ended without
success; ``--after`` is ``afterok``), and a ``singleton`` job waits until every earlier
job of its owner with its name has ended. A dependency that can never be met (``afterok``
on a failed or cancelled job, ``afternotok`` on one that succeeded) ends the waiting job
``cancelled`` with that reason (Slurm's ``kill_invalid_depend``, not its
``DependencyNeverSatisfied`` wait): a held job nobody could ever release would only sit in
the queue. The reasons a held job shows (``ddpq ls`` REASON, ``ddpq show``) are the words
of ``waiting_place``: this module is the dependency gate; jobs it keeps ``held`` never reach
the planner's gates (``core.scheduler.gates``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from ddpq.core.states import TERMINAL, JobState


class Kind(StrEnum):
    OK = "afterok"
    ANY = "afterany"
    NOTOK = "afternotok"


# What a job waiting on another of each kind waits for, in a reason's words.
_WAITS_TO = {Kind.OK: "succeed", Kind.ANY: "end", Kind.NOTOK: "end without success"}


@dataclass(frozen=True)
class SweepStanding:
    """What a job waiting on a sweep needs to know of it: how many members, how many
    succeeded, how many ended (``afterany``, ``afternotok``)."""

    members: int
    succeeded: int
    # The first member (by id) that ended without success, and how it ended.
    failed_member: tuple[int, JobState] | None = None
    ended: int = 0

    @property
    def ready(self) -> bool:
        return self.succeeded == self.members


def job_met(kind: Kind, state: JobState) -> bool | None:
    """True: the dependency is met; False: it never will be; None: not yet."""
    if state not in TERMINAL:
        return None
    succeeded = state is JobState.SUCCEEDED
    if kind is Kind.OK:
        return succeeded
    return True if kind is Kind.ANY else not succeeded


def sweep_met(kind: Kind, standing: SweepStanding) -> bool | None:
    """``job_met`` for a sweep: afterok needs every member to succeed (one failure dooms
    it at once); afterany every member ended; afternotok every member ended, one of them
    without success."""
    if kind is Kind.OK:
        return False if standing.failed_member is not None else (standing.ready or None)
    if standing.ended < standing.members:
        return None
    return True if kind is Kind.ANY else standing.succeeded < standing.members


@dataclass(frozen=True)
class Verdict:
    ready: bool  # every dependency met
    doomed_by: int | None = None  # a dependency that can never be met
    doomed_state: JobState | None = None
    doomed_sweep: int | None = None  # the sweep doomed_by belongs to, when it is one
    doomed_kind: Kind = Kind.OK

    @property
    def doomed(self) -> bool:
        return self.doomed_by is not None or self.doomed_sweep is not None

    def doomed_reason(self) -> str:
        """Why the waiting job is cancelled, in words (only when ``doomed``)."""
        state = self.doomed_state.value if self.doomed_state else "ended"
        if self.doomed_kind is Kind.NOTOK:
            if self.doomed_sweep is not None:
                what = f"dependency sweep {self.doomed_sweep}: every job succeeded"
            else:
                what = f"dependency {self.doomed_by} succeeded"
            return f"{what}; afternotok can never be met"
        if self.doomed_sweep is not None:
            return f"dependency sweep {self.doomed_sweep}: its job {self.doomed_by} {state}"
        return f"dependency {self.doomed_by} {state}"


def dependency_verdict(
    deps: Mapping[int, JobState],
    sweeps: Mapping[int, SweepStanding] | None = None,
    kinds: Mapping[int, Kind] | None = None,
    sweep_kinds: Mapping[int, Kind] | None = None,
) -> Verdict:
    """Ready when every job and sweep waited on is as its kind (afterok when ``kinds``
    does not say) asks; doomed as soon as one never can be (jobs are looked at first,
    then sweeps, each by id)."""
    kinds, sweep_kinds, sweeps = kinds or {}, sweep_kinds or {}, sweeps or {}
    ready = True
    for dep_id, state in sorted(deps.items()):
        kind = kinds.get(dep_id, Kind.OK)
        met = job_met(kind, state)
        if met is False:
            return Verdict(False, doomed_by=dep_id, doomed_state=state, doomed_kind=kind)
        ready = ready and bool(met)
    for sweep_id, standing in sorted(sweeps.items()):
        kind = sweep_kinds.get(sweep_id, Kind.OK)
        met = sweep_met(kind, standing)
        if met is False:
            failed = standing.failed_member if kind is Kind.OK else None
            member, how = failed if failed is not None else (None, None)
            return Verdict(False, member, how, doomed_sweep=sweep_id, doomed_kind=kind)
        ready = ready and bool(met)
    return Verdict(ready=ready)


def waiting_reason(
    deps: Iterable[int],
    user_hold: bool,
    sweeps: Iterable[int] = (),
    kinds: Mapping[int, Kind] | None = None,
    sweep_kinds: Mapping[int, Kind] | None = None,
    earlier: Iterable[int] = (),
) -> str:
    """Why a held job waits: its hold, then what it waits on, by kind, then (singleton)
    the earlier jobs of its name."""
    kinds, sweep_kinds = kinds or {}, sweep_kinds or {}
    parts = []
    if user_hold:
        parts.append("held by user")
    for kind in Kind:
        ids = sorted(i for i in deps if kinds.get(i, Kind.OK) is kind)
        if ids:
            listed = ", ".join(str(i) for i in ids)
            parts.append(f"waiting for job {listed} to {_WAITS_TO[kind]}")
    for kind in Kind:
        sweep_ids = sorted(i for i in sweeps if sweep_kinds.get(i, Kind.OK) is kind)
        if sweep_ids:
            listed = ", ".join(str(i) for i in sweep_ids)
            parts.append(f"waiting for every job of sweep {listed} to {_WAITS_TO[kind]}")
    if earlier_ids := sorted(earlier):
        listed = ", ".join(str(i) for i in earlier_ids)
        parts.append(f"singleton: waiting for job {listed} of the same name and user to end")
    return "; ".join(parts)


RELEASED = "dependencies met, released"


def waiting_place(
    deps: Mapping[int, JobState],
    sweeps: Mapping[int, SweepStanding],
    user_hold: bool,
    kinds: Mapping[int, Kind] | None = None,
    sweep_kinds: Mapping[int, Kind] | None = None,
    earlier: Iterable[int] = (),
) -> tuple[JobState, str]:
    """Where a waiting job belongs, with its reason: cancelled (a dependency can never be
    met), held (a hold, dependencies to wait for, or, for a singleton, ``earlier`` jobs of
    its name still not ended) or queued (``RELEASED``; a job that was queued already keeps
    its own reason)."""
    kinds, sweep_kinds = kinds or {}, sweep_kinds or {}
    verdict = dependency_verdict(deps, sweeps, kinds, sweep_kinds)
    if verdict.doomed:
        return JobState.CANCELLED, verdict.doomed_reason()
    earlier = list(earlier)
    if user_hold or not verdict.ready or earlier:
        pending = [d for d, s in deps.items() if not job_met(kinds.get(d, Kind.OK), s)]
        pending_sweeps = [
            i for i, s in sweeps.items() if not sweep_met(sweep_kinds.get(i, Kind.OK), s)
        ]
        why = waiting_reason(pending, user_hold, pending_sweeps, kinds, sweep_kinds, earlier)
        return JobState.HELD, why
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
