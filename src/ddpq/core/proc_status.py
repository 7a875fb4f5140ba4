"""A process's uids as its ``/proc/PID/status`` says them: text the process's own name is
part of, so read as hostile input. Pure: the callers read the file (``ddpq.procfs``, the
local executor's ``procs``)."""

from __future__ import annotations

# Bytes of a status file read at most: the kernel's is about 1.5 KiB.
STATUS_LIMIT = 16 * 1024
UID_MAX = (1 << 32) - 2  # (uid_t)-1 is "no uid"
REAL, EFFECTIVE = 0, 1  # the fields of the "Uid:" line: real, effective, saved, fs


def status_uid(data: bytes, field: int = REAL) -> int | None:
    """The uid in ``field`` of the status text ``data``; None if it says nonsense.

    The kernel escapes a newline in the process's name (the first line), but should a
    name still make a line, it would come before the kernel's own "Uid:" line: the last
    one is the kernel's."""
    uid: int | None = None
    for line in data.split(b"\n"):
        if line.startswith(b"Uid:"):
            fields = line[4:].split()
            good = len(fields) == 4 and all(f.isdigit() and len(f) <= 10 for f in fields)
            uid = int(fields[field]) if good else None
    return uid if uid is not None and uid <= UID_MAX else None
