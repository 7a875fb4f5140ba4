"""Upgrading from the first release: a database of schema 0001 with jobs in every state
(tests/fixtures/first_release.sql) is migrated when the daemon starts, and the daemon shows
the same jobs. Jobs running across the upgrade: one whose shim still runs is re-adopted
(its shim's pid and start time move from the job row to its attempt's handle, migration
0003) and its end is recorded when it ends; one whose shim died meanwhile ends lost, and
the job waiting on it is cancelled; the queued one runs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from alembic import command

from ddpq.executors.local import procs
from ddpq.store.db import alembic_config
from tests.helpers import Daemon, wait_done, wait_for, wait_state

FIXTURE = Path(__file__).parent / "fixtures" / "first_release.sql"

# A stand-in for the first release's shim of job 5: it runs until told to end, then writes
# the exit record a shim writes (atomically, after the job's processes are gone) and exits.
STAND_IN = """
import json, os, sys, time
folder = sys.argv[1]
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.02)
record = {"attempt": 1, "exit_code": 0, "signal": None, "started_at": 1764090001.0,
          "ended_at": time.time(), "error": None, "launched": True}
with open(os.path.join(folder, "exit.json.tmp"), "w") as f:
    json.dump(record, f)
os.replace(os.path.join(folder, "exit.json.tmp"), os.path.join(folder, "exit.json"))
"""


def identity_of(proc: subprocess.Popen[bytes]) -> procs.Identity:
    ident = wait_for(lambda: procs.identity(proc.pid), 10, "the process to show in /proc")
    return ident


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    folder = tmp_path / "home" / "jobs" / "5"
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN, str(folder)], start_new_session=True)
    try:
        yield proc, folder
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def first_release_database(home: Path, live: procs.Identity, gone: procs.Identity) -> Path:
    path = home / "ddpq.db"
    command.upgrade(alembic_config(path), "0001")
    sql = FIXTURE.read_text()
    for name, value in {
        "@JOBS@": str(home / "jobs"),
        "@LIVE_PID@": str(live.pid),
        "@LIVE_TICKS@": str(live.start_ticks),
        "@GONE_PID@": str(gone.pid),
        "@GONE_TICKS@": str(gone.start_ticks),
    }.items():
        sql = sql.replace(name, value)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executescript(sql)
    return path


def ended_shim() -> procs.Identity:
    """The identity of a process that has ended: a shim that died with the old daemon."""
    proc = subprocess.Popen(["sleep", "600"])
    ident = identity_of(proc)
    proc.kill()
    proc.wait()
    assert not procs.is_alive(ident)
    return ident


def test_a_first_release_database_is_migrated_on_start_and_shows_the_same_jobs(
    make_daemon: Callable[..., Daemon],
    tmp_path: Path,
    stand_in: tuple[subprocess.Popen[bytes], Path],
) -> None:
    shim, live_folder = stand_in
    home = tmp_path / "home"
    live = identity_of(shim)
    path = first_release_database(home, live, ended_shim())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0001",)

    d = make_daemon("--fake-gpus", "2", "--grace", "1s", home=home)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        assert "shim_pid" not in columns and "relaunches" in columns
        handle = conn.execute(
            "SELECT executor, handle FROM attempts WHERE job_id = 5 AND number = 1"
        ).fetchone()
    assert handle == ("local", f"{live.pid}:{live.start_ticks}")

    with d.client() as c:
        jobs = {j.id: j for j in c.list_all()}
        assert {i: j.name for i, j in jobs.items()} == {
            1: "train",
            2: "flaky",
            3: "sweep-a",
            4: "big",
            5: "live",
            6: "gone",
            7: "after-gone",
            8: "waiting",
            9: "on-hold",
        }
        assert [(jobs[i].state, jobs[i].exit_code) for i in (1, 2, 3, 4)] == [
            ("succeeded", 0),
            ("failed", 1),
            ("cancelled", None),
            ("timed_out", None),
        ]
        assert jobs[4].reason.startswith("time limit reached")
        assert jobs[1].progress == {"epoch": 5, "epochs": 5, "test_acc": 0.91}
        assert [a.number for a in c.show(2).attempts] == [1, 2]
        assert c.show(1).job_dir == str(home / "jobs" / "1")

        # The shim that died meanwhile: lost, not stuck running; its dependant cancelled;
        # the queued job gets the GPU it held.
        gone = wait_state(c, 6, "failed")
        assert gone.reason.startswith("lost"), gone.reason
        assert wait_state(c, 7, "cancelled").reason
        assert wait_done(c, 8).state == "succeeded"
        assert c.show(9).state == "held"

        # The shim that still runs was re-adopted, and its end is recorded when it comes.
        assert c.show(5).state == "running"
        assert "job 5: re-adopted" in (home / "daemon.log").read_text()
        (live_folder / "go").touch()
        assert shim.wait(30) == 0
        done = wait_done(c, 5)
        assert (done.state, done.exit_code) == ("succeeded", 0)
        assert done.attempts[-1].handle == f"{live.pid}:{live.start_ticks}"

    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPQ_")}
    users = subprocess.run(
        [sys.executable, "-m", "ddpq", "admin", "user", "list", "--home", str(home)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.splitlines()
    assert users == ["alice\tuser\t-", "bob\tadmin\trobert"]
