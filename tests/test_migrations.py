"""Schema migrations, each tested both ways on a database that holds rows."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory

from ddpq.core.states import ATTEMPT_ONLY, JobState
from ddpq.store import notifications as notification_store
from ddpq.store.db import Database, alembic_config, migrate
from ddpq.store.jobs import get_job, spec_of

JOB_COLUMNS = (
    "name, owner, command, cwd, env, launcher, gpus, priority, max_retries, attempt, "
    "port_retries, user_hold, state, reason, submitted_at"
)


def _insert_job(conn: sqlite3.Connection, state: str) -> int:
    cur = conn.execute(
        f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES "
        "('j', 'alice', '[\"true\"]', '/', '{}', 'plain', 1, 0, 0, 1, 0, 0, ?, 'r', 1.0)",
        (state,),
    )
    job_id = cur.lastrowid
    assert job_id is not None
    conn.execute(
        "INSERT INTO job_events (job_id, at, from_state, to_state, reason) "
        "VALUES (?, 1.0, NULL, ?, 'submitted')",
        (job_id, state),
    )
    conn.execute(
        "INSERT INTO attempts (job_id, number, gpus, port, started_at, state, reason) "
        "VALUES (?, 1, '[0]', NULL, 1.0, ?, '')",
        (job_id, state),
    )
    return job_id


def _at(path: Path, revision: str) -> None:
    """Upgrade ``path`` to ``revision``; a file not there yet becomes a copy of one upgraded
    from nothing to ``revision`` (``_fresh``)."""
    if path.exists():
        command.upgrade(alembic_config(path), revision)
    else:
        shutil.copyfile(_fresh(revision), path)


# Files upgraded from nothing to a revision, by revision: made once per process (_fresh).
_FRESH: dict[str, Path] = {}


def _fresh(revision: str) -> Path:
    """A file upgraded from nothing to ``revision``, made by upgrading a copy of the nearest
    one made before below it (the same migrations, run in the same order): the process walks
    up the chain once, not once per test (a walk costs ~0.5 s of CPU). The walk from nothing
    to the head is each test process's own (``tests.template_db``)."""
    if revision in _FRESH:
        return _FRESH[revision]
    path = Path(tempfile.mkdtemp(prefix=f"ddpq-migrations-{revision}-")) / "ddpq.db"
    scripts = ScriptDirectory.from_config(alembic_config(path))
    below = scripts.get_revision(revision).down_revision
    while isinstance(below, str) and below not in _FRESH:  # a merge (a tuple) ends the search
        below = scripts.get_revision(below).down_revision
    if isinstance(below, str):
        shutil.copyfile(_FRESH[below], path)
    command.upgrade(alembic_config(path), revision)
    _FRESH[revision] = path
    return path


@pytest.fixture(scope="session", autouse=True)
def _remove_fresh() -> Iterator[None]:
    """At the session's end (not the module's: under xdist a worker runs this module's tests
    between others')."""
    yield
    for path in _FRESH.values():
        shutil.rmtree(path.parent, ignore_errors=True)
    _FRESH.clear()


