"""Out of file descriptors or memory: a condition of the machine, never an answer about a caller.

Python's ``pwd`` and ``grp`` say "not found" (``KeyError``) whenever the C lookup returns
no entry, also when it could not read the password database at all: the daemon had no
descriptor left to open ``/etc/passwd`` or to reach sssd, or no memory. Taken at its word,
that told the callers of a daemon that had run out of descriptors that they had no account
(403). So a negative answer from the account database is believed only while this process
can open a file (``check``); otherwise the request fails with ``Exhausted``, which the API
answers 503 with its cause (``server.faults``), as it does any ``OSError`` of this class.
"""

from __future__ import annotations

import errno
import os

CAUSES = {
    errno.EMFILE: "the ddpq daemon has no file descriptor left (EMFILE)",
    errno.ENFILE: "the system has no file descriptor left (ENFILE)",
    errno.ENOMEM: "the ddpq daemon is out of memory (ENOMEM)",
    errno.ENOBUFS: "the system has no buffer space left (ENOBUFS)",
}


class Exhausted(Exception):
    """The daemon ran out of a resource; the message names it."""


def cause_of(exc: BaseException) -> str | None:
    """The exhausted resource, in words, if ``exc`` says one ran out; else None."""
    if isinstance(exc, Exhausted):
        return str(exc)
    if isinstance(exc, MemoryError):
        return CAUSES[errno.ENOMEM]
    if isinstance(exc, OSError) and exc.errno in CAUSES:
        return CAUSES[exc.errno]
    return None


def check() -> None:
    """Raise ``Exhausted`` if this process cannot open a file now (what a lookup in the
    password database needs first)."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        cause = cause_of(exc)
        if cause is None:
            raise
        raise Exhausted(cause) from exc
    os.close(fd)
