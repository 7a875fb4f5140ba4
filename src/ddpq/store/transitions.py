"""The one writer of a job's state and of its history (``jobs.state``, ``job_events``).

Every state change, of one job or of ten thousand, goes through :func:`move_many`: it
checks each change with ``core.states``, writes the changes' events in one executemany and
the rows in one executemany UPDATE per target state, each guarded by the state the caller
expected, so that a change decided on a stale read (another transaction moved the job
since) writes nothing at all, neither row nor event. It runs on the worker's hot path for
every job: Core statements, no ORM unit of work. Flush, never commit: the caller owns the
transaction. ``tests/test_transitions.py`` checks that no other store module writes a
job's state or an event.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import (
    Float,
    Integer,
    Table,
    Text,
    bindparam,
    exists,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.dml import Update

from ddpq.core.states import TERMINAL, JobState, check_transition
from ddpq.store.models import Job, JobEvent

_jobs = cast(Table, Job.__table__)
_events = cast(Table, JobEvent.__table__)
_STATE = _events.c.to_state.type

_INSERT_EVENT = insert(_events)
# An event written only if its job is still in the state the change starts from: the same
# guard as the row's UPDATE, evaluated before it, so the events written say which jobs move.
_INSERT_GUARDED_EVENT = insert(_events).from_select(
    ["job_id", "at", "from_state", "to_state", "reason"],
    select(
        bindparam("b_id", type_=Integer),
        bindparam("b_at", type_=Float),
        bindparam("b_old", type_=_STATE),
        bindparam("b_new", type_=_STATE),
        bindparam("b_reason", type_=Text),
    ).where(
        exists().where(
            _jobs.c.id == bindparam("b_id", type_=Integer),
            _jobs.c.state == bindparam("b_old", type_=_STATE),
        )
    ),
)


# A job's history keeps at most KEPT_EVENTS lines, its first and its newest: what a user can
# repeat on their own job (hold and release, an edit) must not grow the database unbounded.
KEPT_EVENTS = 1000
_TRIM_HISTORIES = text(
    "DELETE FROM job_events WHERE id IN ("
    " SELECT id FROM ("
    "  SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY id DESC) AS newer,"
    "   min(id) OVER (PARTITION BY job_id) AS first"
    "  FROM job_events WHERE job_id IN (SELECT value FROM json_each(:jobs))"
    " ) WHERE newer >= :keep AND id != first)"
)
_TRIM_CHUNK = 500  # jobs a statement: a sweep's 10,000 members in a few


@dataclass(frozen=True)
class Change:
    """One job from ``old`` to ``new`` (the same state: a new reason, no transition), with
    the columns this job alone gets (the same names for every change of one call), and
    when its event happened if not at the call's ``now`` (an attempt's own end)."""

    job_id: int
    old: JobState
    new: JobState
    reason: str
    values: Mapping[str, Any] = field(default_factory=dict)
    at: float | None = None


def move_many(session: Session, changes: Sequence[Change], now: float, **shared: Any) -> list[int]:
    """Apply ``changes`` (each job once), with ``shared`` columns (values or SQL
    expressions) set on every row moved; returns the ids of the jobs moved, in order.

    A job not in its change's ``old`` state any more is left as it is, without an event.
    A job that reaches a terminal state ends at ``now`` unless ``ended_at`` is given. An
    illegal change raises ``InvalidTransition`` before anything is written.
    """
    if not changes:
        return []
    for c in changes:
        if c.new is not c.old:
            check_transition(c.old, c.new)
    if len({c.job_id for c in changes}) != len(changes):
        raise ValueError("a job can change state once per call")
    conn = session.connection()
    events = [
        {
            "b_id": c.job_id,
            "b_at": now if c.at is None else c.at,
            "b_old": c.old,
            "b_new": c.new,
            "b_reason": c.reason,
        }
        for c in changes
    ]
    written = conn.execute(_INSERT_GUARDED_EVENT, events).rowcount
    moved = list(changes) if written == len(changes) else _still_in_old(session, changes)
    groups: dict[tuple[JobState, tuple[str, ...]], list[Change]] = {}
    for c in moved:
        groups.setdefault((c.new, tuple(sorted(c.values))), []).append(c)
    for (new, keys), group in groups.items():
        extra = dict(shared)
        if new in TERMINAL and "ended_at" not in keys:
            extra.setdefault("ended_at", now)
        # A predicted start is of a job waiting in the queue as the forecast last saw it:
        # any move makes it stale (a held job released keeps none until forecast again).
        extra.setdefault("predicted_start", None)
        _update(session, new, keys, group, extra)
    return [c.job_id for c in moved]


def _still_in_old(session: Session, changes: Sequence[Change]) -> list[Change]:
    """The changes whose job is still where the change starts (read before the UPDATEs:
    only those got their event)."""
    query = select(_jobs.c.id, _jobs.c.state).where(_jobs.c.id.in_([c.job_id for c in changes]))
    now_in = {job_id: state for job_id, state in session.connection().execute(query)}
    return [c for c in changes if now_in.get(c.job_id) == c.old]


def _update(
    session: Session,
    new: JobState,
    keys: tuple[str, ...],
    group: Sequence[Change],
    shared: Mapping[str, Any],
) -> None:
    computed = {k: v for k, v in shared.items() if isinstance(v, ClauseElement)}
    given = {f"s_{k}": v for k, v in shared.items() if k not in computed}
    statement = (
        _statement(new, keys, tuple(sorted(shared)))
        if not computed  # the usual: built once per shape, not per call (every pass's)
        else _built(new, keys, tuple(k for k in shared if k not in computed)).values(**computed)
    )
    rows = [
        {"b_id": c.job_id, "b_old": c.old, "b_reason": c.reason}
        | {f"v_{k}": c.values[k] for k in keys}
        | given
        for c in group
    ]
    result = session.connection().execute(statement, rows)
    if result.rowcount != len(rows):  # each got its event under the same guard: a bug
        raise RuntimeError(f"of {len(rows)} jobs to move to {new.value}, {result.rowcount} moved")
    _sync_loaded(session, new, group, shared)


def _built(new: JobState, own: tuple[str, ...], shared: tuple[str, ...]) -> Update:
    """The UPDATE of a move to ``new``: each row's ``own`` columns (``v_<name>``), the
    call's ``shared`` ones (``s_<name>``), guarded by the state the move starts from."""
    values: dict[str, Any] = {k: bindparam(f"v_{k}") for k in own}
    values.update({k: bindparam(f"s_{k}") for k in shared})
    return (
        update(_jobs)
        .where(_jobs.c.id == bindparam("b_id"), _jobs.c.state == bindparam("b_old"))
        .values(state=new, reason=bindparam("b_reason"), **values)
    )


