"""Writers wait at the write gate (woken when the holder is done), not in SQLite's busy
handler, which sleeps up to 100 ms between tries (store.write_gate, bench/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from ddpq.store.db import Database
from ddpq.store.write_gate import gate_for

DEADLINE_S = 30.0


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    db = Database(tmp_path / "ddpq.db")
    with db.write() as s:
        s.execute(text("CREATE TABLE t (n INTEGER)"))
    db.dispose()
    yield tmp_path / "ddpq.db"


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.005)


def waits_at_the_gate(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked inside the gate (and so has not begun in SQLite)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code.co_name == "held"


def write_later(db: Database, seen: list[int]) -> threading.Thread:
    """A thread that writes once it may, noting how many rows it found committed."""

    def run() -> None:
        with db.write() as s:
            seen.append(s.execute(text("SELECT count(*) FROM t")).scalar_one())
            s.execute(text("INSERT INTO t VALUES (2)"))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def rows(db: Database) -> list[int]:
    with db.read() as s:
        return list(s.execute(text("SELECT n FROM t ORDER BY n")).scalars())


@pytest.mark.parametrize("durable", [True, False])
def test_a_writer_of_this_process_waits_at_the_gate_then_writes(path: Path, durable: bool) -> None:
    # The API's database (durable) and the worker's (not) are two objects on one file.
    api, other = Database(path), Database(path, durable=durable)
    seen: list[int] = []
    try:
        with api.write() as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
            thread = write_later(other, seen)
            wait_for("the second writer to wait at the gate", lambda: waits_at_the_gate(thread))
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
        assert seen == [1]  # it began after the first had committed
        assert rows(api) == [1, 2]
    finally:
        api.dispose()
        other.dispose()


HOLDER = """
import fcntl, sys
with open(sys.argv[1], "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def test_a_writer_waits_for_another_process_holding_the_gate(path: Path) -> None:
    # `ddpq server` and `ddpq worker` as two processes: the gate's file lock is shared.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path) + ".write-lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    db = Database(path)
    seen: list[int] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        thread = write_later(db, seen)
        wait_for("the writer to wait at the gate", lambda: waits_at_the_gate(thread))
        assert seen == []  # nothing begun while the other process holds it
        assert holder.stdin is not None
        holder.stdin.close()
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
        assert rows(db) == [2]
    finally:
        holder.kill()
        holder.wait()
        db.dispose()


def test_a_write_inside_a_write_on_one_thread_passes_the_gate(path: Path) -> None:
    gate = gate_for(path)
    with gate.held(), gate.held():  # re-entered: no hang on its own lock
        pass
    db = Database(path)
    try:
        with db.write() as s:
            s.execute(text("INSERT INTO t VALUES (3)"))
        assert rows(db) == [3]  # and the gate is free again
    finally:
        db.dispose()


def test_one_gate_per_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    assert gate_for(a) is gate_for(tmp_path / "." / "a.db")
    assert gate_for(a) is not gate_for(b)
