"""The shim's job log: append-only, under a size cap (head and newest part kept).

Standard library only, imported by the shim, which runs with ``python -S``.
"""

from __future__ import annotations

import os

# Beside this file (the shim's way, ``python -S``), or ddpq's module (imported by tests).
if __package__:
    from ddpq.executors.local.shim_record import fresh_file
else:
    from shim_record import fresh_file  # type: ignore[import-not-found,no-redef]


class CappedLog:
    """Append-only log that keeps its first quarter and newest part under ``cap`` bytes.

    When the file grows past ``cap`` plus some slack, it is rewritten (temp file
    + rename) as head + a line saying how much was dropped + the newest bytes.
    The slack makes rewrites rare: at most one per ``cap/2`` bytes of output.
    """

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self.cap = max(cap, 4096)
        self.head = self.cap // 4
        self.dropped = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n
        if self.size > self.cap + self.cap // 2:
            self.compact()

    def compact(self) -> None:
        if self.size <= self.cap:
            return
        with open(self.path, "rb") as f:
            head = f.read(self.head)
            tail_len = self.cap - self.head
            f.seek(self.size - tail_len)
            tail = f.read()
        self.dropped += self.size - len(head) - len(tail)
        marker = (
            f"\n[ddpq: log over its cap of {self.cap} bytes; "
            f"{self.dropped} bytes dropped here in all, newest output follows]\n"
        ).encode()
        tmp = self.path + ".tmp"
        with open(fresh_file(tmp), "wb") as f:
            f.write(head + marker + tail)
        os.replace(tmp, self.path)
        old = os.fstat(self.fd)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = os.fstat(self.fd).st_size
        follow_with_stderr(old, self.fd)

    def close(self) -> None:
        self.compact()
        os.close(self.fd)


def follow_with_stderr(old: os.stat_result, fd: int) -> None:
    """Where ddpq started the shim, its stderr is its log (``spawn``): after a rewrite it
    is moved to the new file, or what the shim has to say would go to the unlinked one.
    A stderr that was not the log (a shim started by hand) stays where it is."""
    try:
        err = os.fstat(2)
    except OSError:
        return
    if (err.st_dev, err.st_ino) == (old.st_dev, old.st_ino):
        os.dup2(fd, 2)