def test_typed_states_upgrade_keeps_rows_and_refuses_unknown_words(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0001")
    with sqlite3.connect(path) as conn:
        # The states as 0002 knew them (0006 added "preempted", which only attempts take).
        known = [state for state in JobState if state not in ATTEMPT_ONLY]
        ids = {state: _insert_job(conn, state.value) for state in known}
    migrate(path)  # to head
    db = Database(path)
    with db.read() as s:
        for state, job_id in ids.items():
            job = get_job(s, job_id)
            assert job.state is state  # read back as the enum, not a bare string
    db.dispose()
    with sqlite3.connect(path) as conn:
        for table, column in (
            ("jobs", "state"),
            ("job_events", "to_state"),
            ("job_events", "from_state"),
            ("attempts", "state"),
        ):
            with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
                conn.execute(f"UPDATE {table} SET {column} = 'runing'")


def test_typed_states_downgrade_gives_plain_text_back(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    migrate(path)
    with sqlite3.connect(path) as conn:
        job_id = _insert_job(conn, "running")
    command.downgrade(alembic_config(path), "0001")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone() == (
            "running",
        )
        conn.execute("UPDATE jobs SET state = 'anything'")  # no constraint any more
        conn.execute("UPDATE jobs SET state = 'succeeded'")
    migrate(path)  # and up again: the rows come back typed
    db = Database(path)
    with db.read() as s:
        assert get_job(s, job_id).state is JobState.SUCCEEDED
    db.dispose()


def test_attempt_handles_carry_a_running_jobs_shim_across_the_upgrade(tmp_path: Path) -> None:
    """A job running under the previous release keeps its shim: its pid and start time
    move from the job row to its attempt's handle, and back on a downgrade."""
    path = tmp_path / "ddpq.db"
    _at(path, "0002")
    with sqlite3.connect(path) as conn:
        running = _insert_job(conn, "running")
        ended = _insert_job(conn, "succeeded")
        conn.execute(
            "UPDATE jobs SET shim_pid = 4321, shim_start_ticks = 98765 WHERE id = ?", (running,)
        )
    migrate(path)
    with sqlite3.connect(path) as conn:
        rows = dict(conn.execute("SELECT job_id, executor || ' ' || handle FROM attempts"))
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    assert rows == {running: "local 4321:98765", ended: None}
    assert "shim_pid" not in columns
    command.downgrade(alembic_config(path), "0002")
    with sqlite3.connect(path) as conn:
        shims = dict(conn.execute("SELECT id, shim_pid || ':' || shim_start_ticks FROM jobs"))
    assert shims == {running: "4321:98765", ended: None}


def test_relaunches_start_at_zero_for_existing_jobs_and_go_away_on_downgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0003")
    with sqlite3.connect(path) as conn:
        job_id = _insert_job(conn, "queued")
    _at(path, "0004")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT relaunches FROM jobs WHERE id = ?", (job_id,)).fetchone() == (
            0,
        )
    command.downgrade(alembic_config(path), "0003")
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        assert "relaunches" not in columns
        assert conn.execute("SELECT state FROM jobs").fetchone() == ("queued",)


def test_notifications_upgrade_and_downgrade_keep_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0004")
    with sqlite3.connect(path) as conn:
        job_id = _insert_job(conn, "succeeded")
    _at(path, "0005n")
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT notify_url, notify_done_at FROM jobs WHERE id = ?", (job_id,))
        assert row.fetchone() == (None, None)
        conn.execute(
            "INSERT INTO notifications (job_id, attempt, at, status, error) "
            "VALUES (?, 1, 2.0, 200, '')",
            (job_id,),
        )
    command.downgrade(alembic_config(path), "0004")
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "notifications" not in tables
        assert conn.execute("SELECT state FROM jobs").fetchone() == ("succeeded",)


def _table_sql(conn: sqlite3.Connection, table: str) -> str:
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    return str(row[0]) if row else ""


def test_sweeps_upgrade_keeps_jobs_and_downgrade_turns_members_into_plain_jobs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0004")
    with sqlite3.connect(path) as conn:
        plain = _insert_job(conn, "succeeded")
    _at(path, "0005s")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        # The copy of the jobs table still takes the later revisions' state and columns.
        assert "'preempted'" in _table_sql(conn, "jobs")
        assert conn.execute("SELECT preemptible, notify_url FROM jobs").fetchall() == [(0, None)]
        assert conn.execute("SELECT sweep_id, sweep_index, sweep_params FROM jobs").fetchall() == [
            (None, None, None)
        ]
        conn.execute(
            "INSERT INTO sweeps (name, owner, submitted_at, template, params, array, size, "
            "max_running) VALUES ('s', 'alice', 1.0, '{}', '{}', '0-1%1', 2, 1)"
        )
        members = [_insert_job(conn, "queued") for _ in range(2)]
        for index, job_id in enumerate(members):
            conn.execute(
                "UPDATE jobs SET sweep_id = 1, sweep_index = ?, sweep_params = '{}' WHERE id = ?",
                (index, job_id),
            )
        waiter = _insert_job(conn, "held")
        conn.execute("INSERT INTO sweep_dependencies (job_id, sweep_id) VALUES (?, 1)", (waiter,))
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute("UPDATE jobs SET sweep_id = 99 WHERE id = ?", (plain,))
        # The copy of the jobs table that the foreign key needed kept its CHECK.
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
            conn.execute("UPDATE jobs SET state = 'runing'")
    with sqlite3.connect(path) as conn:  # not the ORM: its model is of the newest revision
        indexes = [
            conn.execute("SELECT sweep_index FROM jobs WHERE id = ?", (i,)).fetchone()[0]
            for i in members
        ]
    assert indexes == [0, 1]
    command.downgrade(alembic_config(path), "0004")
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        states = dict(conn.execute("SELECT id, state FROM jobs"))
        assert "CHECK" in _table_sql(conn, "jobs")
    assert not {"sweep_id", "sweep_index", "sweep_params"} & columns
    assert not {"sweeps", "sweep_dependencies"} & tables
    assert states == {
        plain: "succeeded",
        members[0]: "queued",
        members[1]: "queued",
        waiter: "held",
    }
    migrate(path)  # and up again
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM sweeps").fetchone() == (0,)


def test_tokens_upgrade_keeps_jobs_and_downgrade_drops_tokens_and_run_as(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0009c")
    with sqlite3.connect(path) as conn:
        queued = _insert_job(conn, "queued")
    _at(path, "head")  # through 0017t (tokens, run_as): the head's model reads the row below
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, state, run_as FROM jobs").fetchall() == [
            (queued, "queued", None)
        ]
        conn.execute("UPDATE jobs SET run_as = 'alice' WHERE id = ?", (queued,))
        row = "INSERT INTO tokens (owner, owner_uid, token_hash, note, created_at, expires_at) "
        conn.execute(row + "VALUES ('alice', 1001, 'h1', NULL, 1.0, 2.0)")
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute(row + "VALUES ('bob', 1002, 'h1', NULL, 1.0, 2.0)")
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            conn.execute(row + "VALUES ('bob', 1002, 'h2', NULL, 1.0, NULL)")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
            conn.execute("UPDATE jobs SET state = 'runing'")
    migrate(path)  # later revisions add job columns the head's model reads
    db = Database(path)  # the head's model reads the row
    with db.read() as s:
        assert get_job(s, queued).run_as == "alice"
    db.dispose()
    command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert conn.execute("SELECT id, state FROM jobs").fetchall() == [(queued, "queued")]
        assert "CHECK" in _table_sql(conn, "jobs")
    assert "run_as" not in columns and "tokens" not in tables
    assert "nodes" in columns  # the revision below is left as it was
    migrate(path)  # and up again
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM tokens").fetchone() == (0,)


def test_cluster_columns_upgrade_as_one_node_jobs_and_downgrade_keeps_the_jobs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0005s")
    with sqlite3.connect(path) as conn:
        job_id = _insert_job(conn, "running")
    _at(path, "0009c")
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT nodes, gpus_per_node, partition, slurm_options FROM jobs WHERE id = ?",
            (job_id,),
        ).fetchone()
        assert row == (1, None, None, None)
        conn.execute("UPDATE jobs SET nodes = 2, gpus_per_node = 4, partition = 'gpu'")
        assert "CHECK" in _table_sql(conn, "jobs")
    command.downgrade(alembic_config(path), "0005s")
    with sqlite3.connect(path) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
        assert not {"nodes", "gpus_per_node", "partition", "slurm_options"} & columns
        assert conn.execute("SELECT state FROM jobs").fetchall() == [("running",)]