# Building an UPDATE of twenty columns (a start's) was a tenth of the worker's pass, in
# the transaction submissions wait behind (bench/RESULTS.md): each shape is built once.
_statement = functools.lru_cache(maxsize=256)(_built)


def _sync_loaded(
    session: Session, new: JobState, group: Sequence[Change], shared: Mapping[str, Any]
) -> None:
    """Keep the jobs this session has loaded as ORM objects true to their rows, without
    marking them changed (the ORM must not write them again)."""
    if not session.identity_map:
        return  # the worker's path: columns only, nothing loaded
    for c in group:
        job = session.identity_map.get(identity_key(Job, c.job_id))
        if job is None:
            continue
        for key, value in {"state": new, "reason": c.reason, **shared, **c.values}.items():
            if isinstance(value, ClauseElement):
                session.expire(job, [key])  # computed by SQL: read again when next used
            else:
                set_committed_value(job, key, value)


def move(
    session: Session,
    job_id: int,
    old: JobState,
    new: JobState,
    reason: str,
    now: float,
    **values: Any,
) -> bool:
    """One job from ``old`` to ``new`` with ``values``; False (nothing written) if it is not
    in ``old`` any more."""
    return bool(move_many(session, [Change(job_id, old, new, reason)], now, **values))


def move_job(session: Session, job: Job, new: JobState, reason: str, now: float) -> bool:
    """``move`` for a job loaded in this session, from the state it was read in."""
    return move(session, job.id, job.state, new, reason, now)


def edit(
    session: Session, job_id: int, state: JobState, reason: str, now: float, **values: Any
) -> bool:
    """Set ``values`` on a job's row with a line in its history (``reason``), its state and
    its reason (why it waits) kept; False, with nothing written, if it is not in ``state``
    any more (the same guard as a move's: the event first, the row under it)."""
    event = {"b_id": job_id, "b_at": now, "b_old": state, "b_new": state, "b_reason": reason}
    conn = session.connection()
    if not conn.execute(_INSERT_GUARDED_EVENT, [event]).rowcount:
        return False
    trim_history(session, job_id)  # an edit can be repeated at will: a bounded history
    conn.execute(update(_jobs).where(_jobs.c.id == job_id, _jobs.c.state == state).values(**values))
    job = session.identity_map.get(identity_key(Job, job_id)) if session.identity_map else None
    if job is not None:
        for key, value in values.items():
            set_committed_value(job, key, value)
    return True


def submitted(session: Session, job_ids: Iterable[int], now: float) -> None:
    """The first line of new jobs' histories (a job is born queued: any other state it
    starts in is reached through ``move_many``)."""
    first = {"at": now, "from_state": None, "to_state": JobState.QUEUED, "reason": "submitted"}
    rows = [{"job_id": i, **first} for i in job_ids]
    if rows:
        session.connection().execute(_INSERT_EVENT, rows)


def note(session: Session, job_id: int, state: JobState, reason: str, now: float) -> None:
    """A line in a job's history that changes no state (a preemption asked for, a warning)."""
    row = {"job_id": job_id, "at": now, "from_state": state, "to_state": state, "reason": reason}
    session.connection().execute(_INSERT_EVENT, row)
    trim_history(session, job_id)  # notes repeat (idle warnings, resizes): a bounded history


def trim_history(session: Session, job_id: int) -> None:
    """Keep ``KEPT_EVENTS`` of a job's history lines, its first and its newest (after a
    user's own repeatable change: the worker's own lines are a few an attempt)."""
    trim_histories(session, [job_id])


def trim_histories(session: Session, job_ids: Sequence[int]) -> None:
    """``trim_history`` for many jobs (a sweep's members held or released together)."""
    conn = session.connection()
    for start in range(0, len(job_ids), _TRIM_CHUNK):
        chunk = json.dumps(list(job_ids[start : start + _TRIM_CHUNK]))
        conn.execute(_TRIM_HISTORIES, {"jobs": chunk, "keep": KEPT_EVENTS})
