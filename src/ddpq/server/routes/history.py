"""Finished jobs, newest first, a page at a time: ``GET /v1/history`` (``ddpq history``).

Every authenticated caller may read everyone's, as everyone may list the queue (finished
jobs included, ``ddpq ls --all``) and read the usage report: what ended, when and how, not
the jobs' environments or logs. The page's SQL walks one index in end-time order
(``store.history``); ``after`` goes on from where the last page stopped.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from ddpq.core.states import TERMINAL, JobState
from ddpq.schemas import HistoryPage, HistoryRow
from ddpq.server import views
from ddpq.server.deps import Auth, DatabaseDep
from ddpq.server.errors import ApiError
from ddpq.server.params import INT64_MAX
from ddpq.store import history as history_store
from ddpq.store.models import Job

router = APIRouter(prefix="/v1/history", tags=["jobs"])

MAX_ROWS = 1000
FINISHED = ", ".join(sorted(s.value for s in TERMINAL))

When = Annotated[
    datetime | None,
    Query(description="ISO 8601 (UTC unless it names its offset) or UNIX seconds"),
]


@router.get("", response_model=HistoryPage)
def history(
    who: Auth,
    db: DatabaseDep,
    since: When = None,
    until: When = None,
    user: Annotated[str | None, Query(max_length=64, description="this owner's only")] = None,
    mine: Annotated[bool, Query(description="only the caller's jobs")] = False,
    state: Annotated[list[JobState] | None, Query(description="finished states only")] = None,
    name: Annotated[
        str | None, Query(max_length=128, description="a name, or a glob: train-*")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS)] = 100,
    after: Annotated[
        str | None, Query(max_length=64, description="a page's ``next``: the rows after it")
    ] = None,
) -> HistoryPage:
    """Finished jobs that ended in [since, until), newest end first, at most ``limit``."""
    unfinished = [s.value for s in state or [] if s not in TERMINAL]
    if unfinished:
        raise ApiError(
            422, "invalid", f"state: {unfinished[0]!r} is not a finished state ({FINISHED})"
        )
    filters = history_store.Filters(
        since=_seconds(since),
        until=_seconds(until),
        owner=who.name if mine else user,
        states=list(state or []),
        name=name,
    )
    cursor = parse_cursor(after) if after is not None else None
    with db.read() as s:
        jobs = history_store.finished(s, filters, limit + 1, cursor)
        page = jobs[:limit]
        runs = history_store.runs_of(s, [j.id for j in page])
    rows = [_row(j, runs[j.id]) for j in page]
    last = page[-1] if len(jobs) > limit else None
    return HistoryPage(items=rows, next=None if last is None else f"{last.ended_at!r}:{last.id}")


def _seconds(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    # A time without an offset is UTC, as every time the API gives is.
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def parse_cursor(text: str) -> history_store.Cursor:
    """A page's ``next`` (``END:ID``) back into where to go on from; 422 for anything else."""
    end, sep, ident = text.partition(":")
    try:
        ended_at, job_id = float(end), int(ident)
    except ValueError:
        ended_at, job_id = math.nan, 0
    if not (sep and math.isfinite(ended_at) and ident.isascii() and ident.isdigit()):
        raise ApiError(422, "invalid", "after: not a page's next (END:ID, as a page gives it)")
    if not 1 <= job_id <= INT64_MAX:
        raise ApiError(422, "invalid", "after: no job has that id")
    return history_store.Cursor(ended_at, job_id)


def _row(job: Job, runs: list[history_store.Run]) -> HistoryRow:
    assert job.ended_at is not None  # the store lists ended jobs only
    last = runs[-1] if runs else None
    # An attempt with no end of its own (a record lost to a crash) ran until the job ended.
    elapsed = sum(max(0.0, (r.ended_at or job.ended_at) - r.started_at) for r in runs)
    peaks = [r.peak_ram_bytes for r in runs if r.peak_ram_bytes is not None]
    cores = len(last.cores) if last is not None and last.cores else job.cpus
    mem = last.ram_bytes if last is not None and last.ram_bytes is not None else job.ram_bytes
    return HistoryRow(
        id=job.id,
        name=views.servable(job.name),
        owner=views.servable(job.owner),
        state=job.state,
        reason=views.servable(job.reason),
        sweep_id=job.sweep_id,
        submitted_at=views.ts_req(job.submitted_at),
        started_at=views.ts(runs[0].started_at if runs else None),
        ended_at=views.ts_req(job.ended_at),
        elapsed_s=elapsed,
        attempts=len(runs),
        gpus=job.gpus,
        gpu_ids=sorted(last.gpus) if last is not None else [],
        cores=cores,
        mem=mem,
        peak_mem=max(peaks) if peaks else None,
        exit_code=job.exit_code,
        exit_signal=job.exit_signal,
    )