def test_outside_use_upgrade_and_downgrade_keep_the_jobs(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0009c")
    with sqlite3.connect(path) as conn:
        job_id = _insert_job(conn, "succeeded")
    _at(path, "0012u")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO outside_use (uid, account, gpu, started_at, ended_at) "
            "VALUES (1000, 'alice', 0, 1.0, 6.0), (NULL, NULL, 1, 2.0, 3.0)"
        )
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            conn.execute("INSERT INTO outside_use (uid, gpu, started_at) VALUES (1, 0, 1.0)")
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(outside_use)")}
    assert {"ix_outside_use_gpu_uid_ended", "ix_outside_use_ended_at"} <= indexes
    command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert conn.execute("SELECT id, state FROM jobs").fetchall() == [(job_id, "succeeded")]
    assert "outside_use" not in tables
    migrate(path)  # and up again, empty
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM outside_use").fetchone() == (0,)


def test_sessions_upgrade_keeps_jobs_as_batch_jobs_and_downgrade_keeps_sessions_as_jobs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0009c")
    with sqlite3.connect(path) as conn:
        batch = _insert_job(conn, "running")
    _at(path, "0016i")
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT interactive, idle_s, idle_since, idle_warned_at FROM jobs WHERE id = ?",
            (batch,),
        ).fetchone()
        assert row == (0, None, None, None)
        session = _insert_job(conn, "running")
        conn.execute(
            "UPDATE jobs SET interactive = 1, idle_s = 1800, idle_since = 5.0 WHERE id = ?",
            (session,),
        )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
            conn.execute("UPDATE jobs SET state = 'runing'")
    command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        states = dict(conn.execute("SELECT id, state FROM jobs"))
        assert "CHECK" in _table_sql(conn, "jobs")
    assert not {"interactive", "idle_s", "idle_since", "idle_warned_at"} & columns
    assert states == {batch: "running", session: "running"}
    migrate(path)  # and up again


