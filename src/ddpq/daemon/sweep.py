"""Measuring and removing finished jobs' folders, for retention (``daemon.janitor``).

A root daemon removes folders that their jobs (hostile, perhaps) wrote: a link planted
where a checkpoint was must never make it measure or delete anything outside the folder.
So no path inside a job's folder is ever resolved: each entry is reached from a
descriptor of the folder it is in (``dir_fd``), folders are opened with O_NOFOLLOW,
``unlink`` removes a link itself, and nothing on another filesystem is entered (a FUSE
mount a job made in its folder). What is a checkpoint and what a record is
``ddpq.jobdir``'s word (``is_checkpoint``). Entries that vanish meanwhile are skipped;
those that cannot be removed are counted as left, never raised.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddpq.jobdir import is_checkpoint


@dataclass(frozen=True)
class Usage:
    """Bytes on disk (allocated blocks, as `du` counts them) of a job's folder."""

    checkpoint_bytes: int
    record_bytes: int


@dataclass
class Removed:
    checkpoint_bytes: int = 0
    record_bytes: int = 0
    left: int = 0  # entries left in place: another filesystem, or changed while removed
    gone: bool = False  # the folder itself is gone (removed now, or not there)


# A job may nest folders deeper than a descriptor per level allows: removing, below this
# depth its subfolders are moved up to the top of its folder and removed from there.
MAX_DEPTH = 32
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@contextmanager
def _folder(name: str | Path, dir_fd: int | None, dev: int | None) -> Iterator[int | None]:
    """A descriptor of the folder ``name`` (relative to ``dir_fd``), or None if it is not a
    folder, is a link, or lies on another filesystem than ``dev``."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        yield fd if dev is None or os.fstat(fd).st_dev == dev else None
    finally:
        os.close(fd)


def _streamed(fd: int) -> Iterator[tuple[str, os.stat_result]]:
    """A folder's entries as read, never all in memory (a folder of millions of files):
    for measuring, which changes nothing in it."""
    try:
        names = os.scandir(fd)
    except OSError:
        return
    with names:
        try:
            for entry in names:
                try:
                    yield entry.name, entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
        except OSError:
            return  # the folder went away while read


def _entries(fd: int) -> Iterator[tuple[str, os.stat_result]]:
    """A folder's entries as they were when looked at: for removing, which must not meet
    the names it renames into the folder (``_Clearing._move_up``) while reading it."""
    try:
        names = os.listdir(fd)
    except OSError:
        return
    for name in names:
        try:
            yield name, os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile


def _bytes(st: os.stat_result) -> int:
    return st.st_blocks * 512


def folder_usage(jobs_dir: Path, name: str) -> Usage | None:
    """What the folder ``jobs_dir/name`` holds (None: there is no such folder), however deep
    its job nested it (a job must not hide bytes from its limit below some depth). Links
    are counted as themselves, never followed."""
    with _folder(jobs_dir, None, None) as top, _folder(name, top, None) as fd:
        if top is None or fd is None:
            return None
        dev = os.fstat(fd).st_dev
        usage = {True: 0, False: 0}
        for entry, st in _streamed(fd):
            size = _bytes(st)
            if stat.S_ISDIR(st.st_mode):
                with _folder(entry, fd, dev) as sub:
                    size += _tree_bytes(sub, dev) if sub is not None else 0
            usage[is_checkpoint(entry)] += size
        return Usage(checkpoint_bytes=usage[True], record_bytes=usage[False])


def _tree_bytes(top: int, dev: int) -> int:
    """What the folder open as ``top`` holds below it (see ``tree_sizes``)."""
    return sum(tree_sizes(top, dev))


def tree_sizes(top: int, dev: int) -> Iterator[int]:
    """The bytes of each entry below the folder open as ``top`` (left open), as it is met:
    a generator, so the per-job limit (``daemon.measure``) can walk a folder of millions
    of entries a share at a time. Walked with one descriptor at a time: down by name, back
    up by "..", which must be the folder it left (else the job moved it meanwhile and the
    walk ends with what it yielded). So any depth costs neither descriptors nor Python's
    stack; entries are streamed, never a whole folder's names in memory. Each folder
    entered yields 0 first: a run of empty folders yields no entry, and the walk's caller
    must see its clock between them too (a million empty folders are seconds)."""
    path: list[tuple[int, int]] = []  # the folders above the one open, by identity
    pending: list[list[str]] = []  # each level's subfolders still to walk
    fd = os.dup(top)
    try:
        while True:
            yield 0
            todo: list[str] = []
            for name, st in _streamed(fd):
                if stat.S_ISDIR(st.st_mode):
                    todo.append(name)
                yield _bytes(st)
            pending.append(todo)
            fd, current = -1, fd  # closed by _next_folder, whatever it finds
            fd, entered = _next_folder(current, pending, path, dev)
            while fd >= 0 and not entered:  # a climb or a skip: a step too
                yield 0
                fd, current = -1, fd
                fd, entered = _next_folder(current, pending, path, dev)
            if fd < 0:
                return
    finally:
        if fd >= 0:
            os.close(fd)


def _next_folder(
    fd: int, pending: list[list[str]], path: list[tuple[int, int]], dev: int
) -> tuple[int, bool]:
    """One step of the walk: the next folder to walk, open, and True; or, having climbed
    one level or skipped a folder it could not enter, the folder it is in, open, and
    False (the caller, having seen its clock, comes back for the next); or -1: done, or a
    folder above was moved meanwhile or is gone (what was counted stands). ``fd`` is
    closed, or returned."""
    try:
        while pending:
            if not pending[-1]:
                pending.pop()
                if not pending:
                    break
                parent = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd = parent
                if _identity(fd) != path.pop():
                    break
                return fd, False
            child = _open_below(fd, pending[-1].pop(), dev)
            if child is None:  # gone meanwhile, or another filesystem: skipped, a step
                return fd, False
            path.append(_identity(fd))
            os.close(fd)
            return child, True
    except OSError:
        pass
    os.close(fd)
    return -1, False


def _open_below(fd: int, name: str, dev: int) -> int | None:
    try:
        sub = os.open(name, _DIR, dir_fd=fd)
    except OSError:
        return None
    if os.fstat(sub).st_dev != dev:
        os.close(sub)
        return None
    return sub


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def remove_checkpoints(jobs_dir: Path, name: str) -> Removed:
    """Remove everything in ``jobs_dir/name`` but the records."""
    return _remove(jobs_dir, name, whole=False)


def remove_folder(jobs_dir: Path, name: str) -> Removed:
    """Remove the folder ``jobs_dir/name``: its checkpoints first, then the records, then
    the folder itself."""
    return _remove(jobs_dir, name, whole=True)


def _remove(jobs_dir: Path, name: str, *, whole: bool) -> Removed:
    removed = Removed()
    with _folder(jobs_dir, None, None) as top:
        if top is None:
            removed.gone = True
            return removed
        with _folder(name, top, os.fstat(top).st_dev) as fd:
            if fd is None:
                return _not_a_folder(top, name, removed, whole)
            clearing = _Clearing(fd, os.fstat(fd).st_dev, removed)
            clearing.clear(keep=lambda entry: not is_checkpoint(entry), checkpoints=True)
            if whole:
                clearing.clear(keep=lambda entry: False, checkpoints=False)
        if whole:
            try:
                os.rmdir(name, dir_fd=top)
                removed.gone = True
            except FileNotFoundError:
                removed.gone = True
            except OSError:
                removed.left += 1
    return removed


def _not_a_folder(top: int, name: str, removed: Removed, whole: bool) -> Removed:
    """``name`` is missing, a link or a file in the folder's place, or a mount point."""
    try:
        st = os.stat(name, dir_fd=top, follow_symlinks=False)
    except FileNotFoundError:
        removed.gone = True
        return removed
    except OSError:
        removed.left += 1
        return removed
    if stat.S_ISDIR(st.st_mode):
        removed.left += 1  # another filesystem mounted there: not ours to empty
    elif whole:
        try:
            os.unlink(name, dir_fd=top)  # the link itself, never what it points to
            removed.record_bytes += _bytes(st)
            removed.gone = True
        except OSError:
            removed.left += 1
    return removed


