"""The queue as one screen shows it (``GET /v1/queue``): what ``ddpq ls`` draws, in one
request whose cost does not grow with the jobs it does not show (``store.queue``)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import APIRouter, Query

from ddpq.core.states import TERMINAL, JobState
from ddpq.schemas import HiddenOut, QueueView
from ddpq.server import views
from ddpq.server.deps import Auth, DatabaseDep
from ddpq.store import queue as queue_store
from ddpq.store import sweeps as sweep_store
from ddpq.store.db import Session

router = APIRouter(prefix="/v1/queue", tags=["jobs"])

# Rows in a table at most: a screen's worth is far less; a script wanting every job pages
# through GET /v1/jobs.
MAX_ROWS = 1000


@router.get("", response_model=QueueView)
def queue(
    who: Auth,
    db: DatabaseDep,
    state: Annotated[list[JobState] | None, Query()] = None,
    user: Annotated[str | None, Query(max_length=64)] = None,
    mine: Annotated[bool, Query(description="only the caller's jobs")] = False,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS, description="rows in each table")] = 100,
    expand: Annotated[bool, Query(description="a sweep's jobs as rows, not one line")] = False,
) -> QueueView:
    """Jobs and sweeps oldest first, a sweep folded into one row with its jobs' counts by
    state (unless ``expand``). Past ``limit`` rows without ``user``/``mine``: the caller's
    own rows, and everyone else's jobs counted by owner and state (``hidden``). Past
    ``limit`` rows of a table, the oldest are shown (the queue's head), or the newest where
    finished states are asked for."""
    owner = who.name if mine else user
    with db.read() as s:
        return _view(s, list(state or []), owner, who.name, limit, expand)


def _view(
    s: Session, states: list[JobState], owner: str | None, caller: str, limit: int, expand: bool
) -> QueueView:
    groups = queue_store.groups(s, states, owner)
    rows = [g for g in groups if expand or g.sweep_id is None]
    folded = [g for g in groups if not expand and g.sweep_id is not None]
    wanted = sum(g.jobs for g in rows) + len({g.sweep_id for g in folded})
    only = None
    if owner is None and wanted > limit:
        only = caller
        rows = [g for g in rows if g.owner == caller]
        folded = [g for g in folded if g.owner == caller]
    # Past ``limit``, the queue's head; but asked for finished jobs too (``ls --all``), the
    # newest: on a busy server the oldest are jobs of months ago.
    newest = not states or any(st in TERMINAL for st in states)
    jobs = queue_store.shown_jobs(s, rows, limit, newest=newest)
    ids = sorted({g.sweep_id for g in folded if g.sweep_id is not None})
    sweep_ids = ids[-limit:] if newest else ids[:limit]
    sweeps, _ = sweep_store.list_sweeps(s, ids=sweep_ids, limit=limit)
    counts = sweep_store.counts(s, sweep_ids)
    shown_sweeps = set(sweep_ids)
    listed = Counter((j.state, j.owner, j.sweep_id) for j in jobs)
    hidden: dict[str, Counter[JobState]] = {}
    for g in groups:
        if g.sweep_id in shown_sweeps and not expand:
            continue
        left = g.jobs - listed[(g.state, g.owner, g.sweep_id)]
        if left > 0:
            hidden.setdefault(g.owner, Counter())[g.state] += left
    return QueueView(
        jobs=views.jobs_out(s, jobs),
        sweeps=[views.sweep_out(sw, counts[sw.id]) for sw in sweeps],
        total=sum(g.jobs for g in groups),
        only_owner=only,
        hidden=[
            HiddenOut(owner=views.servable(o), counts=dict(c)) for o, c in sorted(hidden.items())
        ],
        limit=limit,
    )