def _member(conn: sqlite3.Connection, sweep_id: int, index: int, state: str) -> int:
    job_id = _insert_job(conn, state)
    conn.execute(
        "UPDATE jobs SET sweep_id = ?, sweep_index = ?, sweep_params = '{}' WHERE id = ?",
        (sweep_id, index, job_id),
    )
    return job_id


def test_sweep_notify_upgrade_hands_a_sweeps_owed_url_over_and_downgrade_gives_it_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    url, told = "http://hooks.lab/a", "http://hooks.lab/told"
    _at(path, "0009c")
    with sqlite3.connect(path) as conn:
        for name in ("under-way", "told", "quiet"):
            conn.execute(
                "INSERT INTO sweeps (name, owner, submitted_at, template, params, array, size) "
                "VALUES (?, 'alice', 1.0, '{}', '{}', '0-1', 2)",
                (name,),
            )
        # Before: every member carried its sweep's URL and sent its own message.
        running = _member(conn, 1, 0, "running")
        ended = _member(conn, 1, 1, "succeeded")
        conn.execute("UPDATE jobs SET notify_url = ? WHERE sweep_id = 1", (url,))
        done = [_member(conn, 2, i, "failed") for i in range(2)]
        conn.execute(
            "UPDATE jobs SET notify_url = ?, notify_done_at = 5.0 WHERE sweep_id = 2", (told,)
        )
        conn.execute(
            "INSERT INTO notifications (job_id, attempt, at, status, error) "
            "VALUES (?, 1, 5.0, 200, '')",
            (done[0],),
        )
        quiet = _member(conn, 3, 0, "queued")
        plain = _insert_job(conn, "succeeded")
        conn.execute("UPDATE jobs SET notify_url = ? WHERE id = ?", (url, plain))
    _at(path, "0010n")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        sweeps = conn.execute("SELECT id, notify_url, notify_done_at FROM sweeps ORDER BY id")
        # The sweep under way sends one message at its end; the told one owes nothing.
        assert sweeps.fetchall() == [(1, url, None), (2, None, None), (3, None, None)]
        urls = dict(conn.execute("SELECT id, notify_url FROM jobs"))
        assert (urls[running], urls[ended], urls[quiet], urls[plain]) == (None, None, None, url)
        assert urls[done[0]] == told  # its delivery stays in its history
        conn.execute(
            "INSERT INTO notifications (sweep_id, attempt, at, status, error) "
            "VALUES (1, 1, 6.0, 500, 'HTTP 500')"
        )
        for job_id, sweep_id in ((None, None), (plain, 1)):  # of exactly one
            with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
                conn.execute(
                    "INSERT INTO notifications (job_id, sweep_id, attempt, at, error) "
                    "VALUES (?, ?, 1, 1.0, '')",
                    (job_id, sweep_id),
                )
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute(
                "INSERT INTO notifications (sweep_id, attempt, at, error) VALUES (99, 1, 1.0, '')"
            )
        assert "CHECK" in _table_sql(conn, "jobs")
    migrate(path)  # and the newest schema reads it
    db = Database(path)
    with db.read() as s:
        assert [o.sweep_id for o in notification_store.owed_sweeps(s)] == []  # one runs
        assert [a.error for a in notification_store.sweep_attempts_of(s, [1])[1]] == ["HTTP 500"]
    db.dispose()
    command.downgrade(alembic_config(path), "0009c")
    with sqlite3.connect(path) as conn:
        # Back to a message per member for the sweep still owing one; its own attempts go.
        urls = dict(conn.execute("SELECT id, notify_url FROM jobs"))
        assert (urls[running], urls[ended], urls[quiet], urls[plain]) == (url, url, None, url)
        assert conn.execute("SELECT job_id, status FROM notifications").fetchall() == [
            (done[0], 200)
        ]
        assert {r[1] for r in conn.execute("PRAGMA table_info(sweeps)")} >= {"name", "size"}
        assert not {"notify_url", "notify_done_at"} & {
            r[1] for r in conn.execute("PRAGMA table_info(sweeps)")
        }
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            conn.execute("INSERT INTO notifications (attempt, at, error) VALUES (1, 1.0, '')")
        assert "CHECK" in _table_sql(conn, "jobs")
    migrate(path)  # and up again


