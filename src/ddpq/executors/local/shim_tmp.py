"""The attempt's own temporary folder: the job's ``TMPDIR``, made empty before the job
starts and removed once every process of the job is gone.

Without it a job's temporary files go to the host's shared ``/tmp`` and stay there: torchrun
alone leaves a ``torchelastic_*`` folder behind on every run (it never removes the log
folder it makes), and a killed job leaves whatever it had open. Kept in the job's folder,
they are bounded with it (``--job-folder-max``) and go with the attempt.

The shim removes it as the job's account (it runs as that account by then), so nothing
here can reach a file that account could not remove itself. Still, a link is never
followed: the folder is walked by descriptors, each entry looked at without following
links and removed from the folder that holds it (a job that makes ``tmp/x`` a link to its
home loses the link, not its home). A folder the job left unreadable or read-only is made
0700 again, as its owner may. The walk is bounded in time and depth (``REMOVE_WITHIN_S``,
``MAX_DEPTH``): what a job left beyond them stays in its folder, emptied again by the next
attempt and removed with the folder by retention.

Standard library only, beside the shim and imported by it.
"""

from __future__ import annotations

import os
import stat
import time

# The longest an attempt's end waits on its temporary files: its GPUs are held until the
# shim exits, and `ddpq shell` waits 10 s for the end's record. What is left then goes
# with the next attempt or the folder.
REMOVE_WITHIN_S = 3.0
MAX_DEPTH = 64  # folders nested deeper than this are left (each level holds a descriptor)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fresh(path: str, within_s: float = REMOVE_WITHIN_S) -> str | None:
    """Make ``path`` an empty folder (0700) for the job; None, or why it could not be.

    Whatever is there already (an earlier attempt's files, a link, a file) is removed
    first. A folder of this account's that could not be emptied in time (or depth) is
    used as it is, made 0700 again: what is left in it is the same job's."""
    for first_try in (True, False):
        try:
            os.mkdir(path, 0o700)  # a first attempt's folder is new: nothing to remove
            return None
        except FileExistsError:
            if first_try:
                remove(path, within_s)
        except OSError as exc:
            return f"cannot make its temporary folder {path}: {exc.strerror or exc}"
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot make its temporary folder {path}: {exc.strerror or exc}"
    if not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()):
        return f"cannot make its temporary folder {path}: something else is there"
    try:
        fd = os.open(path, _DIR_FLAGS)
        try:
            os.fchmod(fd, 0o700)  # writable again, were it left read-only
        finally:
            os.close(fd)
    except OSError as exc:
        return f"cannot make its temporary folder {path}: {exc.strerror or exc}"
    return None


def remove(path: str, within_s: float = REMOVE_WITHIN_S) -> bool:
    """Remove ``path`` and, if it is a folder, everything in it, never following a link;
    give up after ``within_s`` seconds. True when nothing is left."""
    try:
        os.rmdir(path)  # what a job mostly leaves: an empty folder (rmdir follows no link)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, _DIR_FLAGS)
    except OSError:
        return False
    try:
        return _remove_entry(parent_fd, name, time.monotonic() + within_s, 0)
    finally:
        os.close(parent_fd)


def _remove_entry(dir_fd: int, name: str, deadline: float, depth: int) -> bool:
    """Remove ``name`` in the folder ``dir_fd``: a folder after its entries."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if stat.S_ISDIR(info.st_mode):
        if depth >= MAX_DEPTH or not _empty(dir_fd, name, deadline, depth + 1):
            return False
        remove_one = os.rmdir
    else:
        remove_one = os.unlink
    try:
        remove_one(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _empty(dir_fd: int, name: str, deadline: float, depth: int) -> bool:
    """Remove everything in the folder ``name`` (of ``dir_fd``); False if something stays."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        # The job's own folder that it made unreadable (chmod 000): its owner may open it
        # again. Asked of what was just seen as a folder; a link swapped in meanwhile
        # would be followed, but only to a file this same account may change anyway.
        try:
            os.chmod(name, 0o700, dir_fd=dir_fd)
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            return False
    except OSError:
        return False
    try:
        os.fchmod(fd, 0o700)  # a folder left read-only (0555) would keep what is in it
        empty = True
        # Removed as they are read (a folder of millions of names is never held whole).
        with os.scandir(fd) as entries:
            for entry in entries:
                if time.monotonic() > deadline:
                    return False
                empty = _remove_entry(fd, entry.name, deadline, depth) and empty
        return empty
    except OSError:
        return False
    finally:
        os.close(fd)