class _Clearing:
    """Empties one job folder from its descriptor, tallying what it removed."""

    def __init__(self, fd: int, dev: int, removed: Removed) -> None:
        self.fd = fd
        self.dev = dev
        self.removed = removed
        self.checkpoints = True
        self._deep: list[str] = []  # folders moved up from MAX_DEPTH, to remove from the top
        self._names = (f".ddpq-deep-{n}" for n in itertools.count())

    def clear(self, keep: Callable[[str], bool], checkpoints: bool) -> None:
        self.checkpoints = checkpoints
        for name, st in _entries(self.fd):
            if not keep(name):
                self._remove(self.fd, name, st, depth=0)
        # Each folder moved up is removed from the top, where it may move up more: one
        # level of Python's stack and one descriptor per level, however deep the job went.
        while self._deep:
            name = self._deep.pop()
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                continue
            self._remove(self.fd, name, st, depth=0)

    def _tally(self, st: os.stat_result) -> None:
        if self.checkpoints:
            self.removed.checkpoint_bytes += _bytes(st)
        else:
            self.removed.record_bytes += _bytes(st)

    def _remove(self, fd: int, name: str, st: os.stat_result, depth: int) -> None:
        if not stat.S_ISDIR(st.st_mode):
            self._unlink(fd, name, st)
            return
        if depth >= MAX_DEPTH:
            self._move_up(fd, name)
            return
        with _folder(name, fd, self.dev) as sub:
            if sub is None and not _is_folder(fd, name):
                # Swapped for a file or a link since it was looked at: remove that instead.
                self._unlink(fd, name, st)
                return
            if sub is not None:
                for entry, entry_st in _entries(sub):
                    self._remove(sub, entry, entry_st, depth + 1)
        try:
            os.rmdir(name, dir_fd=fd)
            self._tally(st)
        except FileNotFoundError:
            pass
        except OSError:
            self.removed.left += 1  # another filesystem, or filled again meanwhile

    def _unlink(self, fd: int, name: str, st: os.stat_result) -> None:
        try:
            os.unlink(name, dir_fd=fd)  # a link is removed, never what it points to
            self._tally(st)
        except FileNotFoundError:
            pass
        except OSError:
            self.removed.left += 1

    def _move_up(self, fd: int, name: str) -> None:
        """A folder MAX_DEPTH down: renamed (by descriptors: no path resolved) to the top
        of the job's folder, and removed from there later."""
        for _ in range(100):
            new = next(self._names)
            if _exists(self.fd, new):
                continue  # the job made that name itself
            try:
                os.rename(name, new, src_dir_fd=fd, dst_dir_fd=self.fd)
            except OSError:
                break
            self._deep.append(new)
            return
        self.removed.left += 1


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _is_folder(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
