"""Writers of one database file queue at a gate that wakes them, not at SQLite's lock.

SQLite has one write lock. A ``BEGIN IMMEDIATE`` that finds it taken does not wait to be
woken: its busy handler sleeps and tries again, 1, 2, 5, 10, 15, 20, 25 ... 100 ms apart,
and a writer that comes later may take the lock between two tries. Under a stream of
submissions while the worker records ends and leases (bench/scheduler_bench.py's burst)
that polling was most of the API's time and all of the hand-over's long tail: a writer
slept for tens of milliseconds after the lock was free, and one that lost the race
slept longer each time (bench/RESULTS.md, "the slower kind of machine").

So every ``Database.write`` of this process first takes this gate (one per file, shared
by the API's threads, the worker and the daemon's other threads) and, for the other
processes on the file (``ddpq server`` beside ``ddpq worker``), an ``flock`` on a file
beside it: both wake a waiter as soon as the holder is done. SQLite's lock stays what
keeps writes apart; anything that writes without the gate (an admin command, a backup)
meets it and its busy timeout as before. A write inside a write on one thread passes the
gate (it meets SQLite's lock, as it did before the gate).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PATIENCE_S = 30.0  # as store.db's busy_timeout


class WriteGate:
    def __init__(self, path: Path) -> None:
        self._lock_path = path.with_name(path.name + ".write-lock")
        self._mutex = threading.RLock()
        self._depth = 0  # changed only by the thread that holds _mutex

    @contextmanager
    def held(self) -> Iterator[None]:
        if not self._mutex.acquire(timeout=PATIENCE_S):
            # Never a hang the lock alone would not have had: after as long as SQLite's
            # busy timeout, go on to its lock, which says "database is locked" as before.
            yield
            return
        try:
            self._depth += 1
            try:
                if self._depth > 1:
                    yield
                    return
                # Opened for each write, not kept: no descriptor per database for the
                # process's life, and a folder made anew is locked by its own file.
                fd = self._open()
                try:
                    if fd is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX)
                    yield
                finally:
                    if fd is not None:
                        os.close(fd)  # releases the flock
            finally:
                self._depth -= 1
        finally:
            self._mutex.release()

    def _open(self) -> int | None:
        try:
            return os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            # A read-only or missing folder: SQLite will say so on the write itself.
            return None


_gates: dict[Path, WriteGate] = {}
_gates_lock = threading.Lock()


def gate_for(path: Path) -> WriteGate:
    """The gate of the database file at ``path`` (one per file in this process)."""
    key = Path(os.path.abspath(path))
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _gates[key] = WriteGate(key)
        return gate
