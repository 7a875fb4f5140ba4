"""A job's log: a range of its bytes, or a stream of them that follows it until the job ends.

The log is read through ``ddpq.jobdir``, which opens a job's files without following links:
the job owns its folder, and a link in place of its log must not make the API (maybe root)
serve some other file.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ddpq import jobdir
from ddpq.core.states import TERMINAL, JobState
from ddpq.server.deps import Auth, Caller, DatabaseDep, may_touch
from ddpq.server.errors import ApiError
from ddpq.server.params import JobId, Offset
from ddpq.store import jobs as job_store
from ddpq.store.db import Database

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

LOG_CHUNK = 64 * 1024
# A follower's place in the log is its offset and, to find it again after the shim compacts
# the log (``executors.local.shim_log``: the middle dropped, the newest part moved nearer
# the start), the last bytes it was sent, looked for among the log's newest: 4 KiB, so that
# only output that repeats itself for as long could be taken for another place in it (and
# then it is the same output), shorter ends of them if a small cap kept less than that.
ANCHOR = 4096
ANCHOR_ENDS = (ANCHOR, 1024, 256)
SEARCH = 4 * 1024 * 1024
# How the shim's line where it dropped output begins (``executors.local.shim_log``; kept
# equal by tests/test_log_follow.py): a follower that lost its place goes on after it.
DROPPED_NOTE = b"\n[ddpq: log over its cap of "
# Who a stream asks as when it looks the log up again (the job had no folder yet when it
# began): the caller's right to read it was checked then.
STREAM = Caller("ddpq", True)
# The logs one user may follow at once (an admin: any number).
FOLLOWS_PER_USER = 16
# A followed log with no new output for this long ends its stream: the clients resume at
# once from where they were (``client.reconnect.follow_log``), and one that is gone (a
# laptop asleep: no write fails, no close arrives) stops counting against its user.
FOLLOW_QUIET_S = 300.0


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
        stream = follow_log(db, job_id, path, offset)
        if not who.admin:
            stream = counted(stream, followers_of(request), who.name)
        return StreamingResponse(stream, media_type="text/plain")
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


Followers = dict[str, "weakref.WeakSet[AsyncIterator[bytes]]"]
_FOLLOWERS_LOCK = threading.Lock()  # the route runs in the thread pool


def followers_of(request: Request) -> Followers:
    """The logs each user follows now, on this API (``app.state.log_followers``, made with
    the app's state, ``server.app.serve_anew``): each stream while it lasts."""
    followers: Followers = request.app.state.log_followers
    return followers


def counted(stream: AsyncIterator[bytes], followers: Followers, name: str) -> AsyncIterator[bytes]:
    """``stream``, counted as one of ``name``'s followed logs while it lasts; 429 when they
    follow ``FOLLOWS_PER_USER`` already. A followed log lasts as long as its job (a held
    job's, for ever), and each polls the log: one user's thousand would hold the API's
    connections and threads from everyone else.

    Held weakly: a stream whose response never started (its client gone first) is never
    iterated, so its ``finally`` never runs; it stops counting once it is let go."""

    async def lasting() -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        finally:
            itself = known[0]()  # by a weak reference: a strong one would be a cycle
            if itself is not None:
                live.discard(itself)

    known: list[weakref.ref[AsyncIterator[bytes]]] = []

    with _FOLLOWERS_LOCK:
        live = followers.setdefault(name, weakref.WeakSet())
        if len(live) >= FOLLOWS_PER_USER:
            raise ApiError(
                429,
                "too_many_follows",
                f"you follow {FOLLOWS_PER_USER} logs already; stop one (Ctrl-C) or read "
                "without following",
            )
        me = lasting()
        known.append(weakref.ref(me))
        live.add(me)
    return me


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
    db: Database, job_id: int, path: Path | None, offset: int, quiet_s: float = FOLLOW_QUIET_S
) -> AsyncIterator[bytes]:
    # Async, so a quiet follower holds no worker thread while it waits (a blocking
    # generator would, and 40 of them would starve the whole API); Starlette cancels
    # it when the client goes away.
    seen = b""  # the last bytes sent (at most ANCHOR), which end at ``offset``
    quiet_until = asyncio.get_running_loop().time() + quiet_s
    while True:
        state = await run_in_threadpool(job_state, db, job_id)
        if path is None:
            path, _ = await run_in_threadpool(log_target, db, job_id, STREAM)
        data, offset, skipped = (
            await run_in_threadpool(read_on, path, offset, seen) if path else (b"", 0, False)
        )
        if skipped:
            seen = b""
            yield b"\n[ddpq: log compacted; some output skipped]\n"
            continue
        if data:
            seen = (seen + data[-ANCHOR:])[-ANCHOR:]
            offset += len(data)
            quiet_until = asyncio.get_running_loop().time() + quiet_s
            yield data
            continue
        if JobState(state) in TERMINAL or asyncio.get_running_loop().time() > quiet_until:
            return
        await asyncio.sleep(0.2)


def read_on(path: Path, offset: int, seen: bytes, search: int = SEARCH) -> tuple[bytes, int, bool]:
    """What a follower that was sent ``seen`` last, ending at ``offset``, reads next: the
    bytes, the offset they start at, and whether output it never had was dropped first.

    Its place is checked on every read, not only when the log got shorter than its offset:
    a follower more than half a cap behind would otherwise read on from a place that now
    holds other output. After a compaction its last bytes are found again among the newest
    ``search`` bytes and it reads on right after them, neither skipping output nor sending
    any twice; found nowhere (it fell further behind than that), it is told output was
    skipped and goes on with the newest part the shim kept."""
    data, size = jobdir.read_range(path, offset - len(seen), len(seen) + LOG_CHUNK)
    if data[: len(seen)] == seen and size >= offset:
        return data[len(seen) :], offset, False
    base = max(0, size - search)
    window, _ = jobdir.read_range(path, base, search)
    for length in ANCHOR_ENDS if seen else ():
        found = window.rfind(seen[-length:])
        if found >= 0:
            at = found + len(seen[-length:])
            return window[at : at + LOG_CHUNK], base + at, False
    return b"", base + newest_part(window), True


def newest_part(window: bytes) -> int:
    """Where the newest output kept by the last compaction begins in ``window`` (the line
    after the shim's note), or, with no note in it, its last chunk. (A job may print a
    note of its own: then its own follower resumes later than it could, nothing worse.)"""
    note = window.rfind(DROPPED_NOTE)
    end = window.find(b"\n", note + len(DROPPED_NOTE)) if note >= 0 else -1
    return end + 1 if end >= 0 else max(0, len(window) - LOG_CHUNK)
