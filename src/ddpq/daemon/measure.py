"""What each running job's folder holds, for the per-job limit (``daemon.quota``), measured
a bounded amount at a time.

A job's folder is hostile: it may hold ten million files, or bytes in files the job
deleted but keeps open (they fill the disk, and no directory entry shows them). So:

- a folder is walked as retention walks it (``daemon.sweep``: one descriptor at a time,
  never through a link or into another filesystem), streaming its entries
  (``os.scandir``), and the walk is a generator kept from one look to the next: each look
  counts at most a share of ``ENTRIES_PER_LOOK`` entries per job and spends at most
  ``SECONDS_PER_LOOK``, jobs in rotation, so a folder of millions of files is measured
  over several looks instead of stalling the disk watch, and the others are measured
  meanwhile;
- a walk stops as soon as what it counted is over the limit;
- each look adds the files the job's processes (its cgroup's members) hold open with no
  name left (``st_nlink == 0``) on its folder's filesystem, read from ``/proc/PID/fd``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpq.daemon.sweep import _DIR, tree_sizes

# Entries looked at in one look, shared by the running jobs (each gets at least MIN_SHARE).
ENTRIES_PER_LOOK = 200_000
MIN_SHARE = 10_000
SECONDS_PER_LOOK = 1.0
# Descriptors of a job's processes looked at per look: past it the deleted files not yet
# seen are missed (a job holding over a million descriptors open); the exact bound is a
# filesystem or a project quota of the job folders' own (docs/admin.md).
DESCRIPTORS_PER_JOB = 1_000_000
# ...and at most this many in one look (~0.2 s): the rest in the looks after it.
DESCRIPTORS_PER_LOOK = 25_000
_CHECK_EVERY = 256  # entries between two looks at the clock and the limit


@dataclass(frozen=True)
class Running:
    """A running job as the disk watch measures it."""

    folder: Path
    pids: Callable[[], Iterable[int]]  # its processes now
    attempt: int = 0  # which: a retry's processes are another count's


class FolderWalk:
    """The bytes of one job's folder, counted across looks (the folder changing meanwhile
    is counted as it is found, as ``du`` does)."""

    def __init__(self, folder: Path) -> None:
        self.counted = 0
        self.done = False
        self.missing = False  # there is no such folder (yet), or it is not a folder
        self.dev: int | None = None
        self._steps = self._walk(folder)

    def advance(self, entries: int, deadline: float, enough: int | None) -> int:
        """Count up to ``entries`` more entries, until ``deadline`` or until more than
        ``enough`` bytes are counted; the entries looked at."""
        seen = 0
        while seen < entries and not self.done:
            try:
                next(self._steps)
            except StopIteration:
                self.done = True
                break
            seen += 1
            if seen % _CHECK_EVERY == 0 and (
                time.monotonic() >= deadline or (enough is not None and self.counted > enough)
            ):
                break
        return seen

    def close(self) -> None:
        self._steps.close()

    def _walk(self, folder: Path) -> Generator[None, None, None]:
        try:
            top = os.open(folder.parent, _DIR)
        except OSError:
            self.missing = True
            return
        try:
            fd = os.open(folder.name, _DIR, dir_fd=top)
        except OSError:
            self.missing = True
            return
        finally:
            os.close(top)
        try:
            self.dev = os.fstat(fd).st_dev
            for size in tree_sizes(fd, self.dev):
                self.counted += size
                yield
        finally:
            os.close(fd)


class DeletedFiles:
    """Bytes in regular files on filesystem ``dev`` that a job's processes hold open and
    that have no name left: a job's "deleted" files still fill the disk. Each file once,
    however many descriptors share it. Counted ``DESCRIPTORS_PER_LOOK`` descriptors a
    look, over as many looks as it takes (a job can dup one deleted file a million times:
    seconds of stat, which every other job's look would wait for), and started again once
    whole; ``counted`` is the last whole count, or the one under way if it is more."""

    def __init__(self, pids: Callable[[], Iterable[int]], dev: int, attempt: int = 0) -> None:
        self.pids, self.dev, self.attempt = pids, dev, attempt
        self.whole = 0
        self._seen: dict[int, int] = {}
        self._steps = self._scan()

    @property
    def counted(self) -> int:
        return max(self.whole, sum(self._seen.values()))

    def advance(self, descriptors: int) -> None:
        for _ in range(descriptors):
            try:
                next(self._steps)
            except StopIteration:
                self.whole = sum(self._seen.values())
                self._seen = {}
                self._steps = self._scan()
                return

    def _scan(self) -> Generator[None, None, None]:
        looked = 0
        for pid in self.pids():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue  # gone, or not ours to look at
            for name in fds:
                looked += 1
                if looked > DESCRIPTORS_PER_JOB:
                    return
                with contextlib.suppress(OSError):
                    # The descriptor's own file, even deleted: no path in the job's folder.
                    st = os.stat(f"/proc/{pid}/fd/{name}")
                    if st.st_nlink == 0 and st.st_dev == self.dev and stat.S_ISREG(st.st_mode):
                        self._seen[st.st_ino] = st.st_blocks * 512
                yield


class Measurer:
    """The running jobs' folders, measured a bounded amount per look, in rotation."""

    def __init__(
        self,
        entries: int = ENTRIES_PER_LOOK,
        seconds: float = SECONDS_PER_LOOK,
        min_share: int = MIN_SHARE,
    ) -> None:
        self.entries = entries
        self.seconds = seconds
        self.min_share = min_share
        self._walks: dict[int, FolderWalk] = {}
        self._deleted: dict[int, DeletedFiles] = {}
        self._after = -1  # rotation: the next look starts after this job

    def look(
        self, running: Mapping[int, Running], limit_of: Callable[[Path], int | None]
    ) -> dict[int, int]:
        """The jobs found holding more than their limit in this look, and the bytes."""
        for job_id in [j for j in self._walks if j not in running]:
            self._walks.pop(job_id).close()
        for job_id in [j for j in self._deleted if j not in running]:
            del self._deleted[job_id]
        ids = sorted(running)
        order = [j for j in ids if j > self._after] + [j for j in ids if j <= self._after]
        share = max(self.min_share, self.entries // max(1, len(ids)))
        deadline = time.monotonic() + self.seconds
        over: dict[int, int] = {}
        for job_id in order:
            self._after = job_id
            job = running[job_id]
            held = self._measure(job_id, job, limit_of(job.folder.parent), share, deadline)
            if held is not None:
                over[job_id] = held
            if time.monotonic() >= deadline:
                break  # the next look goes on with the next job
        return over

    def _measure(
        self, job_id: int, job: Running, limit: int | None, share: int, deadline: float
    ) -> int | None:
        """What the job holds if it is over ``limit`` (as far as counted), else None."""
        if limit is None:
            return None
        walk = self._walks.get(job_id)
        if walk is None:
            walk = self._walks[job_id] = FolderWalk(job.folder)
        walk.advance(share, deadline, limit)
        hidden = 0
        if walk.dev is not None:
            deleted = self._deleted.get(job_id)
            if deleted is None or (deleted.dev, deleted.attempt) != (walk.dev, job.attempt):
                deleted = DeletedFiles(job.pids, walk.dev, job.attempt)
                self._deleted[job_id] = deleted
            deleted.advance(DESCRIPTORS_PER_LOOK)
            hidden = deleted.counted
        held = walk.counted + hidden
        if walk.done or held > limit:
            self._walks.pop(job_id).close()  # the next look counts afresh
        return held if held > limit else None

    def close(self) -> None:
        for walk in self._walks.values():
            walk.close()
        self._walks.clear()
        self._deleted.clear()
