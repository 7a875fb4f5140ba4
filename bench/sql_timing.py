"""Time a ddpq daemon's SQLite transactions from inside it (a benchmark aid).

Every connection the daemon opens is made with a connection class that notes, per
thread name: how long each ``BEGIN IMMEDIATE`` waited for the write lock, how long the
lock was then held, how long the ``COMMIT`` took, and whether it wrote anything.

``DDPQ_BENCH_FSYNC_MS=N`` also emulates a slow disk: each commit that writes on a
``synchronous=FULL`` connection (one fdatasync of the WAL on a real disk) waits N ms
more before it commits, holding the write lock as the real fdatasync would. Each WAL
checkpoint (two more syncs, see ``PRAGMA wal_autocheckpoint``) is not emulated; count
those with strace.

Started by ``bench/sampled/sitecustomize.py`` when ``DDPQ_BENCH_SQL=PATH`` is set;
written to ``PATH.<pid>`` at exit.
"""

from __future__ import annotations

import atexit
import collections
import os
import sqlite3
import sys
import threading
import time

Stats = collections.defaultdict[str, list[float]]


def install(path: str, fsync_ms: float) -> None:
    stats: Stats = collections.defaultdict(list)
    guard = threading.Lock()

    def note(key: str, value: float) -> None:
        with guard:
            stats[f"{threading.current_thread().name}|{key}"].append(value)

    class Cursor(sqlite3.Cursor):
        def execute(self, sql, *args):  # type: ignore[no-untyped-def,override]
            conn = self.connection
            text = sql.strip().upper() if isinstance(sql, str) else ""
            if text.startswith("PRAGMA SYNCHRONOUS=FULL"):
                conn.full = True  # type: ignore[attr-defined]
            if text.startswith("BEGIN IMMEDIATE"):
                t0 = time.perf_counter()
                result = super().execute(sql, *args)
                now = time.perf_counter()
                note("lock wait ms", (now - t0) * 1000)
                conn.locked_at = now  # type: ignore[attr-defined]
                conn.changes_at = conn.total_changes  # type: ignore[attr-defined]
                return result
            return super().execute(sql, *args)

    class Connection(sqlite3.Connection):
        full = False
        locked_at: float | None = None
        changes_at = 0

        def cursor(self, factory=Cursor):  # type: ignore[no-untyped-def,override]
            return super().cursor(factory)

        def commit(self) -> None:
            locked_at, self.locked_at = self.locked_at, None
            wrote = locked_at is not None and self.total_changes != self.changes_at
            if wrote and self.full and fsync_ms:
                time.sleep(fsync_ms / 1000)
            t0 = time.perf_counter()
            super().commit()
            now = time.perf_counter()
            if locked_at is not None:
                note("commit ms" + (" (wrote)" if wrote else " (no change)"), (now - t0) * 1000)
                note("lock held ms", (now - locked_at) * 1000)

        def rollback(self) -> None:
            if self.locked_at is not None:
                note("lock held ms", (time.perf_counter() - self.locked_at) * 1000)
                self.locked_at = None
            super().rollback()

    plain = sqlite3.dbapi2.connect

    def connect(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("factory", Connection)
        return plain(*args, **kwargs)

    sqlite3.dbapi2.connect = connect  # type: ignore[assignment]
    sqlite3.connect = connect  # type: ignore[assignment]

    def dump() -> None:
        with open(f"{path}.{os.getpid()}", "w") as out:
            out.write(f"argv: {sys.orig_argv}\nemulated fsync: {fsync_ms} ms\n")
            out.write("thread | what | n | sum ms | p50 | p90 | p99 | max\n")
            for key in sorted(stats):
                values = sorted(stats[key])
                n = len(values)

                def q(f: float, v: list[float] = values, n: int = n) -> float:
                    return v[min(n - 1, round(f * (n - 1)))]

                out.write(
                    f"{key} | {n} | {sum(values):.0f} | {q(0.5):.2f} | {q(0.9):.2f} | "
                    f"{q(0.99):.2f} | {values[-1]:.2f}\n"
                )

    atexit.register(dump)
