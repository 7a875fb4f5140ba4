"""This host's processes as ``/proc`` tells them: whose a process is, what it is called.

Shared by the worker (naming outside GPU use, who holds a rendezvous port) and the API
(who listens on a session's port), which may not import each other. Everything read here
is hostile input: a process chooses its name, may end between two reads (then its PID
may be another's), and ``/proc`` may be mounted with ``hidepid`` (a daemon that is not
root then sees no other account's processes). What cannot be read is None, never a guess;
the PIDs mean something only in the host's PID namespace.
"""

from __future__ import annotations

import pwd
from pathlib import Path

from ddpq.core.names import UNIX_NAME
from ddpq.core.proc_status import STATUS_LIMIT, status_uid

PROC = Path("/proc")
ENVIRON_LIMIT = 256 * 1024  # ARG_MAX-sized environments exist; more is not a job's
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
COMM_CHARS = 15  # TASK_COMM_LEN - 1


def process_uid(pid: int, proc: Path = PROC) -> int | None:
    """The real uid of process ``pid`` (the ``Uid:`` line of its status: the account that
    started it, as ``ps -o ruser`` shows; a setuid program still counts as whoever ran
    it); None if it is gone, hidden, or says nonsense."""
    if not 0 < pid <= PID_MAX:
        return None
    try:
        with open(proc / str(pid) / "status", "rb") as f:
            data = f.read(STATUS_LIMIT)
    except OSError:  # gone (ENOENT, ESRCH), hidden (EACCES, hidepid), or no /proc at all
        return None
    return status_uid(data)


def account_name(uid: int) -> str | None:
    """The account name of ``uid``, if it has one that is a proper Unix name."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None
    return name if UNIX_NAME.match(name) else None


def process_name(pid: int, proc: Path = PROC) -> str | None:
    """The process's own name (``comm``, its choice): printable characters only, others
    shown as ``?``, so that it can stand in a reason anyone reads."""
    if not 0 < pid <= PID_MAX:
        return None
    try:
        with open(proc / str(pid) / "comm", "rb") as f:
            raw = f.read(COMM_CHARS + 1).rstrip(b"\n")[:COMM_CHARS]
    except OSError:
        return None
    text = raw.decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() and ch != "\ufffd" else "?" for ch in text)


def environment(pid: int, proc: Path = PROC) -> dict[bytes, bytes] | None:
    """Process ``pid``'s environment as it started (only root and its own account may
    read it); None if it cannot be read."""
    if not 0 < pid <= PID_MAX:
        return None
    try:
        with open(proc / str(pid) / "environ", "rb") as f:
            data = f.read(ENVIRON_LIMIT)
    except OSError:
        return None
    out: dict[bytes, bytes] = {}
    for entry in data.split(b"\0"):
        name, eq, value = entry.partition(b"=")
        if eq:
            out.setdefault(name, value)
    return out
