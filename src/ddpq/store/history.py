"""Finished jobs, newest first, a page at a time (``GET /v1/history``, ``ddpq history``). Read only.

With 100,000 finished jobs a page must cost what it costs on ten: the statement walks one
index in end-time order (``ix_jobs_owner_ended`` for one owner, else ``ix_jobs_ended``;
migration 0023h). The state is compared as ``+jobs.state`` (SQLite's way to say "not
through an index"): else the planner takes ``ix_jobs_state`` for the four finished states
and sorts every finished job to keep a page of them (``tests/test_history.py`` reads the
plan). A page goes on from where the last one stopped (its last row's end time and
id: ``Cursor``), never by an offset that walks what it skips. The attempts are then read
for the page's jobs alone (``ix_attempts_job_id``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Select, String, literal_column, select, tuple_
from sqlalchemy.orm import Session, defer

from ddpq.core.states import TERMINAL, JobState
from ddpq.store.models import Attempt, Job


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: the rows after it end before ``ended_at``, or then with a
    smaller id."""

    ended_at: float
    id: int


@dataclass(frozen=True)
class Filters:
    """Which finished jobs: ended in [since, until) (None: no bound), of ``owner`` (None:
    everyone's), in ``states`` (empty: every finished state), named ``name`` (a glob when
    it holds ``*``, ``?`` or ``[``; None: any name)."""

    since: float | None = None
    until: float | None = None
    owner: str | None = None
    states: Sequence[JobState] = ()
    name: str | None = None


@dataclass(frozen=True)
class Run:
    """One attempt of a finished job, as the history shows it."""

    number: int
    gpus: list[int]
    cores: list[int] | None
    ram_bytes: int | None
    started_at: float
    ended_at: float | None
    peak_ram_bytes: int | None


_GLOB = frozenset("*?[")


def finished(
    session: Session, filters: Filters, limit: int, after: Cursor | None = None
) -> list[Job]:
    """At most ``limit`` finished jobs that match, newest end first (then highest id),
    those after ``after`` only; without their environment (the history never shows it)."""
    return list(session.scalars(statement(filters, limit, after)))


def statement(filters: Filters, limit: int, after: Cursor | None = None) -> Select[Job]:
    """``finished``'s SELECT (the tests read its plan)."""
    states = [s for s in filters.states if s in TERMINAL] or sorted(TERMINAL)
    state = literal_column("+jobs.state", String)
    query = (
        select(Job)
        .options(defer(Job.env, raiseload=True))
        .where(Job.ended_at.is_not(None), state.in_([s.value for s in states]))
        .order_by(Job.ended_at.desc(), Job.id.desc())
        .limit(limit)
    )
    if filters.owner is not None:
        query = query.where(Job.owner == filters.owner)
    if filters.since is not None:
        query = query.where(Job.ended_at >= filters.since)
    if filters.until is not None:
        query = query.where(Job.ended_at < filters.until)
    if filters.name is not None:
        if _GLOB & set(filters.name):
            query = query.where(Job.name.op("GLOB")(filters.name))
        else:
            query = query.where(Job.name == filters.name)
    if after is not None:
        query = query.where(tuple_(Job.ended_at, Job.id) < tuple_(after.ended_at, after.id))
    return query


def runs_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Run]]:
    """Each job's attempts, first to last."""
    ids = sorted(set(job_ids))
    found: dict[int, list[Run]] = {i: [] for i in ids}
    if not ids:
        return found
    query = (
        select(
            Attempt.job_id,
            Attempt.number,
            Attempt.gpus,
            Attempt.cores,
            Attempt.ram_bytes,
            Attempt.started_at,
            Attempt.ended_at,
            Attempt.peak_ram_bytes,
        )
        .where(Attempt.job_id.in_(ids))
        .order_by(Attempt.job_id, Attempt.number)
    )
    for job_id, number, gpus, cores, ram, started, ended, peak in session.execute(query):
        found[job_id].append(Run(number, list(gpus or []), cores, ram, started, ended, peak))
    return found
