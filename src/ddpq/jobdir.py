"""A job's folder: every file ddpq reads or writes there, and the only code that opens them.

Each job has a folder of its own (``<home>/jobs/<id>``, 0700, its owner's), which the job
may write anything into: a link where its log was (symbolic, or a hard link to another
account's file), a FIFO, a folder, a forged exit record, a progress line nested 5,000
deep. So every file here is opened without following links or waiting on a lease, must
be a regular file, and is read with a bound; what the worker stores passes ``core.untrusted``.
A root daemon writes only to the account's own single-named file or to a file it has just
made (``open_for_append``), and a job's folder is new to it (``make_folder``). The
worker, the executors and the API's log reader all go through this module, so a file's
name and the rules for opening it are written once.

The shim (started by file path, standard library only) is handed these files' paths as
flags (``executors.local.shim_command.shim_args``), never their names.

A job's *checkpoints* are everything in its folder but the records above (``is_checkpoint``):
what it wrote to resume from, and anything else it left. Retention removes them first, the
records only when that is not enough or the job is old enough (``ddpq.daemon.sweep``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ddpq.core.finite import finite_float
from ddpq.core.rules import ExitRecord
from ddpq.core.untrusted import clean_text, nesting_depth, parse_progress

# The job's stdout and stderr, as the shim writes them (head + newest part under a cap),
# after the attempt's header; the shim's own complaints go there too (its stderr).
LOG = "output.log"
# How the attempt ended, written atomically by the shim once the job's processes are gone.
EXIT_RECORD = "exit.json"
# Progress lines the job itself appends (the job contract): the newest good one is shown.
METRICS = "metrics.jsonl"
# An interactive session's terminal, which its shim serves on this Unix socket (0600), and
# a line the worker has for it (the idle warning), which the shim writes into the terminal.
TTY_SOCKET = "tty.sock"
NOTICE = "notice"
# The Slurm executor's batch script for the latest attempt, as ddpq rendered and submitted it.
SBATCH_SCRIPT = "job.sbatch"
# What Slurm itself writes for the batch step (its own notices, the shim's complaints): the
# job's output goes to LOG through the shim, which rewrites LOG under its cap.
SLURM_OUTPUT = "slurm.out"

# The attempt's own temporary folder, the job's TMPDIR (executors.contract.own_tmp): made
# empty by the shim before the job starts and removed after it (executors.local.shim_tmp).
TMP = "tmp"

# Where the shim writes the record and a log over its cap before renaming them in place.
SHIM_SCRATCH = (f"{EXIT_RECORD}.tmp", f"{LOG}.tmp")

# The records: ddpq's and the job's account of what happened. All else is checkpoints.
RECORDS = frozenset({LOG, EXIT_RECORD, METRICS, TTY_SOCKET, NOTICE})
NOTICE_MAX = 4096

EXIT_RECORD_MAX = 64 * 1024
PROGRESS_TAIL = 16 * 1024
# How much of a log's end is read to tell a rendezvous port clash from another failure.
LOG_TAIL = 64 * 1024
# Where a folder goes that was at a job's folder's name but was not the job's (see
# ``make_folder``): under the jobs folder, root's and 0700, named ``<id>-<time>-<random>``.
STALE = ".stale"

log = logging.getLogger("ddpq.jobdir")


@dataclass(frozen=True)
class JobDir:
    """The folder of one job and the paths of the files in it."""

    path: Path

    @property
    def log(self) -> Path:
        return self.path / LOG

    @property
    def exit_record(self) -> Path:
        return self.path / EXIT_RECORD

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def tmp(self) -> Path:
        return self.path / TMP

    @property
    def tty_socket(self) -> Path:
        return self.path / TTY_SOCKET

    @property
    def notice(self) -> Path:
        return self.path / NOTICE

    def write_notice(self, text: str) -> None:
        """Leave ``text`` for the session's shim to write into its terminal (it is told with
        a signal). The job owns this folder: written to a new file of a name no one can
        foresee (O_EXCL, no link followed) and renamed over whatever is there, so a root
        worker writes nothing but its own new file. Raises OSError."""
        data = text.encode()[:NOTICE_MAX]
        tmp = self.path / f".{NOTICE}.{os.urandom(8).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            # The shim reads it as the job's account; the daemon's umask (077) would keep
            # it root's alone. The folder (0700, the account's) keeps it from others.
            os.fchmod(fd, 0o644)
            os.write(fd, data)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, self.notice)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    @property
    def sbatch_script(self) -> Path:
        return self.path / SBATCH_SCRIPT

    @property
    def slurm_output(self) -> Path:
        return self.path / SLURM_OUTPUT

    def read_exit_record(self, attempt: int) -> ExitRecord | None:
        return read_exit_record(self.path, attempt)

    def read_progress(self) -> dict[str, Any] | None:
        return read_progress(self.path)

    def log_tail(self, size: int = LOG_TAIL) -> str:
        return read_regular(self.log, size, tail=True).decode(errors="replace")


def read_regular(path: Path, size: int, tail: bool = False) -> bytes:
    """Up to ``size`` bytes of ``path`` (its end with ``tail``), only if it is a regular file
    of the folder's owner with one name (``_open_regular``).

    O_NOFOLLOW, the file-type, link-count and owner checks: a job that swaps a file of its
    folder for a link must not get a root daemon to read something else; O_NONBLOCK so a
    FIFO cannot hang it.
    """
    fd = _open_regular(path)
    if fd is None:
        return b""
    with os.fdopen(fd, "rb") as f:
        if tail:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
        return f.read(size)


def read_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """``limit`` bytes of ``path`` from ``offset`` and the file's size; (b"", 0) unless it is a
    regular file (the same rules as ``read_regular``: a link in place of a log serves nothing)."""
    fd = _open_regular(path)
    if fd is None:
        return b"", 0
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if offset >= info.st_size:
            return b"", info.st_size
        f.seek(offset)
        return f.read(limit), info.st_size


def _open_regular(path: Path) -> int | None:
    """A descriptor reading ``path`` if it is a regular file of the folder's owner with no
    other name; None otherwise (checked before any file object is made of it: Python
    refuses a folder's with an exception).

    A hard link is no link to O_NOFOLLOW: where ``fs.protected_hardlinks`` is 0, a job could
    link /etc/shadow into its folder as its log and have a root daemon serve it. What the
    job's account wrote is its own, with one name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        owner = os.stat(path.parent).st_uid
        ours = stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == owner
    except OSError:
        ours = False
    if not ours:
        os.close(fd)
        return None
    return fd


def open_for_append(path: Path, owner: tuple[int, int] | None) -> BinaryIO:
    """Open a file of the job's folder for appending: the job's own file, or a new one.

    The job owns its folder and may have put anything at this name: a symbolic link, a
    hard link to another account's file (O_NOFOLLOW does not stop those), a FIFO, a
    folder. A root daemon appends only to a regular file that the job's account owns and
    that has no other name: what the account could write itself. Anything else is taken
    away (``remove_entry``: never followed, never written) and a file is made afresh
    (O_EXCL), handed to ``owner`` (uid, gid; None: the daemon's own account runs the
    job). An existing file is never chowned.
    """
    uid = owner[0] if owner is not None else os.geteuid()
    for _ in range(_TRIES):
        fd = _open_own(path, uid)
        if fd is None:
            remove_entry(path)
            fd = _create(path, owner)
        if fd is not None:
            return os.fdopen(fd, "ab")
    raise OSError(errno.EEXIST, "something keeps taking the place of the file", str(path))


def append_if_own(path: Path, uid: int, data: bytes) -> bool:
    """Append ``data`` to ``path`` only if it is the account ``uid``'s own file (the rules
    of ``open_for_append``), replacing nothing; whether it was written."""
    fd = _open_own(path, uid)
    if fd is None:
        return False
    with os.fdopen(fd, "ab") as f:
        f.write(data)
    return True


# Rounds of "take away what is there, create it anew" before giving up on a job that keeps
# putting something back at the name in between.
_TRIES = 5
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC


def _open_own(path: Path, uid: int) -> int | None:
    """A descriptor appending to ``path`` if it is a regular file of ``uid`` with one link;
    None if there is nothing there or something else.

    Looked at through an O_PATH descriptor (which opens nothing: no FIFO blocks, no
    device wakes) and reopened through /proc for writing: the file checked is the file
    written, whatever the job renames meanwhile. O_NONBLOCK: an open that must break a
    lease the account holds (F_SETLEASE) would wait 45 s; it fails at once instead."""
    try:
        ref = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(ref)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != uid:
            return None
        try:
            return os.open(f"/proc/self/fd/{ref}", _APPEND | os.O_NONBLOCK)
        except BlockingIOError:  # a lease held on it: something else
            return None
    finally:
        os.close(ref)


def _create(path: Path, owner: tuple[int, int] | None) -> int | None:
    """A new file at ``path`` (None: the name was taken again meanwhile)."""
    try:
        fd = os.open(path, _APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return None
    try:
        if owner is not None:
            os.fchown(fd, *owner)  # our own new file: nothing else is given away
    except OSError:
        os.close(fd)
        raise
    return fd


def remove_entry(path: Path) -> None:
    """Take away whatever is at ``path`` in a job's folder without following it: a file,
    a link or a FIFO is unlinked (a hard link's other names keep their file, untouched), a
    folder is renamed aside in the same folder (``.NAME.refused-XXXX``)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):  # Linux says EISDIR for a folder
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise
        os.rename(path, path.with_name(f".{path.name}.refused-{os.urandom(4).hex()}"))


def make_folder(folder: JobDir, first: bool, owner: tuple[int, int] | None) -> Path | None:
    """The job's folder, ready for an attempt: 0700, ``owner``'s (None: the daemon's),
    with no earlier exit record or notice. Returns where a folder that was not this job's
    was moved (None if none was).

    A folder is the job's only if its first attempt made it: one already there then (a
    restored database hands out ids that have folders, say) is someone else's history,
    and one owned by another account is not the job's at any attempt. Such a folder is
    moved under ``jobs/.stale`` (root's, 0700) and a new one made: root never chowns
    another job's files to this job's owner.
    """
    uid = owner[0] if owner is not None else os.geteuid()
    moved = None
    try:
        info: os.stat_result | None = os.lstat(folder.path)
    except FileNotFoundError:
        info = None
    if info is not None and (first or not stat.S_ISDIR(info.st_mode) or info.st_uid != uid):
        moved = move_aside(folder.path)
        log.warning(
            "job folder %s was not this job's (%s): moved to %s, a new one made",
            folder.path,
            "there before its first attempt" if first else "another account's",
            moved,
        )
    folder.path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder.path, 0o700)
    fd = os.open(folder.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o700)  # its owner's (and the daemon's) alone
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
    # An earlier attempt's record and a session's last notice (the worker writes anew),
    # and whatever sits where the shim writes its scratch files (a folder there would
    # keep it from writing its record).
    for name in (EXIT_RECORD, NOTICE, *SHIM_SCRATCH):
        remove_entry(folder.path / name)
    return moved


def move_aside(path: Path) -> Path:
    """Move ``path`` (a job folder, or whatever is at its name) into ``jobs/.stale`` under a
    name that says which job's and when, where only root can reach it."""
    stale = path.parent / STALE
    with contextlib.suppress(FileExistsError):
        os.mkdir(stale, 0o700)
    if not stat.S_ISDIR(os.lstat(stale).st_mode):
        raise OSError(errno.ENOTDIR, "not a folder", str(stale))
    os.chmod(stale, 0o700)
    when = time.strftime("%Y%m%dT%H%M%S")
    dest = stale / f"{path.name}-{when}-{os.urandom(3).hex()}"
    os.rename(path, dest)
    return dest


def read_exit_record(job_dir: Path, attempt: int) -> ExitRecord | None:
    """The shim's record of how ``attempt`` ended; None if there is none (yet).

    The job can write its own folder, so the record is checked like any input: a
    record of the wrong shape counts as none (the job is then lost), never as a crash
    of the worker.
    """
    # The shim pads its record with blanks (it writes over space reserved at its start).
    raw = read_regular(job_dir / EXIT_RECORD, EXIT_RECORD_MAX).decode(errors="replace").strip()
    if not raw or nesting_depth(raw) > 2:  # the shim writes one flat object
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or str(data.get("attempt")) != str(attempt):
        return None  # missing, malformed, or left over from an earlier attempt
    code, sig, error = data.get("exit_code"), data.get("signal"), data.get("error")
    began, finished = finite_float(data.get("started_at")), finite_float(data.get("ended_at"))
    launched = data.get("launched", True)
    if (
        not all(v is None or (type(v) is int and abs(v) < 2**31) for v in (code, sig))
        or began is None
        or finished is None
        or (error is not None and not isinstance(error, str))
        or not isinstance(launched, bool)
    ):
        return None
    text = clean_text(error, 500) if error else None
    return ExitRecord(code, sig, began, finished, text, launched)


def read_progress(job_dir: Path) -> dict[str, Any] | None:
    """The newest well-formed record of the job's metrics.jsonl, cleaned; None if none.

    Only the file's end is read, and each line goes through ``core.untrusted.parse_progress``:
    a job writes this file, so a hostile line is skipped, never raised.
    """
    text = read_regular(job_dir / METRICS, PROGRESS_TAIL, tail=True).decode(errors="replace")
    for line in reversed(text.splitlines()):
        record = parse_progress(line)
        if record is not None:
            return record
    return None


def is_checkpoint(name: str) -> bool:
    """An entry at the top of a job's folder that is not one of the records."""
    return name not in RECORDS
