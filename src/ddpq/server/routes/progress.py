"""A job's metrics history: the records of its ``metrics.jsonl``, read from a byte offset.

Only the newest progress record is stored (``jobs.progress``); a plot of every epoch reads
the job's own file, through ``ddpq.jobdir`` (no links followed, a bounded read) and
``core.series`` (each line cleaned like progress, numbers only). Anyone who may list the
queue may read it, as they see each job's progress there: the same lines, older ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query

from ddpq import jobdir
from ddpq.core import series
from ddpq.core.untrusted import MAX_LINE
from ddpq.schemas import MetricsOut
from ddpq.server.deps import Auth, DatabaseDep
from ddpq.server.errors import ApiError
from ddpq.server.params import JobId, Offset
from ddpq.store import jobs as job_store

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# More than the longest line a record may have, so a chunk always holds a whole one.
MIN_READ = 8 * MAX_LINE
MAX_READ = 1024 * 1024
MAX_FIELDS = 16
_FIELD = re.compile(r"[^\x00-\x1f,]{1,64}")


@router.get("/{job_id}/metrics", response_model=MetricsOut)
def read_metrics(
    job_id: JobId,
    _who: Auth,
    db: DatabaseDep,
    offset: Offset = 0,
    limit: Annotated[
        int, Query(ge=MIN_READ, le=MAX_READ, description="the most bytes of the file to read")
    ] = 256 * 1024,
    records: Annotated[int, Query(ge=1, le=10_000, description="the most records")] = 2000,
    fields: Annotated[
        str | None,
        Query(
            max_length=MAX_FIELDS * 65,
            description="comma-separated: only records holding all of these, with only them "
            "(e.g. epoch,test_acc)",
        ),
    ] = None,
) -> MetricsOut:
    """Records from ``offset`` (whole lines only): ask again from ``next_offset`` for
    more. Each is a flat object of the line's numeric fields."""
    wanted = _fields(fields)
    with db.read() as s:
        job = job_store.get_job(s, job_id)
        folder, state = job.job_dir, job.state
    if folder is None:  # not started yet: no folder, no file
        return MetricsOut(
            job_id=job_id, state=state, records=[], offset=offset, next_offset=offset, size=0
        )
    data, size = jobdir.read_range(jobdir.JobDir(Path(folder)).metrics, offset, limit)
    chunk = series.read_chunk(data, offset, len(data) == limit, records, wanted)
    return MetricsOut(
        job_id=job_id,
        state=state,
        records=chunk.records,
        offset=offset,
        next_offset=chunk.next_offset,
        size=size,
    )


def _fields(text: str | None) -> list[str]:
    if not text:
        return []
    names = [f.strip() for f in text.split(",") if f.strip()]
    if len(names) > MAX_FIELDS or not all(_FIELD.fullmatch(n) for n in names):
        raise ApiError(
            422, "invalid", f"fields: at most {MAX_FIELDS} names of 1-64 characters, by commas"
        )
    return names
