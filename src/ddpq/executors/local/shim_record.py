"""The shim's exit record: how an attempt ended, written once its processes are all gone.

Standard library only, imported by the shim, which runs with ``python -S``. The worker
reads the record back (``ddpq.jobdir.read_exit_record``) and validates it like any input.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

TYPE_CHECKING = False  # typing would cost milliseconds on every job's start path
if TYPE_CHECKING:
    from ddpq.executors.local import shim_log

RECORD_SPACE = 4096
# The exit record's file, RECORD_SPACE blanks written by the worker at the launch (or by
# the shim at its start, where those are gone). A disk filled while the job runs, by the
# job or by anyone, must still let its end be recorded ("the disk is full", or its exit
# status), not leave it "lost": the record is written over those blanks, which needs no
# new disk block.
RESERVED = {"fd": -1}

NOT_LAUNCHED: dict[str, object] = {
    "exit_code": None,
    "signal": None,
    "error": "the worker went away before the job started",
    "launched": False,
}


def clear(path: str) -> None:
    """Take away whatever the job left at ``path`` without following or writing it: a
    file or a link (a hard link's other names keep their file) is unlinked, a folder
    renamed aside. Raises OSError."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        os.rename(path, f"{path}.refused-{os.getpid()}")


def fresh_file(path: str) -> int:
    """A new file at ``path`` for writing, whatever the job left at that name: taken away
    (``clear``), never written through. Raises OSError."""
    clear(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def still_at(fd: int, path: str) -> bool:
    """Whether the file open as ``fd`` is still the one at ``path``. The job ran in this
    folder since the record's space was reserved, and may have put something else at its
    name (a link, a FIFO, a folder) or taken it away: the record is then written to a fresh
    file, so the attempt still ends with its exit status, not as lost. Its processes are all
    gone by now (the record comes last), so nothing changes the name after this look."""
    try:
        here, mine = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def room_left_at_launch(tmp: str) -> int:
    """A descriptor writing the blanks the worker left at ``tmp``, if they are as it left
    them (this account's regular file of RECORD_SPACE bytes, one name); else -1. Opened
    non-blocking: a FIFO put there instead refuses at once rather than hanging the shim."""
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    st = os.fstat(fd)
    own = st.st_uid == os.geteuid() and st.st_nlink == 1
    if own and stat.S_ISREG(st.st_mode) and st.st_size == RECORD_SPACE:
        return fd
    os.close(fd)
    return -1


def reserve_record(path: str) -> None:
    tmp = path + ".tmp"
    left = room_left_at_launch(tmp)
    if left >= 0:
        RESERVED["fd"] = left
        return
    try:
        fd = fresh_file(tmp)
    except OSError:
        return  # written the ordinary way at the end, if it can be
    try:
        os.write(fd, b" " * RECORD_SPACE)
    except OSError:
        os.close(fd)
        return
    RESERVED["fd"] = fd


def write_record(path: str, record: dict[str, object]) -> None:
    """Write the record atomically: a reader sees the whole record or none.

    No fsync: the record must survive the worker's crash, not a power cut (after
    which nothing of the job runs anyway, and a missing record reads as "lost").
    """
    import json

    # Which attempt this record is about, so a stale record is never taken for a new one.
    record = {**record, "attempt": os.environ.get("DDPQ_ATTEMPT")}
    data = json.dumps(record).encode()
    if len(data) > RECORD_SPACE and isinstance(record.get("error"), str):
        record["error"] = str(record["error"])[:500]
        data = json.dumps(record).encode()
    tmp = path + ".tmp"
    fd = RESERVED["fd"] if RESERVED["fd"] >= 0 else room_left_at_launch(tmp)
    RESERVED["fd"] = -1
    if fd >= 0 and len(data) <= RECORD_SPACE and still_at(fd, tmp):
        # Trailing blanks are valid JSON whitespace: the reader ignores them. Cut to the
        # record's room (shrinking takes no block): what the job appended to the file
        # while it ran would follow the record and spoil it (the attempt read as lost).
        os.pwrite(fd, data.ljust(RECORD_SPACE), 0)
        os.ftruncate(fd, RECORD_SPACE)
        os.close(fd)
    else:
        if fd >= 0:
            os.close(fd)
        with open(fresh_file(tmp), "wb") as f:
            f.write(data)
    try:
        os.replace(tmp, path)
    except IsADirectoryError:  # the job made a folder of the record's name
        clear(path)
        os.replace(tmp, path)


def failed_to_start(path: str, started_at: float, error: str) -> int:
    """Record an attempt that never ran its command (the worker reports the error)."""
    write_record(
        path,
        {
            "exit_code": None,
            "signal": None,
            "started_at": started_at,
            "ended_at": time.time(),
            "error": f"cannot start the job: {error}",
        },
    )
    return 0


def disk_error(what: str, exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full: {what} failed ({exc.strerror})"
    return f"{what} failed: {exc.strerror or exc}"


def not_launched(record_path: str) -> int:
    """The worker stored this attempt's handle, or died before it could: either way a
    record that says nothing ran lets the next worker put the job back in the queue."""
    sys.stderr.write("ddpq shim: the worker went away before the job started\n")
    now = time.time()
    try:  # contextlib would cost 3 ms of imports on every job's start path
        write_record(record_path, {**NOT_LAUNCHED, "started_at": now, "ended_at": now})
    except OSError:
        pass
    return 3


def finish(
    record_path: str, log: shim_log.CappedLog, status: int, started_at: float, error: str | None
) -> int:
    """Write the exit record of a job whose processes are all gone."""
    ended_at = time.time()
    try:
        log.close()
    except OSError as exc:
        error = error or disk_error("writing the job's log", exc)
    record: dict[str, object] = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "started_at": started_at,
        "ended_at": ended_at,
        "error": error,
        "log_dropped_bytes": log.dropped,
    }
    try:
        write_record(record_path, record)
    except OSError as exc:
        sys.stderr.write(f"ddpq shim: cannot write the exit record: {exc}\n")
        return 1
    return 0