def test_gpu_topology_upgrade_keeps_jobs_and_downgrade_drops_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0021j")
    with sqlite3.connect(path) as conn:
        queued = _insert_job(conn, "queued")
    _at(path, "0022t")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, gpu_link, gpu_type FROM jobs").fetchall() == [
            (queued, None, None)
        ]
        conn.execute("UPDATE jobs SET gpu_link = 'NV', gpu_type = 'A100'")
    migrate(path)  # later revisions add job columns the head's model reads
    db = Database(path)
    with db.read() as s:
        spec = get_job(s, queued).spec()
    db.dispose()
    assert (spec.gpu_link, spec.gpu_type) == ("NV", "A100")
    command.downgrade(alembic_config(path), "0021j")
    with sqlite3.connect(path) as conn:
        jobs = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        devices = {row[1] for row in conn.execute("PRAGMA table_info(devices)")}
        assert conn.execute("SELECT id, state FROM jobs").fetchall() == [(queued, "queued")]
        assert "AUTOINCREMENT" in _table_sql(conn, "jobs")  # 0021j's, kept
    assert not {"gpu_link", "gpu_type"} & jobs and "hardware" not in devices


def test_cpu_and_ram_upgrade_keeps_jobs_and_leases_and_downgrade_refuses_live_cores(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0021j")
    with sqlite3.connect(path) as conn:
        job = _insert_job(conn, "running")
        conn.execute(
            "INSERT INTO leases (job_id, kind, resource, acquired_at) VALUES (?, 'gpu', 0, 1.0)",
            (job,),
        )
    _at(path, "0022c")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT cpus, ram_bytes FROM jobs").fetchall() == [(None, None)]
        assert conn.execute("SELECT cores, ram_bytes, peak_ram_bytes FROM attempts").fetchall() == [
            (None, None, None)
        ]
        conn.execute(
            "INSERT INTO leases (job_id, kind, resource, acquired_at) VALUES (?, 'cpu', 0, 2.0)",
            (job,),
        )
        # Core slots are disjoint between live leases, as GPUs are; the triggers are back.
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute(
                "INSERT INTO leases (job_id, kind, resource, acquired_at) "
                "VALUES (?, 'cpu', 0, 3.0)",
                (job,),
            )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(
                "INSERT INTO leases (job_id, kind, resource, acquired_at) "
                "VALUES (?, 'ram', 0, 3.0)",
                (job,),
            )
        with pytest.raises(sqlite3.IntegrityError, match="never changes"):
            conn.execute("UPDATE leases SET resource = 5 WHERE kind = 'gpu'")
    with pytest.raises(RuntimeError, match="CPU core leases are live"):
        command.downgrade(alembic_config(path), "0021j")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE leases SET released_at = 9.0 WHERE kind = 'cpu'")
    command.downgrade(alembic_config(path), "0021j")
    with sqlite3.connect(path) as conn:
        kinds = conn.execute("SELECT kind FROM leases").fetchall()
        assert kinds == [("gpu",)]
        assert "cpus" not in {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
        triggers = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        }
        assert "tr_leases_only_released" in triggers
    migrate(path)  # and up again


def test_plan_window_index_upgrade_and_downgrade(tmp_path: Path) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0023h")
    with sqlite3.connect(path) as conn:
        queued = _insert_job(conn, "queued")
    _at(path, "0023w")
    with sqlite3.connect(path) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT count(*) FROM jobs INDEXED BY "
            "ix_jobs_plan_shape WHERE state = 'queued'"
        ).fetchall()
        assert plan and conn.execute("SELECT id FROM jobs").fetchall() == [(queued,)]
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(jobs)")}
        assert {"ix_jobs_plan_shape", "ix_jobs_unplanned"} <= indexes
    command.downgrade(alembic_config(path), "0023h")
    with sqlite3.connect(path) as conn:
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(jobs)")}
        assert not {"ix_jobs_plan_shape", "ix_jobs_unplanned"} & indexes
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(queued,)]


