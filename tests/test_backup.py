"""`ddpq admin backup PATH`: a consistent copy of the database while a daemon runs jobs and
takes submissions, and the restore that docs/admin.md describes (a fresh state folder, the
copy as its ddpq.db, a daemon started there shows the same jobs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from ddpq.schemas import JobSubmit
from tests.cli_inprocess import run_in_process
from tests.helpers import TERMINAL, Daemon, wait_for

MAX_SUBMISSIONS = 400


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    """``ddpq admin ARGS`` without the ``DDPQ_*`` variables, in this process
    (tests/cli_inprocess.py): the commands work on the state folder, with no daemon."""
    cleared: dict[str, str | None] = {k: None for k in os.environ if k.startswith("DDPQ_")}
    return run_in_process("admin", *args, env=cleared)


def refused(r: subprocess.CompletedProcess[str], says: str) -> None:
    assert r.returncode == 2, r
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr, r.stderr


def jobs_in(db: Path) -> dict[int, tuple[str, str, str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT id, name, state, reason FROM jobs")
        return {job_id: (name, state, reason) for job_id, name, state, reason in rows}


def check_consistent(copy: Path) -> None:
    """One moment's database: sound, and every job in the state its last event says."""
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert not Path(f"{copy}-wal").exists() and not Path(f"{copy}-journal").exists()
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        torn = conn.execute(
            "SELECT j.id, j.state, e.to_state FROM jobs j JOIN job_events e ON e.id = "
            "(SELECT max(id) FROM job_events WHERE job_id = j.id) WHERE e.to_state != j.state"
        ).fetchall()
        assert torn == []
        leased = conn.execute(
            "SELECT count(*) FROM leases l JOIN jobs j ON j.id = l.job_id "
            "WHERE l.released_at IS NULL AND j.state NOT IN ('starting', 'running')"
        ).fetchone()
        assert leased == (0,)


def test_backup_refuses_a_path_that_exists_or_a_missing_folder(tmp_path: Path) -> None:
    home = ["--home", str(tmp_path / "home")]
    refused(admin("backup", str(tmp_path / "copy.db"), *home), "no database at")
    assert admin("user", "list", *home).returncode == 0  # makes the database
    taken = tmp_path / "taken.db"
    taken.write_text("mine")
    refused(admin("backup", str(taken), *home), "exists already")
    assert taken.read_text() == "mine"
    (tmp_path / "dangling.db").symlink_to(tmp_path / "nowhere")
    refused(admin("backup", str(tmp_path / "dangling.db"), *home), "exists already")
    assert not (tmp_path / "nowhere").exists()
    refused(admin("backup", str(tmp_path / "no" / "such" / "copy.db"), *home), "not a folder")


def test_backup_under_load_and_restore_into_a_fresh_folder(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = make_daemon("--fake-gpus", "4", "--grace", "1s")
    stop = threading.Event()
    submitted: list[int] = []

    def load() -> None:
        with d.client() as c:
            while not stop.is_set() and len(submitted) < MAX_SUBMISSIONS:
                n = len(submitted)
                job = c.submit(JobSubmit(command=["sleep", "0.05"], gpus=n % 3, name=f"l{n}"))
                submitted.append(job.id)
                if n % 7 == 3:
                    c.cancel(job.id)

    def more_than(n: int) -> Callable[[], bool]:
        return lambda: len(submitted) > n

    thread = threading.Thread(target=load)
    thread.start()
    copies = []
    try:
        for i in range(3):
            wait_for(more_than(20 * (i + 1)), 60, "submissions to go on")
            copy = tmp_path / f"backup-{i}.db"
            made = admin("backup", str(copy), "--home", str(d.home))
            assert made.returncode == 0, made.stderr
            assert str(copy) in made.stdout
            copies.append(copy)
    finally:
        stop.set()
        thread.join(60)
    for copy in copies:
        check_consistent(copy)
    backed_up = jobs_in(copies[-1])
    assert len(backed_up) > 60
    assert set(jobs_in(copies[0])) < set(backed_up)  # later copies hold later jobs
    states = {state for _, state, _ in backed_up.values()}
    assert {"succeeded", "cancelled"} <= states and states - TERMINAL, states  # mid-flight

    # The original goes away once its jobs are done (as after a disk failure: nothing of
    # it is left running), and the copy is restored into a fresh folder, as docs/admin.md
    # says: the copy as ddpq.db, 0600.
    with d.client() as c:
        wait_for(lambda: all(j.state in TERMINAL for j in c.list_all()), 120, "the load to end")
    d.stop()
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(copies[-1], restored / "ddpq.db")
    os.chmod(restored / "ddpq.db", 0o600)
    r = make_daemon("--fake-gpus", "4", "--grace", "1s", home=restored)
    with r.client() as c:
        shown = {j.id: j for j in c.list_all()}
        assert set(shown) == set(backed_up)
        for job_id, (name, state, reason) in backed_up.items():
            assert shown[job_id].name == name
            if state in TERMINAL:
                assert (shown[job_id].state, shown[job_id].reason) == (state, reason)
        # What was queued or running at the copy's moment moves on to an end: no job stuck.
        wait_for(lambda: all(j.state in TERMINAL for j in c.list_all()), 120, "restored jobs")
        new = c.submit(JobSubmit(command=["true"]))
        assert new.id > max(backed_up)
