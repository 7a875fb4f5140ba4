"""Time a ddpq daemon's SQLite transactions from inside it (a benchmark aid).

Every connection the daemon opens is made with a connection class that notes, per
thread name: how long each ``BEGIN IMMEDIATE`` waited for the write lock, how long the
lock was then held, how long the ``COMMIT`` took, and whether it wrote anything.

``DDPQ_BENCH_FSYNC_MS=N`` also emulates a slow disk: each commit that writes on a
``synchronous=FULL`` connection (one fdatasync of the WAL on a real disk) waits N ms
more before it commits, holding the write lock as the real fdatasync would; where the
durable writes sync the WAL after the lock (``ddpq.store.db.sync_log``), each of those
syncs waits N ms more, and the lock is free meanwhile. Each WAL
checkpoint (two more syncs, see ``PRAGMA wal_autocheckpoint``) is not emulated; count
those with strace.

Started by ``bench/sampled/sitecustomize.py`` when ``DDPQ_BENCH_SQL=PATH`` is set;
written to ``PATH.<pid>`` at exit.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import os
import resource
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
                if "AnyIO worker thread|first write at s" not in stats:
                    note("first write at s", now - t_start)
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
    gate_timed = []

    def time_the_gate() -> None:
        # ddpq.store.write_gate (where there is one): the wait before BEGIN moved there.
        gate = sys.modules.get("ddpq.store.write_gate")
        if gate is None or gate_timed:
            return
        gate_timed.append(True)
        held = gate.WriteGate.held
        db = sys.modules.get("ddpq.store.db")
        sync_log = getattr(db, "sync_log", None)
        if sync_log is not None and fsync_ms:

            def slow_sync(path):  # type: ignore[no-untyped-def]
                time.sleep(fsync_ms / 1000)
                t0 = time.perf_counter()
                sync_log(path)
                note("log sync ms", (time.perf_counter() - t0) * 1000)

            db.sync_log = slow_sync  # type: ignore[union-attr]

        @contextlib.contextmanager
        def timed(self):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            with held(self):
                note("gate wait ms", (time.perf_counter() - t0) * 1000)
                yield

        gate.WriteGate.held = timed

    def connect(*args, **kwargs):  # type: ignore[no-untyped-def]
        time_the_gate()
        kwargs.setdefault("factory", Connection)
        return plain(*args, **kwargs)

    sqlite3.dbapi2.connect = connect  # type: ignore[assignment]
    sqlite3.connect = connect  # type: ignore[assignment]

    def dump() -> None:
        with open(f"{path}.{os.getpid()}", "w") as out:
            out.write(f"argv: {sys.orig_argv}\nemulated fsync: {fsync_ms} ms\n")
            use = resource.getrusage(resource.RUSAGE_SELF)
            first = stats.get("AnyIO worker thread|first write at s", ["none"])
            out.write(f"full collections (s after start, ms): {full}; first API write {first}\n")
            out.write(f"cpu: user {use.ru_utime:.2f} s, sys {use.ru_stime:.2f} s\n")
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

    started: dict[str, float] = {}
    full: list[tuple[float, float]] = []  # (when, after start in s; how long, ms)
    t_start = time.perf_counter()

    def collecting(phase: str, info: dict[str, int]) -> None:
        # The cyclic collector's pauses, by generation (they stop every thread).
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            now = time.perf_counter()
            note(f"gc gen{info['generation']} ms", (now - started["t"]) * 1000)
            if info["generation"] == 2:
                full.append((started["t"] - t_start, (now - started.pop("t")) * 1000))

    gc.callbacks.append(collecting)
    atexit.register(dump)
