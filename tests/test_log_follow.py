"""A follower of a job's log (``ddpq logs -f``, the API's ``follow=true``) keeps its place
when the shim compacts the log past its cap: it reads on right after the last bytes it was
sent, with no output twice and none lost, or, fallen too far behind, is told output was
skipped. (The drift this replaced: after a compaction the follower jumped to the newest
chunk and was sent up to 64 KiB twice; more than half a cap behind, it read on silently
from a place that held other output.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ddpq.core.spec import JobSpec
from ddpq.executors.local.shim_log import CappedLog
from ddpq.server.errors import ApiError
from ddpq.server.routes.logs import (
    ANCHOR,
    DROPPED_NOTE,
    FOLLOWS_PER_USER,
    Followers,
    counted,
    follow_log,
    read_on,
)
from ddpq.store import jobs as job_store
from ddpq.store.db import Database
from tests.template_db import migrated


class Follower:
    """``follow_log``'s loop without HTTP: what it would send, in order."""

    def __init__(self, path: Path, search: int) -> None:
        self.path, self.search = path, search
        self.offset, self.seen, self.got, self.skips = 0, b"", b"", 0

    def catch_up(self, reads: int | None = None) -> None:
        while reads is None or reads > 0:
            data, self.offset, skipped = read_on(self.path, self.offset, self.seen, self.search)
            if skipped:
                self.skips += 1
                self.seen = b""
                continue
            if not data:
                return
            self.seen = (self.seen + data[-ANCHOR:])[-ANCHOR:]
            self.offset += len(data)
            self.got += data
            reads = None if reads is None else reads - 1


def numbered_lines(rng: random.Random, count: int) -> list[bytes]:
    # Numbered, so that any line sent twice or lost shows; of varied lengths, so that
    # compactions cut lines anywhere.
    return [b"line %06d %s\n" % (i, b"x" * rng.randrange(0, 300)) for i in range(count)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cap", [4096, 20_000, 100_000])
def test_a_follower_that_keeps_up_gets_every_line_once_across_compactions(
    tmp_path: Path, cap: int, seed: int
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "output.log"
    log = CappedLog(str(path), cap)
    follower = Follower(path, search=4 * 1024 * 1024)
    lines = numbered_lines(rng, 3000)
    unread = 0
    for line in lines:
        log.write(line)
        unread += 1
        # It reads now and then, a chunk at a time, and at least every 8 lines (under
        # 2.5 KB): never behind by more than the smallest cap's kept newest part (3 KB).
        if rng.random() < 0.3 or unread == 8:
            follower.catch_up(reads=1)
            unread = 0
    follower.catch_up()
    log.close()
    assert follower.skips == 0
    assert follower.got == b"".join(lines)


@pytest.mark.parametrize("seed", range(4))
def test_a_follower_too_far_behind_is_told_and_goes_on_with_whole_newer_output(
    tmp_path: Path, seed: int
) -> None:
    """Behind by more than the compaction kept: what it missed is gone, and it says so
    once per loss; what it gets after the note is the log's own bytes, in order."""
    rng = random.Random(seed)
    path = tmp_path / "output.log"
    log = CappedLog(str(path), 4096)
    follower = Follower(path, search=8192)
    lines = numbered_lines(rng, 400)
    for line in lines[:20]:
        log.write(line)
    follower.catch_up()
    for line in lines[20:]:  # it reads nothing while ~40 KB go by: ten caps
        log.write(line)
    follower.catch_up()
    assert follower.skips == 1
    had = b"".join(lines[:20])
    # After what it had: exactly the newest part the shim kept, from the line after its
    # note (the head, which it had, is not sent again).
    newest = path.read_bytes()
    kept = newest[newest.index(b"\n", newest.index(DROPPED_NOTE) + 1) + 1 :]
    assert follower.got == had + kept


def test_the_server_knows_the_shims_note(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    log = CappedLog(str(path), 4096)
    log.write(b"y" * 10_000)
    log.close()
    assert DROPPED_NOTE in path.read_bytes()


def test_the_place_is_checked_even_when_the_log_is_not_shorter_than_it(
    tmp_path: Path,
) -> None:
    """A log rewritten to as many bytes or more (compacted, then grown past the follower's
    offset before it read again): the follower's bytes are looked for, not assumed."""
    path = tmp_path / "output.log"
    path.write_bytes(b"a" * 1000 + b"MARK-1" + b"b" * 1000)
    follower = Follower(path, search=1 << 20)
    follower.catch_up()
    # Rewritten as the shim does: the head, a note, the newest part, then more output.
    path.write_bytes(b"a" * 500 + b"[dropped]" + b"b" * 600 + b"new output " * 300)
    follower.catch_up()
    assert follower.skips == 0
    assert follower.got == b"a" * 1000 + b"MARK-1" + b"b" * 1000 + b"new output " * 300


async def a_log() -> AsyncIterator[bytes]:
    yield b"line\n"


def drained(stream: AsyncIterator[bytes]) -> bytes:
    async def read() -> bytes:
        return b"".join([chunk async for chunk in stream])

    return asyncio.run(read())


def test_a_users_followed_logs_are_counted_while_they_last() -> None:
    """FOLLOWS_PER_USER each; one more is 429. A stream counts until it ends, or until it
    is let go unread (a client gone before its response started); users apart."""
    followers: Followers = {}
    streams = [counted(a_log(), followers, "bob") for _ in range(FOLLOWS_PER_USER)]
    with pytest.raises(ApiError) as refused:
        counted(a_log(), followers, "bob")
    assert refused.value.status == 429 and "stop one" in refused.value.detail
    alices = counted(a_log(), followers, "alice")  # hers are counted apart
    assert drained(streams.pop()) == b"line\n"  # one ended
    streams.append(counted(a_log(), followers, "bob"))
    streams.pop(0)  # one never read, let go
    streams.append(counted(a_log(), followers, "bob"))
    with pytest.raises(ApiError):
        counted(a_log(), followers, "bob")
    assert len(followers["bob"]) == FOLLOWS_PER_USER and len(followers["alice"]) == 1
    del alices
    assert len(followers["alice"]) == 0


def test_a_followed_log_with_nothing_new_for_a_while_ends_its_stream(tmp_path: Path) -> None:
    """A queued job's log, quiet: the stream ends after ``quiet_s`` with what there was
    (its client resumes from there; a client that is gone stops counting)."""
    migrated(tmp_path / "ddpq.db")
    db = Database(tmp_path / "ddpq.db")
    try:
        with db.write() as s:
            job = job_store.create_job(
                s, JobSpec(name="j", owner="bob", command=["true"], cwd="/", gpus=0), 0
            )
        log = tmp_path / "output.log"
        log.write_bytes(b"first\n")

        async def follow() -> bytes:
            stream = follow_log(db, job.id, log, 0, quiet_s=0.5)
            return b"".join([chunk async for chunk in stream])

        assert asyncio.run(asyncio.wait_for(follow(), 30)) == b"first\n"
    finally:
        db.dispose()
