"""Retention: which finished jobs' folders (and rows) go, in which order. Pure.

A lab's server keeps every job's folder (log, checkpoints, progress) and row until told
otherwise; after a year of sweeps the disk is full. Two limits, each optional:

- an age (``--keep-finished 30d``): a job that finished longer ago than that loses its
  folder, and with ``prune_rows`` its row;
- a budget for all job folders together (``--jobs-budget 500G``): while they hold more,
  finished jobs lose their checkpoints (everything but the log and the records, see
  ``ddpq.jobdir``), and only when no finished job's checkpoints may go and that is still
  not enough, their logs and records (the whole folder). Each time, from the user whose
  folders hold the most, their oldest first, and only while that user holds more than an
  equal share of the budget: users do not trust each other, and one who fills the disk
  (a running job's folder, or writing into their finished ones) must not get another's
  files removed. What then stays over the budget is said (``Plan.over_budget``).

Only finished jobs are ever named: a queued, held or running job's folder holds what it
will resume from, and it counts towards the budget all the same. A row is never the
newest job's: SQLite would give its id to the next job, whose folder would then be
another job's history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ddpq.core.states import TERMINAL, JobState


class What(StrEnum):
    CHECKPOINTS = "checkpoints"  # the folder's files but the log and the records
    FOLDER = "folder"  # whatever is left of the folder, then the folder itself
    ROW = "row"  # the job's row (its history, attempts and leases with it)


@dataclass(frozen=True)
class JobFolder:
    """What retention knows of one job: its state, when it finished, what its folder holds
    (in bytes on disk; 0 and 0 with ``exists`` False once it is gone)."""

    job_id: int
    state: JobState
    finished_at: float | None  # None: not finished
    checkpoint_bytes: int = 0
    record_bytes: int = 0  # the log, the exit record, the progress lines, the shim's errors
    exists: bool = True
    owner: str = ""

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes + self.record_bytes


@dataclass(frozen=True)
class Policy:
    keep_finished_s: float | None = None
    budget_bytes: int | None = None
    prune_rows: bool = False

    @property
    def active(self) -> bool:
        return self.keep_finished_s is not None or self.budget_bytes is not None


@dataclass(frozen=True)
class Removal:
    job_id: int
    what: What
    bytes: int  # what it frees, as measured (0 for a row)
    why: str  # "finished more than 30d ago", "job folders over the budget"


@dataclass(frozen=True)
class Plan:
    removals: tuple[Removal, ...]
    total_bytes: int  # all job folders before
    left_bytes: int  # after the removals
    over_budget: bool  # still over after them: jobs not finished, or users within their share

    def of(self, what: What) -> list[Removal]:
        return [r for r in self.removals if r.what is what]


def is_finished(job: JobFolder) -> bool:
    return job.state in TERMINAL and job.finished_at is not None


def plan(
    jobs: Iterable[JobFolder],
    policy: Policy,
    now: float,
    *,
    newest_id: int | None = None,
    other_bytes: int = 0,
    age_label: str = "",
) -> Plan:
    """The removals that meet ``policy`` at ``now``, in the order to make them: by age
    (oldest first, each folder then its row), then for the budget finished jobs'
    checkpoints, then their folders, from the user holding the most (``_Trim``).
    ``newest_id``: the highest job id there is, whose row stays. ``other_bytes``: what the
    job folders hold that retention may not remove (folders of no job it knows) but
    counts. ``age_label``: how the age limit is written in the reasons ("30d")."""
    jobs = list(jobs)
    total = other_bytes + sum(j.total_bytes for j in jobs)
    finished = sorted((j for j in jobs if is_finished(j)), key=_age_order)
    removals: list[Removal] = []
    left = {j.job_id: j for j in finished}  # what remains of each finished job's folder

    if policy.keep_finished_s is not None:
        cutoff = now - policy.keep_finished_s
        why = f"finished more than {age_label or f'{policy.keep_finished_s:g}s'} ago"
        for j in finished:
            assert j.finished_at is not None
            if j.finished_at > cutoff:
                continue
            if j.exists:
                removals.append(Removal(j.job_id, What.FOLDER, j.total_bytes, why))
                del left[j.job_id]
            if policy.prune_rows and j.job_id != newest_id:
                removals.append(Removal(j.job_id, What.ROW, 0, why))

    used = total - sum(r.bytes for r in removals)
    budget = policy.budget_bytes
    if budget is not None and used > budget:
        held: dict[str, int] = {}  # what each owner's folders hold after the removals above
        for j in jobs:
            if j.job_id in left or not is_finished(j):
                held[j.owner] = held.get(j.owner, 0) + j.total_bytes
        # Among the users whose folders hold anything (a row whose folder is gone is no one's).
        share = max(0, budget - other_bytes) / max(1, sum(1 for b in held.values() if b > 0))
        trim = _Trim(budget, used, held, share)
        with_checkpoints = [j for j in left.values() if j.checkpoint_bytes > 0]
        trimmed = trim.take(with_checkpoints, What.CHECKPOINTS, lambda j: j.checkpoint_bytes)
        trim.take(
            [j for j in left.values() if j.exists],
            What.FOLDER,
            lambda j: j.record_bytes if j.job_id in trimmed else j.total_bytes,
        )
        removals += trim.removals
        used = trim.used
    return Plan(tuple(removals), total, used, budget is not None and used > budget)


@dataclass
class _Trim:
    """The budget's removals: from the owner holding the most, their oldest finished job
    first, while that owner holds more than ``share``."""

    budget: int
    used: int
    held: dict[str, int]
    share: float
    removals: list[Removal] = field(default_factory=list)

    def take(
        self, jobs: Iterable[JobFolder], what: What, size: Callable[[JobFolder], int]
    ) -> set[int]:
        """Remove ``what`` of ``jobs`` (``size`` each) until within the budget or no owner
        is over their share; the ids taken from."""
        queues: dict[str, deque[JobFolder]] = {}
        for j in _in_age_order(jobs):
            queues.setdefault(j.owner, deque()).append(j)
        taken: set[int] = set()
        while self.used > self.budget:
            over = [o for o, q in queues.items() if q and self.held.get(o, 0) > self.share]
            if not over:
                break
            owner = max(over, key=lambda o: (self.held.get(o, 0), o))
            j = queues[owner].popleft()
            freed = size(j)
            self.removals.append(Removal(j.job_id, what, freed, "job folders over the budget"))
            self.used -= freed
            self.held[owner] -= freed
            taken.add(j.job_id)
        return taken


def _age_order(job: JobFolder) -> tuple[float, int]:
    return (job.finished_at if job.finished_at is not None else float("inf"), job.job_id)


def _in_age_order(jobs: Iterable[JobFolder]) -> Sequence[JobFolder]:
    return sorted(jobs, key=_age_order)
