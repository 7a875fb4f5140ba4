"""A job's log: a range of its bytes, or a stream of them that follows it until the job ends.

The log is read through ``ddpq.jobdir``, which opens a job's files without following links:
the job owns its folder, and a link in place of its log must not make the API (maybe root)
serve some other file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ddpq import jobdir
from ddpq.core.states import TERMINAL, JobState
from ddpq.server.deps import Auth, Caller, DatabaseDep, may_touch
from ddpq.server.params import JobId, Offset
from ddpq.store import jobs as job_store
from ddpq.store.db import Database

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

LOG_CHUNK = 64 * 1024
# Who a stream asks as when it looks the log up again (the job had no folder yet when it
# began): the caller's right to read it was checked then.
STREAM = Caller("ddpq", True)


@router.get(
    "/{job_id}/log",
    responses={200: {"content": {"text/plain": {}}, "description": "log bytes"}},
)
def read_log(
    request: Request,
    job_id: JobId,
    who: Auth,
    db: DatabaseDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=16 * 1024 * 1024)] = 1024 * 1024,
    follow: bool = False,
) -> Response:
    """Log bytes from ``offset``; ``follow=true``: a chunked stream until the job ends."""
    path, state = log_target(db, job_id, who)
    if follow:
        # Marked for the daemon's shutdown, which cuts this stream rather than wait for
        # the job to end (``server.protocol``); every other response is let finish.
        request.state.follows_a_job = True
        return StreamingResponse(follow_log(db, job_id, path, offset), media_type="text/plain")
    data, size = read(path, offset, limit)
    return Response(
        data,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Ddpq-Log-Size": str(size),
            "X-Ddpq-Next-Offset": str(offset + len(data)),
            "X-Ddpq-Job-State": state,
        },
    )


def log_target(db: Database, job_id: int, who: Caller) -> tuple[Path | None, str]:
    """The job's log file (None before the job has a folder) and its state."""
    with db.read() as s:
        job = job_store.get_job(s, job_id)
        may_touch(who, job.owner, job_id)
        return (jobdir.JobDir(Path(job.job_dir)).log if job.job_dir else None), job.state


def read(path: Path | None, offset: int, limit: int) -> tuple[bytes, int]:
    return jobdir.read_range(path, offset, limit) if path is not None else (b"", 0)


def job_state(db: Database, job_id: int) -> str:
    with db.read() as s:
        return job_store.get_job(s, job_id).state


async def follow_log(
    db: Database, job_id: int, path: Path | None, offset: int
) -> AsyncIterator[bytes]:
    # Async, so a quiet follower holds no worker thread while it waits (a blocking
    # generator would, and 40 of them would starve the whole API); Starlette cancels
    # it when the client goes away.
    while True:
        state = await run_in_threadpool(job_state, db, job_id)
        if path is None:
            path, _ = await run_in_threadpool(log_target, db, job_id, STREAM)
        data, size = await run_in_threadpool(read, path, offset, LOG_CHUNK)
        if size < offset:  # the shim compacted the log past its cap
            yield b"\n[ddpq: log compacted; some output skipped]\n"
            offset = max(0, size - LOG_CHUNK)
            continue
        if data:
            offset += len(data)
            yield data
            continue
        if JobState(state) in TERMINAL:
            return
        await asyncio.sleep(0.2)
