"""Room kept for the database on the disk that holds it (``state_reserve``, 64M by default).

A job that fills the disk its folder shares with the database would otherwise leave the
daemon unable to write anything: no submission, but also no cancel of that job and no
record of its end. So the daemon keeps a file of allocated blocks, ``db-reserve``, in the
state folder, and three rules:

- a write that must happen (a cancel, a hold, the worker's records) and fails because the
  disk is full gives back a quarter of the reserve (``give_back``) and is tried again, as
  long as some is left (``Database.making_room``);
- while less than the reserve's size is free beside it, new work is refused (``shortage``:
  a 507 naming the cause), so that submissions never take the room cancels need;
- once there is room again (the reserve's size free beside it after it is made whole),
  the reserve is made whole again (``fill``: the disk watch of the process that runs jobs,
  ``daemon.quota``, when it starts and every few seconds).

The blocks are the file's own: a job cannot take them while the file holds them, only once
they are given back, and then any writer may. So the process that gives them back holds
the jobs still meanwhile (``pause_jobs``: their cgroups frozen, ``executors.local.freeze``)
and, once the write is done, takes back into the reserve what it left free (``reclaim``)
before they run again. The exact bound is a filesystem of their own for the job folders
(docs/admin.md). The state folder is the daemon's alone (0711, owned
by it), so no job can put a link where the file is; it is opened without following one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from ddpq.core.out_of_room import out_of_room
from ddpq.core.units import size_for_people

log = logging.getLogger("ddpq.store")

# The reserve is given back in this many parts: a job still writing may take the first
# part before the write it was given back for, and then there is another.
PARTS = 4
RECLAIM_STEP = 1 << 20
_OPEN = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write on the filesystem of ``folder``: root may also
    use the blocks an ext4 filesystem keeps for root, others may not."""
    st = os.statvfs(folder)
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


# At most this share of the state folder's filesystem: on a small disk the reserve the
# setting asks for could never be made (it is made only with as much again free beside
# it), and a daemon without one has nothing to give back for a cancel.
MAX_SHARE_OF_DISK = 8
_said_fitted: set[Path] = set()


def fitted(folder: Path, size: int) -> int:
    """``size``, or an eighth of the filesystem holding ``folder`` where that is less
    (said once per folder)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return size  # no folder yet: the setting as it is
    share = st.f_blocks * st.f_frsize // MAX_SHARE_OF_DISK
    if size <= share:
        return size
    if folder not in _said_fitted:
        _said_fitted.add(folder)
        log.warning(
            "the database's reserve is %s, not %s: an eighth of the disk holding %s",
            size_for_people(share),
            size_for_people(size),
            folder,
        )
    return share


class Reserve:
    """The reserve file of one state folder; safe to use from several threads."""

    def __init__(
        self,
        path: Path,
        size: int,
        pause_jobs: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.path = path
        self.size = fitted(path.parent, size)
        # Holds every job still for a block (none given: jobs are not held).
        self.pause_jobs = pause_jobs
        self._lock = threading.Lock()
        self._given_back = False  # since it was last whole: said once, and once when whole

    def held(self) -> int:
        """Bytes the reserve holds now (allocated blocks, not its apparent size)."""
        try:
            return os.stat(self.path, follow_symlinks=False).st_blocks * 512
        except FileNotFoundError:
            return 0

    def fill(self) -> bool:
        """Make the reserve whole if there is room for it and its size again beside it;
        whether it is whole now."""
        if self.size <= 0:
            # Turned off: the blocks of an earlier reserve are the disk's again.
            with self._lock, contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return True
        with self._lock:
            missing = self.size - self.held()
            try:
                if missing <= 0:
                    # Taken back whole after a must-write (``reclaim``): said once the
                    # disk has room beside it again.
                    if self._given_back and free_bytes(self.path.parent) >= self.size:
                        self._say_whole()
                    return True
                if free_bytes(self.path.parent) < missing + self.size:
                    return False
                fd = os.open(self.path, _OPEN, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                finally:
                    os.close(fd)
            except OSError as exc:
                if not out_of_room(exc):
                    log.warning("cannot make the database's reserve %s: %s", self.path, exc)
                return False
            if self._given_back:
                self._say_whole()
            return True

    def _say_whole(self) -> None:
        log.info("the database's reserve is whole again (%s)", size_for_people(self.size))
        self._given_back = False

    def jobs_paused(self) -> AbstractContextManager[object]:
        """The jobs held still for the block, where this process can hold them."""
        return self.pause_jobs() if self.pause_jobs is not None else nullcontext()

    def reclaim(self) -> None:
        """Take back into the reserve what is free now, up to its size: after the write it
        was given back for, before the jobs run again (else the rest is any writer's)."""
        if self.size <= 0:
            return
        with self._lock:
            held = self.held()
            try:
                target = min(self.size, held + free_bytes(self.path.parent))
            except OSError:
                return
            while target > held:
                try:
                    fd = os.open(self.path, _OPEN, 0o600)
                    try:
                        os.posix_fallocate(fd, 0, target)
                    finally:
                        os.close(fd)
                    return
                except OSError as exc:
                    if not out_of_room(exc):
                        log.warning("cannot take back the database's reserve: %s", exc)
                        return
                    target -= RECLAIM_STEP  # metadata took a few blocks: a little less

    def give_back(self) -> bool:
        """Free a part of the reserve for the write that the full disk refused; False if
        none is left to free."""
        with self._lock:
            held = self.held()
            if held <= 0:
                return False
            left = max(0, held - max(self.size // PARTS, 1))
            try:
                os.truncate(self.path, left)
            except OSError as exc:
                log.error("cannot give back the database's reserve %s: %s", self.path, exc)
                return False
            # Said once until it is whole again: on a disk kept full every must-write
            # gives back and takes back.
            log.log(
                logging.DEBUG if self._given_back else logging.WARNING,
                "the disk holding ddpq's state is full: gave back %s of the database's "
                "reserve so that cancels and jobs' ends can still be written (%s left); "
                "new jobs are refused until there is room",
                size_for_people(held - left),
                size_for_people(left),
            )
            self._given_back = True
            return True

    def shortage(self) -> str | None:
        """Why new work is refused now (less than the reserve's size free beside it), or
        None."""
        if self.size <= 0:
            return None
        try:
            free = free_bytes(self.path.parent)
        except OSError:
            return None  # the folder cannot be looked at: the write itself will say
        if free >= self.size:
            return None
        return (
            f"the disk holding ddpq's state is full ({size_for_people(free)} free in "
            f"{self.path.parent}, less than the {size_for_people(self.size)} kept for "
            "cancels and jobs' ends): new jobs are refused until an admin makes room; "
            "cancel, hold and release still work"
        )