def test_dependency_kinds_upgrade_keeps_dependencies_as_afterok_and_downgrade_drops_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0023w")
    with sqlite3.connect(path) as conn:
        first = _insert_job(conn, "succeeded")
        held = _insert_job(conn, "held")
        conn.execute("INSERT INTO job_dependencies VALUES (?, ?)", (held, first))
    _at(path, "0023d")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM job_dependencies").fetchall() == [
            (held, first, "afterok")
        ]
        assert conn.execute("SELECT singleton FROM jobs").fetchall() == [(0,), (0,)]
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(jobs)")}
        assert "ix_jobs_owner_name_state" in indexes
    migrate(path)
    db = Database(path)
    with db.read() as s:
        spec = spec_of(s, get_job(s, held))
    db.dispose()
    assert (spec.after, spec.after_any, spec.singleton) == ((first,), (), False)
    command.downgrade(alembic_config(path), "0023w")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM job_dependencies").fetchall() == [(held, first)]
        assert "singleton" not in {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        assert "AUTOINCREMENT" in _table_sql(conn, "jobs")
    migrate(path)  # and up again


@pytest.mark.parametrize("waiting_on", ["afterany", "afternotok", "singleton"])
def test_dependency_kinds_downgrade_refuses_while_a_job_waits_in_a_way_it_would_change(
    tmp_path: Path, waiting_on: str
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0023d")
    with sqlite3.connect(path) as conn:
        first = _insert_job(conn, "failed")
        held = _insert_job(conn, "held")
        if waiting_on == "singleton":
            conn.execute("UPDATE jobs SET singleton = 1 WHERE id = ?", (held,))
        else:
            conn.execute("INSERT INTO job_dependencies VALUES (?, ?, ?)", (held, first, waiting_on))
    with pytest.raises(RuntimeError, match="cannot downgrade: 1 waiting job"):
        command.downgrade(alembic_config(path), "0023w")
    with sqlite3.connect(path) as conn:  # nothing dropped
        assert "singleton" in {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        conn.execute("UPDATE jobs SET state = 'cancelled' WHERE id = ?", (held,))
    command.downgrade(alembic_config(path), "0023w")  # once it waits no more


def test_progress_history_upgrade_keeps_jobs_and_downgrade_drops_its_table_and_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0023d")
    with sqlite3.connect(path) as conn:
        queued = _insert_job(conn, "queued")
    _at(path, "0023p")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, predicted_start FROM jobs").fetchall() == [(queued, None)]
        conn.execute(
            "INSERT INTO progress_samples (job_id, attempt, at, done, total) "
            "VALUES (?, 1, 5.0, 3, 10)",
            (queued,),
        )
        assert "AUTOINCREMENT" in _table_sql(conn, "jobs")  # ids never reused (0021j)
    command.downgrade(alembic_config(path), "0023d")
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "predicted_start" not in columns and "progress_samples" not in tables
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(queued,)]
        assert "AUTOINCREMENT" in _table_sql(conn, "jobs")
    migrate(path)  # and up again


def test_retries_used_start_as_the_attempts_less_the_free_requeues_and_go_on_downgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ddpq.db"
    _at(path, "0024e")
    # (attempt, max_retries, port_retries, relaunches, preemptions, oom_requeues) -> used
    cases = {
        (1, 3, 0, 0, 0, 0): 0,  # its first attempt
        (3, 5, 0, 0, 0, 0): 2,  # two failures retried
        (4, 5, 1, 1, 1, 0): 0,  # a port clash, a lost launch, a preemption: all free
        (5, 2, 0, 0, 0, 1): 2,  # more than it may: as many as it may
    }
    with sqlite3.connect(path) as conn:
        ids = {}
        for counts in cases:
            job_id = _insert_job(conn, "queued")
            conn.execute(
                "UPDATE jobs SET attempt = ?, max_retries = ?, port_retries = ?, relaunches = ?,"
                " preemptions = ?, oom_requeues = ? WHERE id = ?",
                (*counts, job_id),
            )
            ids[counts] = job_id
    _at(path, "0025r")
    with sqlite3.connect(path) as conn:
        for counts, used in cases.items():
            row = conn.execute("SELECT retries_used FROM jobs WHERE id = ?", (ids[counts],))
            assert row.fetchone() == (used,), counts
    command.downgrade(alembic_config(path), "0024e")
    with sqlite3.connect(path) as conn:
        assert "retries_used" not in {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (len(cases),)
